"""``rigfleet images status``: per host and pinned image, what is there and which source would
provide it, from the same plan the deploy runs (its state read over SSH)::

    rows = fleet_images(hosts, SshRemote())
    table(rows).print(Console())          # or: json.dumps(as_json(rows))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.text import Text

from rigfleet.desired import load_desired
from rigfleet.fleetview import each_host
from rigfleet.images.checks import SourceChecker
from rigfleet.images.deploy import build_plan, fact_arguments
from rigfleet.images.plan import ImagePlan, StagingPlan
from rigfleet.images.transfer import host_state
from rigfleet.inventory import InventoryHost
from rigfleet.ssh import Remote
from rigfleet.tables import Table


@dataclass(frozen=True)
class HostImages:
    host: str
    plan: StagingPlan | None = None
    error: str | None = None
    problems: tuple[str, ...] = field(default_factory=tuple)


def host_images(host: InventoryHost, remote: Remote, checker: SourceChecker) -> HostImages:
    want = load_desired(host.name, host.data)
    plan = build_plan(want, host_state(remote, host, **fact_arguments(want)), checker)
    return HostImages(host.name, plan, problems=plan.problems)


def fleet_images(hosts: Sequence[InventoryHost], remote: Remote) -> list[HostImages]:
    checker = SourceChecker()
    return each_host(hosts, lambda h: host_images(h, remote, checker),
                     lambda h, why: HostImages(h.name, error=why))


def source_cell(p: ImagePlan) -> str:
    """``[1] archive``: the source a fetch would use."""
    if p.action == "fetch" and p.source is not None:
        return f"[{p.source.index}] {p.source.source.kind}"
    return {"present": "-", "tag": "docker tag", "refused": "none"}.get(p.action, "-")


def table(rows: Sequence[HostImages], title: str = "rigfleet images status") -> Table:
    """One line per host and image (last: the cell a narrow terminal cuts), notes under it."""
    t = Table(title, ["host", "present", "id", "source", "image"])
    for row in rows:
        if row.plan is None:
            t.row(row.host, Text("?", style="red"), "", "", "")
            t.note(row.host, Text(str(row.error), style="red"))
            continue
        for p in row.plan.images:
            present = Text(p.presence.label, style="green" if p.action == "present" else
                           "yellow" if p.action in ("tag", "fetch") else "red")
            local = p.presence.local.id[7:19] if p.presence.local else "-"
            t.row(row.host, present, local, source_cell(p), p.want.image)
            found = (f"; {p.source.label}: {p.source.reason}"
                     if p.action == "fetch" and p.source is not None else "")
            t.note(row.host, f"{p.want.label}{found}")
        for line in row.problems:
            t.note(row.host, Text(line.removeprefix(f"{row.host}: "), style="red"))
        for line in row.plan.notes:
            t.note(row.host, line.removeprefix(f"{row.host}: "))
    return t


def as_json(rows: Sequence[HostImages]) -> dict[str, Any]:
    hosts = []
    for row in rows:
        entry: dict[str, Any] = {"host": row.host, "error": row.error, "images": [],
                                 "problems": list(row.problems)}
        for p in row.plan.images if row.plan else ():
            local = p.presence.local
            entry["images"].append({
                "image": p.want.image, "digest": p.want.digest, "image_id": p.want.image_id,
                "stacks": list(p.want.stacks), "present": p.action == "present",
                "local": None if local is None else {
                    "ref": p.presence.ref, "id": local.id, "repo_digests": list(local.repo_digests),
                    "repo_tags": list(local.repo_tags)},
                "action": p.action,
                "source": p.source.source.label if p.source else None,
                "tried": [{"source": r.label, "ok": r.ok, "reason": r.reason, "bytes": r.size}
                          for r in p.tried],
            })
        hosts.append(entry)
    return {"hosts": hosts, "ok": all(not r.error and not r.problems for r in rows)}


def exit_status(rows: Sequence[HostImages]) -> int:
    """0: every host has (or can get) every pinned image."""
    return 0 if all(not r.error and not r.problems for r in rows) else 1
