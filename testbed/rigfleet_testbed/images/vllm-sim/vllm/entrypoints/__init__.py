"""Entry points of the simulator (only the CLI is provided)."""
