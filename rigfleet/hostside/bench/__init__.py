"""The bench (stdlib only; docs/bench.md): decode speed in the reference figures' shapes,
measured and judged on the control side (``rigfleet bench``), on a host (``rigfleet-host.pyz
bench``) and in the gate (its ``throughput`` check); plots, fleet view: ``rigfleet.bench``."""
