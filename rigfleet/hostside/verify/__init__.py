"""The verify-stress gate: decides whether a freshly swapped serving stack may be promoted.
Stdlib only (it runs on the hosts); checks, rules and exit status: docs/bench.md::

    python3 -m rigfleet.hostside.verify --url http://127.0.0.1:8001 \
        --api-key-file /etc/rigfleet/secrets/api-key --profile full --report-dir /var/lib/x
"""
