"""The bench: decode speed in the reference figures' shapes, measured and judged (stdlib only).

It runs on the control side (``rigfleet bench --url URL`` / ``--inventory``), on a host
(``rigfleet-host.pyz bench``, e.g. ``--accept-baseline``) and inside the gate (the
``throughput`` check of ``rigfleet.hostside.verify``), always with the same core:

- ``shapes``    what is asked: an ~800-word essay (max_tokens 1000) and a commented quicksort
                (max_tokens 800), temperature 0.6; a salted long prompt for context depths
- ``measure``   ``Bench``: warm-up rounds, streamed runs, decode / wall tok/s, time to first
                token, mean and CV, MTP acceptance from /metrics deltas, concurrency, depths
- ``stats``     mean, coefficient of variation, median
- ``baseline``  the host's baseline (rolling median of its verified history, seeded by the
                stack file's reference x throughput_scale) and the judgement against it
- ``history``   writing ``throughput/history.jsonl`` and ``throughput/last.json``
- ``report``    the JSON (``rigfleet-bench/1``) and Markdown reports
- ``load``      a short load with nvidia-smi samples (the doctor's evidence, via the probe)
- ``cli``       ``rigfleet-host.pyz bench`` (``python3 -m rigfleet.hostside.bench``)

Plotting and the fleet view are control-side (``rigfleet.bench``).
"""

from __future__ import annotations
