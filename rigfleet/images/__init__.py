"""The fleet's pinned images on the hosts: where they come from, how they get there, saved copies.

- ``sources``: host data ``image_sources`` (hub, LAN registry, archives here or on the host)
- ``hoststate``: what a host holds (one read-only script: the deploy's fact, ``images status``)
- ``plan``: the staging plan, a pure decision (sources and host state in, commands out)
- ``checks``: the control-side source checks (registries, archives), in one place
- ``deploy``: the preflight refusal and the plan the ``images`` role runs
- ``archive``: ``docker save`` archives and their sidecars; ``transfer``: export/import over SSH
- ``status``, ``cli``: ``rigfleet images status|export|import``

See docs/images.md.
"""
