"""``python -m rigfleet.status``: ``rigfleet status`` without the console script."""

import sys

from rigfleet.cli import main

raise SystemExit(main(["status", *sys.argv[1:]]))
