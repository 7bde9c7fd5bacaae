"""``python3 -m sndr.apply``: the canonical apply entry point."""

import sys

from sndr.apply import main

if __name__ == "__main__":
    sys.exit(main())
