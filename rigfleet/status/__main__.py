"""``python -m rigfleet.status``: ``rigfleet status`` without the console script."""

from rigfleet.status.cli import main

raise SystemExit(main())
