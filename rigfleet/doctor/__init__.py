"""``rigfleet doctor``: why a host decodes slower than its baseline or than the fleet.

``evidence`` types the probe's ``doctor`` section (gathered on the host by
``rigfleet.hostside.bench.evidence``), ``rules`` ranks the known causes (pure), ``cli`` probes
the hosts and decides who is slow.
"""
