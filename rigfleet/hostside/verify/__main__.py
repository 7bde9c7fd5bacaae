"""``python3 -m rigfleet.hostside.verify``: the verify-stress gate's command line (see runner)."""

import sys

from .runner import main

if __name__ == "__main__":
    sys.exit(main())
