"""``rigfleet bench``: the control side of ``rigfleet.hostside.bench``, the host gate's own."""
