"""``rigfleet doctor``: why a host decodes slower than its baseline or than the fleet."""
