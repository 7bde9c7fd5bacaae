"""``rigfleet doctor``: why a host decodes slower than its baseline or than the fleet.

- ``evidence``  the probe's ``doctor`` section (the cards idle and under a short load, the
                engine's log facts, args, mounts) as typed data
- ``rules``     the known causes, each with its evidence, an impact estimate and what to
                change, ranked (pure: evidence in, causes out)
- ``cli``       the command: probe the hosts (concurrently), decide who is slow (against its
                own baseline and the fleet's median for the same stack and pins), print

Evidence is gathered on the host by ``rigfleet.hostside.bench.evidence`` (stdlib), decided
here.
"""
