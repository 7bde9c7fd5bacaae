"""The rollout plan (``Plan``, pure): hosts, canary, batches, the pins pair per stack; build_plan
decides it (docs/bump.md, step 5), the journal keeps it for the deploy while a bump is unfinished::

    plan = build_plan(hosts, reach, pins, {"int8": new_int8}, batch_size=2, max_failures=1)
    plan.batches        # (("host1",), ("host2", "host3"))
    plan.new_for("host2")["int8"]    # the pins host2 runs once promoted
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from rigfleet.batches import in_batches
from rigfleet.pins import Pins, StackPins

CANARY_GROUP = "canary"


class Status(StrEnum):
    """One host's outcome, for every rollout (bump and rollback promote, a roll converges)."""

    PROMOTED = "promoted"
    CONVERGED = "converged"  # a roll's run changed nothing that disturbs serving
    MAINTAINED = "maintained"  # a roll's maintenance window closed: recreated, gate passed
    FAILED = "failed"  # the swap rolled back, or the deploy failed on the host
    LOST = "lost"  # unreachable after its deploy started: state unknown
    SKIPPED = "skipped"  # unreachable before its batch (or at the start)
    NOT_ATTEMPTED = "not attempted"  # the rollout stopped before its batch
    UP_TO_DATE = "up to date"


@dataclass(frozen=True)
class PlanHost:
    name: str
    stack: str  # the stack it serves (host data ``stack``)
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan:
    """What a bump will do; ``batches[0]`` is the canary alone."""

    pins: Pins  # as loaded, before the bump
    new_stacks: dict[str, StackPins]  # the bumped stacks' new pins
    hosts: tuple[PlanHost, ...]  # every inventory host, inventory order
    canary: str | None
    batches: tuple[tuple[str, ...], ...]
    skipped: dict[str, str]  # unreachable at the start: host -> reason
    up_to_date: tuple[str, ...]
    batch_size: int
    max_failures: int
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def empty(self) -> bool:
        return not self.batches

    def host(self, name: str) -> PlanHost:
        return next(h for h in self.hosts if h.name == name)

    def old_for(self, host: str) -> dict[str, StackPins]:
        """The pins ``host`` runs now, every stack."""
        return dict(self.pins.for_host(host).stacks)

    def new_for(self, host: str) -> dict[str, StackPins]:
        """The pins ``host`` runs once promoted: its current ones with the bumped stacks new."""
        return {**self.old_for(host), **self.new_stacks}

    def candidate_pins(self, path: str) -> Pins:
        """The pins file the rollout deploys with (at ``path``): bumped stacks new, moving hosts'
        overrides of them dropped, the serial the saved file gets (the ledgers' ``pins_serial``)."""
        moving = {h for batch in self.batches for h in batch}
        kept = {name: {s: p for s, p in overrides.items()
                       if name not in moving or s not in self.new_stacks}
                for name, overrides in self.pins.hosts.items()}
        return replace(self.pins, path=path, serial=self.pins.serial + 1,
                       stacks={**self.pins.stacks, **self.new_stacks},
                       hosts={name: stacks for name, stacks in kept.items() if stacks})


def exercises(host: PlanHost, old: Mapping[str, StackPins], new: Mapping[str, StackPins]) -> bool:
    """The host serves a stack whose pins change (its swap + gate test the candidate)."""
    return host.stack in new and old.get(host.stack) != new[host.stack]


def build_plan(hosts: Sequence[PlanHost], unreachable: Mapping[str, str | None], pins: Pins,
               new_stacks: Mapping[str, StackPins], batch_size: int = 1, max_failures: int = 1
               ) -> Plan:
    """The plan over ``hosts`` (inventory order); ``unreachable``: host -> why (None: reachable)."""
    new = dict(new_stacks)
    notes: list[str] = []
    up_to_date = [h.name for h in hosts
                  if all(pins.for_host(h.name).stacks.get(s) == p for s, p in new.items())]
    skipped = {h.name: str(unreachable[h.name]) for h in hosts
               if h.name not in up_to_date and unreachable.get(h.name)}
    moving = [h for h in hosts if h.name not in up_to_date and h.name not in skipped]

    canary = _canary(moving, pins, new, notes)
    batches = _batches(canary, moving, batch_size)
    if (problem := serving_cap(hosts, skipped, pins, new, batches)) is not None:
        allowed = next((b for b in range(batch_size - 1, 0, -1)
                        if serving_cap(hosts, skipped, pins, new,
                                       _batches(canary, moving, b)) is None), 1)
        raise ValueError(f"--batch-size {batch_size}: {problem}; at least one host per stack "
                         f"keeps serving while the others swap. Allowed: --batch-size "
                         f"{allowed} or less")
    notes += [f"inventory canary {h.name} is unreachable ({skipped[h.name]})"
              for h in hosts if h.name in skipped and CANARY_GROUP in h.groups]
    return Plan(pins=pins, new_stacks=new, hosts=tuple(hosts),
                canary=canary.name if canary else None, batches=tuple(batches), skipped=skipped,
                up_to_date=tuple(up_to_date), batch_size=batch_size, max_failures=max_failures,
                notes=tuple(notes))


def _batches(canary: PlanHost | None, moving: list[PlanHost], batch_size: int
             ) -> list[tuple[str, ...]]:
    if canary is None:
        return []
    rest = [h.name for h in moving if h.name != canary.name]
    return [(canary.name,)] + in_batches(rest, batch_size)


def serving_cap(hosts: Sequence[PlanHost], skipped: Mapping[str, str], pins: Pins,
                new: Mapping[str, StackPins], batches: Sequence[Sequence[str]]) -> str | None:
    """Why ``batches`` would swap every reachable host serving a stack at once, or None (a
    stack served by one host only goes on with its 503 window)."""
    by_name = {h.name: h for h in hosts}
    for i, batch in enumerate(batches):
        swapping = [n for n in batch if exercises(by_name[n], pins.for_host(n).stacks, new)]
        for stack in dict.fromkeys(by_name[n].stack for n in swapping):
            every = [h.name for h in hosts if h.stack == stack and h.name not in skipped]
            if len(every) >= 2 and set(every) <= set(swapping):
                label = "the canary" if i == 0 else f"batch {i}"
                return (f"{label} ({', '.join(batch)}) would swap every host serving {stack} "
                        f"({', '.join(every)}) at once: none would be left to serve it")
    return None


def _canary(moving: list[PlanHost], pins: Pins, new: dict[str, StackPins], notes: list[str]
            ) -> PlanHost | None:
    if not moving:
        return None
    testing = [h for h in moving if exercises(h, pins.for_host(h.name).stacks, new)]
    marked = [h for h in moving if CANARY_GROUP in h.groups]
    if found := next((h for h in marked if h in testing), None):
        return found
    if marked:
        notes.append(f"inventory canary {marked[0].name} serves {marked[0].stack}, which this "
                     "bump does not change; a host that serves a bumped stack goes first instead")
    if testing:
        return testing[0]
    notes.append("no host serves a bumped stack: the rollout only re-renders compose files and "
                 "updates Genesis checkouts; no swap gate will test the candidate")
    return moving[0]


def pin_text(p: StackPins, genesis_version: bool = False) -> str:
    text = f"{p.tag} {p.digest[:19]} vLLM {p.vllm_version}"
    if p.genesis is not None:
        text += f" + Genesis {p.genesis.label if genesis_version else p.genesis.commit[:12]}"
    return text
