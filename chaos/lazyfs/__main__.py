"""``python -m chaos.lazyfs --backing DIR --mountpoint DIR --control-fd FD``: the FUSE process."""

import sys

from chaos.lazyfs._server import main

sys.exit(main())
