"""The verify-stress gate: decides whether a freshly swapped serving stack may be promoted.

Run against an OpenAI-compatible (vLLM) server::

    python3 -m rigfleet.hostside.verify --url http://127.0.0.1:8001 \
        --api-key-file /etc/rigfleet/secrets/api-key --profile full --report-dir /var/lib/x

The exit status is the number of failed checks (0 = promote; capped at 100); 101 means the
gate itself was misused (bad arguments). Modules:

- ``profiles``  every threshold, size, timeout and count (FULL for real rigs, FAST for tests)
- ``client``    a small OpenAI-compatible HTTP client (urllib, SSE streaming)
- ``metrics``   Prometheus text parsing (spec-decode counters)
- ``health``    output-health detectors run on every reply
- ``prompts``   prompt material (filler, news, tool schemas) and sizing to server tokens
- ``checks``    preflight, the seven checks of the "7/7", soak, spec_decode
- ``throughput`` decode tok/s against the host's baseline, CV, MTP acceptance per position
- ``counting``  request bodies and prompt-token counting (shared with the bench)
- ``report``    JSON (``rigfleet-verify/1``) and Markdown reports, the exit status
- ``runner``    orders the checks, shows progress, writes reports (``__main__`` is the CLI)

Stdlib only (it runs on the hosts); nothing here knows anything about the testbed's simulator.
"""

from __future__ import annotations
