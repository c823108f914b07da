"""Coverage-guided fuzz targets (atheris, libFuzzer) for every decoder a remote peer reaches.

One module per target, ``fuzz_<name>.py``, each with ``fuzz_one(data: bytes)``: it feeds the
bytes to the decoder or handler and lets through only the errors that code documents for bad
input (its ``ALLOWED``); anything else is a crash. ``python -m tests.fuzz.fuzz_<name> [libFuzzer
flags] [corpus dirs]`` runs one (see tests/fuzz/runner.py); ``make fuzz`` runs them all, and
tests/fuzz/test_fuzz_short.py runs each for its share of three minutes in the suite.
"""
