"""The swap plan: what the control side asks a host to run, as one JSON file.

The deploy (``rigfleet.swapplan.build_plan``) writes ``swap/<id>/plan.json``; the host reads
it with ``Plan.load``. It is self-describing, so the host needs no catalog of its own::

    plan = Plan.load(Path("/var/lib/rigfleet/swap/X/plan.json"))
    plan.desired.stack, plan.desired.route_id      # 'tq3-mtp-genesis', 'tq3-mtp-genesis/9f...'
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "rigfleet-swap-plan/1"
# The stack file's drain.timeout_s when it leaves it out (rigfleet.catalog explains the size).
DEFAULT_DRAIN_TIMEOUT_S = 600.0
# A transaction's default time limits (``rigfleet.hostdata`` takes them from here too).
READY_TIMEOUT_S = 1200.0
VRAM_TIMEOUT_S = 120.0
GATE_TIMEOUT_S = 7200.0
RETRY_AFTER_S = 30
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,80}")
_HASH_LINE = re.compile(r"io\.rigfleet\.config-hash['\"]?:\s*['\"]?([0-9a-f]{8,64})")


def change_kind(old: str | None, new: str) -> str:
    """``activate`` (nothing verified here), ``swap`` (another stack) or ``update`` (the same
    stack, new pins or config): a gated change's kind, from the stack names."""
    return "activate" if old is None else "swap" if old != new else "update"


class PlanError(ValueError):
    """A plan (or active record) that cannot be used; the message names the field."""


def compose_hash(text: str) -> str | None:
    """The ``io.rigfleet.config-hash`` label written in a compose file's text."""
    m = _HASH_LINE.search(text)
    return m.group(1) if m else None


@dataclass(frozen=True)
class StackRef:
    """One stack as rendered for this host: enough to start, probe, verify and record it.

    ``record``: the pins the ledger tracks; ``boot_expect``/``boot_failures``: the stack
    file's ``boot`` lines (``stackctl``); ``image_id``: the image the gate verified, filled in
    by the host tool (empty in a plan): every start and rollback runs it, whatever its tag says.
    """

    stack: str
    project: str
    container: str
    port: int
    compose_file: str
    config_hash: str
    image_ref: str
    served_model_name: str
    gpu_memory_utilization: float
    record: dict[str, Any] = field(default_factory=dict)
    boot_expect: tuple[tuple[str, str], ...] = ()
    boot_failures: tuple[tuple[str, str, str, str], ...] = ()
    image_id: str = ""

    @property
    def route_id(self) -> str:
        """What the front's route header says while this stack serves."""
        return f"{self.stack}/{self.config_hash}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str = "stack") -> StackRef:
        if not isinstance(data, dict):
            raise PlanError(f"{where}: expected an object, got {type(data).__name__}")
        try:
            ref = cls(
                stack=str(data["stack"]), project=str(data["project"]),
                container=str(data["container"]), port=int(data["port"]),
                compose_file=str(data["compose_file"]), config_hash=str(data["config_hash"]),
                image_ref=str(data["image_ref"]),
                served_model_name=str(data["served_model_name"]),
                gpu_memory_utilization=float(data["gpu_memory_utilization"]),
                record=dict(data.get("record") or {}),
                boot_expect=tuple((str(p), str(t)) for p, t in data.get("boot_expect") or ()),
                boot_failures=tuple((str(k), str(p), str(t), str(h))
                                    for k, p, t, h in data.get("boot_failures") or ()),
                image_id=str(data.get("image_id") or ""),
            )
        except KeyError as e:
            raise PlanError(f"{where}.{e.args[0]}: missing") from None
        except (TypeError, ValueError) as e:
            raise PlanError(f"{where}: {e}") from None
        if not 0 < ref.gpu_memory_utilization <= 1:
            raise PlanError(f"{where}.gpu_memory_utilization: {ref.gpu_memory_utilization} "
                            "is not in (0, 1]")
        return ref


@dataclass(frozen=True)
class Plan:
    """One transaction's input. ``id`` is the deploy id (the transient unit's suffix, the
    swap directory's name); ``projects``: every stack's (project, compose file), all torn
    down before a start; ``retry_after_s``: until this host has measured its window."""

    id: str
    by: str
    why: str
    host: str
    desired: StackRef
    projects: tuple[tuple[str, str], ...] = ()
    front_port: int = 8000
    gate_profile: str = "full"
    gate_set: tuple[str, ...] = ()
    ready_timeout_s: float = READY_TIMEOUT_S
    vram_timeout_s: float = VRAM_TIMEOUT_S
    gate_timeout_s: float = GATE_TIMEOUT_S
    retry_after_s: int = RETRY_AFTER_S
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    drain_timeouts: dict[str, float] = field(default_factory=dict)

    def drain_timeout_for(self, stack: str | None) -> float:
            return self.drain_timeouts.get(stack or "", self.drain_timeout_s)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "schema": SCHEMA, "projects": [list(p) for p in self.projects],
                "gate_set": list(self.gate_set)}

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: Any) -> Plan:
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise PlanError(f"schema: expected {SCHEMA!r}")
        plan_id = str(data.get("id", ""))
        if not _ID.fullmatch(plan_id):
            raise PlanError(f"id: {plan_id!r} is not a valid id ([A-Za-z0-9._-], max 81)")
        try:
            return cls(
                id=plan_id, by=str(data.get("by") or "unknown"), why=str(data.get("why") or ""),
                host=str(data.get("host") or ""),
                desired=StackRef.from_dict(data.get("desired"), "desired"),
                projects=tuple((str(p), str(f)) for p, f in data.get("projects") or ()),
                front_port=int(data.get("front_port", 8000)),
                gate_profile=str(data.get("gate_profile") or "full"),
                gate_set=tuple(str(s) for s in data.get("gate_set") or ()),
                ready_timeout_s=float(data.get("ready_timeout_s", READY_TIMEOUT_S)),
                vram_timeout_s=float(data.get("vram_timeout_s", VRAM_TIMEOUT_S)),
                gate_timeout_s=float(data.get("gate_timeout_s", GATE_TIMEOUT_S)),
                retry_after_s=int(data.get("retry_after_s", RETRY_AFTER_S)),
                drain_timeout_s=float(data.get("drain_timeout_s", DEFAULT_DRAIN_TIMEOUT_S)),
                drain_timeouts={str(k): float(v) for k, v in
                                dict(data.get("drain_timeouts") or {}).items()},
            )
        except PlanError:
            raise
        except (TypeError, ValueError) as e:
            raise PlanError(f"plan: {e}") from None

    @classmethod
    def load(cls, path: Path) -> Plan:
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except OSError as e:
            raise PlanError(f"{path}: cannot be read ({e.strerror})") from None
        except json.JSONDecodeError as e:
            raise PlanError(f"{path}: not JSON ({e})") from None


@dataclass(frozen=True)
class Active:
    """``active.json``: the stack last verified (``ref.compose_file``: its snapshot)."""

    ref: StackRef
    since: str = ""
    deploy_id: str = ""
    by: str = ""
    gate: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "rigfleet-active/1", "ref": self.ref.to_dict(), "since": self.since,
                "deploy_id": self.deploy_id, "by": self.by, "gate": self.gate}

    @classmethod
    def from_dict(cls, data: Any) -> Active:
        if not isinstance(data, dict):
            raise PlanError("active.json: expected an object")
        return cls(ref=StackRef.from_dict(data.get("ref"), "active.ref"),
                   since=str(data.get("since") or ""), deploy_id=str(data.get("deploy_id") or ""),
                   by=str(data.get("by") or ""), gate=dict(data.get("gate") or {}))
