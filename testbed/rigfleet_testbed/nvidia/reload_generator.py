"""Stand-in for what systemd does to GPU containers at every ``systemctl daemon-reload``.

Installed by the stand-in ``nvidia-container-toolkit`` package as the systemd generator
``/usr/lib/systemd/system-generators/nvidia-sim-scope-devices``: systemd runs generators at boot
and at every daemon-reload (systemd.generator(7)), which is the moment a real systemd re-applies
the ``DeviceAllow=`` of each ``docker-<id>.scope`` and so drops the device rules the runtime hook
added behind its back (NVIDIA/nvidia-container-toolkit#48). Real systemd does that by itself; the
twin's containers really live in cgroupfs cgroups (the testbed machine boots cgroup v1), so this
generator does it for the containers that :mod:`devnodes` recorded as systemd-managed.

It writes nothing into the generator directories (argv[1..3]) and never fails the reload::

    nvidia-sim-scope-devices /run/systemd/generator /run/systemd/generator.early ...
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

if __package__:
    from . import devnodes
    from . import simstate as sim
else:  # inside the zipapp on a simulated host
    import devnodes  # type: ignore[no-redef]
    import simstate as sim  # type: ignore[no-redef]

NAME = "nvidia-sim-scope-devices"


def main(argv: Sequence[str] | None = None) -> int:
    try:
        paths = sim.SimPaths.from_env()
        if paths.grants.is_dir():
            devnodes.reapply_device_policy(
                paths, log=lambda m: print(f"{NAME}: {m}", file=sys.stderr, flush=True))
    except Exception as exc:  # a generator must never break daemon-reload
        print(f"{NAME}: {exc!r}", file=sys.stderr)
    return 0
