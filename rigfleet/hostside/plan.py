"""The swap plan (``swap/<id>/plan.json``): what the deploy (``rigfleet.swapplan.build_plan``)
asks a host to run, self-describing (the host has no catalog)::

    plan = Plan.load(Path("/var/lib/rigfleet/swap/X/plan.json"))
    plan.desired.stack, plan.desired.route_id      # 'tq3-mtp-genesis', 'tq3-mtp-genesis/9f...'
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .records import Coded, decode_strict

SCHEMA = "rigfleet-swap-plan/1"
# The stack file's drain.timeout_s when it leaves it out (rigfleet.catalog explains the size).
DEFAULT_DRAIN_TIMEOUT_S = 600.0
# A transaction's default time limits (``rigfleet.hostdata`` takes them from here too).
READY_TIMEOUT_S = 1200.0
VRAM_TIMEOUT_S = 120.0
GATE_TIMEOUT_S = 7200.0
# The limits on ``docker compose up`` and ``down`` (stackctl.SystemOps; ``Plan.stop_timeout_s``).
COMPOSE_UP_S, COMPOSE_DOWN_S = 600.0, 300.0
RETRY_AFTER_S = 30
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,80}")
_HASH_LINE = re.compile(r"io\.rigfleet\.config-hash['\"]?:\s*['\"]?([0-9a-f]{8,64})")


def change_kind(old: str | None, new: str) -> str:
    """A gated change's kind: ``activate`` (nothing verified here), ``swap`` or ``update``."""
    return "activate" if old is None else "swap" if old != new else "update"


class PlanError(ValueError):
    """A plan (or active record) that cannot be used; the message names the field."""


def compose_hash(text: str) -> str | None:
    """The ``io.rigfleet.config-hash`` label written in a compose file's text."""
    return m.group(1) if (m := _HASH_LINE.search(text)) else None


@dataclass(frozen=True)
class StackRef(Coded):
    """One stack as rendered for this host. ``record``: the pins the ledger tracks;
    ``image_id``: the image the gate verified (empty in a plan, filled in by the host tool):
    every start and rollback runs it, whatever its tag says."""

    stack: str
    project: str
    container: str
    port: int
    compose_file: str
    config_hash: str
    image_ref: str
    served_model_name: str
    gpu_memory_utilization: float = field(metadata={
        "check": lambda v: None if 0 < v <= 1 else f"{v} is not in (0, 1]"})
    record: dict[str, Any] = field(default_factory=dict)
    boot_expect: tuple[tuple[str, str], ...] = ()
    boot_failures: tuple[tuple[str, str, str, str], ...] = ()
    image_id: str = ""

    @property
    def route_id(self) -> str:
        """What the front's route header says while this stack serves."""
        return f"{self.stack}/{self.config_hash}"


@dataclass(frozen=True)
class Plan(Coded):
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
    schema: ClassVar[str] = SCHEMA

    def drain_timeout_for(self, stack: str | None) -> float:
        return self.drain_timeouts.get(stack or "", self.drain_timeout_s)

    @property
    def stop_timeout_s(self) -> float:
        """The transient unit's ``TimeoutStopSec`` (past it systemd SIGKILLs the tool): a stop
        request finishes the docker command it lands in, then goes back (``_rollback``): the
        new stack down, the memory released, the old stack up and ready."""
        return self.vram_timeout_s + self.ready_timeout_s + 2 * (COMPOSE_UP_S + COMPOSE_DOWN_S)

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: Any) -> Plan:
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise PlanError(f"schema: expected {SCHEMA!r}")
        plan_id = str(data.get("id", ""))
        if not _ID.fullmatch(plan_id):
            raise PlanError(f"id: {plan_id!r} is not a valid id ([A-Za-z0-9._-], max 81)")
        return decode_strict(cls, data, "", PlanError)

    @classmethod
    def load(cls, path: Path) -> Plan:
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except OSError as e:
            raise PlanError(f"{path}: cannot be read ({e.strerror})") from None
        except PlanError as e:  # a field missing or of the wrong kind: which file says it
            raise PlanError(f"{path}: {e}") from None
        except UnicodeDecodeError as e:  # garbage: not even text
            raise PlanError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        except ValueError as e:  # not JSON, or a number json will not read (over 4,300 digits)
            raise PlanError(f"{path}: not JSON ({e})") from None


@dataclass(frozen=True)
class Active(Coded):
    """``active.json``: the stack last verified (``ref.compose_file``: its snapshot)."""

    ref: StackRef
    since: str = ""
    deploy_id: str = ""
    by: str = ""
    gate: dict[str, Any] = field(default_factory=dict)
    schema: ClassVar[str] = "rigfleet-active/1"

    def snapshot_gate(self) -> dict[str, Any]:
        """The gate record of a stack brought back from its snapshot without a gate."""
        return {**self.gate, "note": f"verified at promotion {self.since}"}

    @classmethod
    def from_dict(cls, data: Any) -> Active:
        if not isinstance(data, dict):
            raise PlanError("active.json: expected an object")
        return decode_strict(cls, data, "active", PlanError)
