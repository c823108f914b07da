"""Protocol buffer sources and the modules generated from them by ``make protos``."""
