"""``nvidia-persistenced`` on; a oneshot unit sets the power caps at boot, and when they differ."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import systemd

from rigfleet.commands import nvidia as nvidia_commands
from rigfleet.facts import GpuQuery, read_fact, read_paths
from rigfleet.hostdata import HostDataError, check_caps_against_gpus
from rigfleet.resources import project_file
from rigfleet.status.drift import CAP_TOLERANCE_W
from roles.ops import changed, enabled_running, executing, fail, on_change, root_template
from roles.preflight import HostContext

UNIT = "rigfleet-power-caps.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
TEMPLATE = str(project_file(f"files/{UNIT}.j2"))


def caps_mismatch(caps: Sequence[int], gpus: Sequence[Any]) -> list[str]:
    """Cards whose current limit differs from the cap, as ``card N: X W (want Y W)``."""
    limits = {g.index: g.power_limit_w for g in gpus}
    return [f"card {index}: {current} W (want {watts} W)" for index, watts in enumerate(caps)
            if (current := limits.get(index)) is None or abs(current - watts) > CAP_TOLERANCE_W]


@operation()
def apply_power_caps(caps: Sequence[int], gates: Sequence[OperationMeta]):
    """Check ``caps`` against the cards' ranges; apply them when they differ."""
    if (gpu := read_fact(GpuQuery)).loaded:
        try:
            check_caps_against_gpus(host.name, caps, gpu.gpus)
        except HostDataError as e:  # preparing, the preflight has refused the host already
            yield from fail(str(e))
            return
        if not caps_mismatch(caps, gpu.gpus) and not changed(gates):
            host.noop(f"caps {list(caps)} W in place")
            return
    # The caps differ or a gate changed; or the driver comes in this run (verified before this).
    yield f"systemctl restart {UNIT}"
    if not executing():
        return
    after = read_fact(GpuQuery, fresh=True)  # this operation just restarted the unit
    if still := (caps_mismatch(caps, after.gpus) if after.loaded else ["nvidia-smi fails"]):
        yield from fail(f"{host.name}: power caps did not take effect: {'; '.join(still)}")


@deploy("GPU power")
def power(ctx: HostContext) -> None:
    caps = ctx.want.settings.power_caps_w
    read_paths([UNIT_PATH])
    enabled_running(name="nvidia-persistenced enabled and running", service="nvidia-persistenced")
    unit = root_template(name=f"Power caps unit ({', '.join(f'{w} W' for w in caps)})",
                         src=TEMPLATE, dest=UNIT_PATH,
                         caps=[{"command": nvidia_commands.set_power_limit(i, w)}
                               for i, w in enumerate(caps)])
    on_change(name="systemd daemon-reload (power caps unit changed)",
              commands=["systemctl daemon-reload"], gates=[unit], reason="unit unchanged")
    systemd.service(name=f"{UNIT} enabled at boot", service=UNIT, enabled=True)
    apply_power_caps(name="Apply and read back power caps", caps=list(caps), gates=[unit])
