"""``python3 -m rigfleet.hostside.verify``: the verify-stress gate's command line (see runner)."""

from .runner import main

raise SystemExit(main())
