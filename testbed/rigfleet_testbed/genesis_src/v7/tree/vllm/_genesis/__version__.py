"""Genesis release version (the marker file and the boot log report it)."""

VERSION = "v0.0.0"  # genesis-fixture: version
