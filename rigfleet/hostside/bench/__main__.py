"""``python3 -m rigfleet.hostside.bench``: the bench's host-side command line (see cli)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
