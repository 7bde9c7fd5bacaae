"""Control-side decisions about a host's serving stack: what to record, what to run.

Pure functions over data (the host's probe, the validated context), shared by the roles:

- ``tracked_record``: the pins the ledger tracks for one stack (``state.json``'s keys);
- ``stack_ref``: a stack as rendered for one host (``rigfleet.hostside.plan.StackRef``);
- ``build_plan``: the swap plan the host-side transaction runs;
- ``decide``: from the host's probe and the desired stack, what the deploy must do:
  ``none`` (converged), ``adopt`` (it serves but was never recorded), ``ensure`` (the
  recorded stack is not up or not routed), ``activate`` / ``swap`` / ``update`` (a gated
  transaction).

Example::

    decision = decide(probe, stack_ref(ctx, ctx.stack))
    decision.kind, decision.reason      # ('swap', 'int8/0a1b... -> tq3-mtp-genesis/9f8e...')
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from rigfleet.catalog import StackSpec
from rigfleet.compose import CONFIG_HASH_LABEL, SERVICE, compose_document, compose_path
from rigfleet.hostdata import HostSettings
from rigfleet.hostside.plan import Plan, StackRef
from rigfleet.pins import Pins

# One id per control-side run: the swap unit, its directory and the ledger lines carry it.
DEPLOY_ID = f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"

KINDS = ("none", "adopt", "ensure", "activate", "swap", "update")


class Context(Protocol):
    """What ``roles.preflight.HostContext`` provides (kept structural: no role import)."""

    name: str
    settings: HostSettings
    pins: Pins
    specs: dict[str, StackSpec]
    by: str


def tracked_record(ctx: Context, stack: str) -> dict[str, Any]:
    """The facts the ledger tracks for ``stack``; a difference in any is a ledger entry."""
    pinned = ctx.pins.stacks[stack]
    return {
        "stack": stack,
        "image": pinned.image,
        "digest": pinned.digest,
        "vllm_version": pinned.vllm_version,
        "genesis_commit": pinned.genesis.commit if pinned.genesis is not None else None,
        "model_repo": ctx.pins.model.repo,
        "model_revision": ctx.pins.model.revision,
        "driver_branch": ctx.pins.driver_branch,
        "toolkit_version": ctx.pins.toolkit_version,
        "pins_serial": ctx.pins.serial,
    }


def stack_ref(ctx: Context, stack: str) -> StackRef:
    """``stack`` as this host renders it (compose file, config hash, pins)."""
    spec = ctx.specs[stack]
    doc = compose_document(spec, ctx.pins, ctx.settings)
    return StackRef(
        stack=stack,
        project=spec.compose_project,
        container=spec.container_name,
        port=spec.port,
        compose_file=compose_path(stack),
        config_hash=str(doc["services"][SERVICE]["labels"][CONFIG_HASH_LABEL]),
        image_ref=ctx.pins.stacks[stack].image_ref,
        served_model_name=spec.served_model_name,
        gpu_memory_utilization=spec.gpu_memory_utilization,
        record=tracked_record(ctx, stack),
    )


@dataclass(frozen=True)
class SwapSettings:
    """The gate and the time limits of one host's transactions (host data, validated)."""

    gate_profile: str = "full"
    gate_set: tuple[str, ...] = ()
    ready_timeout_s: float = 1200.0
    vram_timeout_s: float = 120.0
    gate_timeout_s: float = 7200.0
    retry_after_s: int = 30

    @property
    def follow_timeout_s(self) -> float:
        """How long the deploy follows a transaction before giving up (it keeps running)."""
        return 2 * (self.ready_timeout_s + self.vram_timeout_s) + self.gate_timeout_s + 600


def build_plan(ctx: Context, swap: SwapSettings, why: str, deploy_id: str = DEPLOY_ID) -> Plan:
    """The plan for a transaction to ``ctx.settings.stack``."""
    desired = stack_ref(ctx, ctx.settings.stack)
    return Plan(
        id=deploy_id,
        by=ctx.by,
        why=why,
        host=ctx.name,
        desired=desired,
        projects=tuple((s.compose_project, compose_path(n)) for n, s in sorted(ctx.specs.items())),
        front_port=ctx.settings.front_port,
        gate_profile=swap.gate_profile,
        gate_set=swap.gate_set,
        ready_timeout_s=swap.ready_timeout_s,
        vram_timeout_s=swap.vram_timeout_s,
        gate_timeout_s=swap.gate_timeout_s,
        retry_after_s=swap.retry_after_s,
    )


@dataclass(frozen=True)
class Decision:
    kind: str  # one of KINDS
    reason: str
    change: str = ""  # "int8/<hash> -> tq3-mtp-genesis/<hash>" (for the lock's "why")

    @property
    def transaction(self) -> bool:
        """A gated transaction (stop, start, gate, promote or roll back)."""
        return self.kind in ("activate", "swap", "update")


def decide(probe: dict[str, Any], desired: StackRef) -> Decision:
    """What the deploy must do on a host (see the module docstring).

    + probe: ``rigfleet.hostside.probe.probe()`` output (``SwapProbe`` fact)
    + desired: ``stack_ref(ctx, ctx.stack)``
    """
    containers = probe.get("containers") or {}
    c = containers.get(desired.container) or {}
    digest = desired.image_ref.rpartition("@")[2]
    # Running, from the rendered config, and from the pinned image (a compose file edited by
    # hand keeps the labels but not the image).
    up = (c.get("status") == "running" and c.get("hash") == desired.config_hash
          and ("digests" not in c or digest in c["digests"]))
    active = (probe.get("active") or {}).get("ref") or {}
    if active:
        current = f"{active.get('stack')}/{active.get('config_hash')}"
        if active.get("stack") == desired.stack and active.get("config_hash") == \
                desired.config_hash:
            if up and probe.get("route") == desired.route_id:
                return Decision("none", f"{desired.route_id} is active, running and routed")
            if up:
                why = f"the front routes to {probe.get('route')}"
            elif c.get("status") == "running":
                why = (f"{desired.container} runs {c.get('image') or 'something else'} "
                       f"(config {c.get('hash') or 'unlabelled'})")
            else:
                why = f"{desired.container} is {c.get('status') or 'missing'}"
            return Decision("ensure", f"{desired.route_id} is active but {why}: bring it back "
                            "(recreated from its snapshot, no gate)")
        kind = "swap" if active.get("stack") != desired.stack else "update"
        change = f"{current} -> {desired.route_id}"
        return Decision(kind, f"{change} (stop, start, gate, promote or roll back)", change)
    state_stack = (probe.get("state") or {}).get("stack")
    if up and state_stack == desired.stack:
        return Decision("adopt", f"{desired.route_id} serves but no swap recorded it: record "
                        "it as active")
    return Decision("activate", f"nothing verified here -> {desired.route_id} (start, gate, "
                    "promote; on failure the front answers 503)", f"-> {desired.route_id}")


def lock_holder(probe: dict[str, Any]) -> dict[str, Any] | None:
    """The live holder of the host lock, or None (free, or stale: its process is gone)."""
    holder = probe.get("lock")
    return holder if isinstance(holder, dict) and holder.get("alive") else None
