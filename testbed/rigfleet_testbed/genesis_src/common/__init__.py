"""Genesis kernel: text patches and the apply loop (stdlib only)."""
