"""The Genesis release (pyproject.toml carries the same number)."""

__version__ = "0.0.0"  # genesis-fixture: version
