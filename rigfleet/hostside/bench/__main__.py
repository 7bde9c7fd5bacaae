"""``python3 -m rigfleet.hostside.bench``: the bench's host-side command line (see cli)."""

from .cli import main

raise SystemExit(main())
