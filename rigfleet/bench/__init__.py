"""``rigfleet bench``: decode speed per host beside the fleet, the stack's reference and the
host's own history (the control side of ``rigfleet.hostside.bench``).

- ``cli``       the command: ``--url`` (any OpenAI-compatible endpoint), ``--inventory``
                (every host's front), ``--accept-baseline HOST`` (on the host, over SSH)
- ``fleet``     what to bench (URL, key, stack, scale, history) and benching it
- ``progress``  a rich progress bar on stderr
- ``plot``      the PNG (matplotlib, the optional extra ``rigfleet[plot]``)

The measuring, the reports (JSON ``rigfleet-bench/1``, Markdown) and the baseline rules are
the host-side core's, stdlib only, so the gate on a host measures exactly what this measures.
"""
