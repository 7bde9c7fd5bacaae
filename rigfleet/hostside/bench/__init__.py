"""The bench: decode speed in the reference figures' shapes, measured and judged (stdlib only).

The same core runs on the control side (``rigfleet bench``), on a host (``rigfleet-host.pyz
bench``) and inside the gate (its ``throughput`` check); docs/bench.md. Plotting and the
fleet view are control-side (``rigfleet.bench``).
"""

from __future__ import annotations
