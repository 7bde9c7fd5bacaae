"""The bench (stdlib only; docs/bench.md): decode speed in the reference figures' shapes, for
``rigfleet bench``, ``rigfleet-host.pyz bench`` and the gate's ``throughput`` check."""
