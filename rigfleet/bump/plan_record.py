"""A bump's plan as a record (``Plan``, its hosts ``PlanHost``): ``rigfleet.bump.plan`` decides
it, the bump's journal keeps it, the deploy's model reads it while a bump is unfinished::

    plan.new_for("host2")["int8"]    # the pins host2 runs once promoted
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from rigfleet.pins import Pins, StackPins


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
        """The pins file the rollout deploys with (at ``path``): the bumped stacks new, rollout
        hosts' overrides of them dropped, and the serial the real file gets when saved (so the
        ledgers' ``pins_serial`` matches it)."""
        moving = {h for batch in self.batches for h in batch}
        kept = {name: {s: p for s, p in overrides.items()
                       if name not in moving or s not in self.new_stacks}
                for name, overrides in self.pins.hosts.items()}
        return replace(self.pins, path=path, serial=self.pins.serial + 1,
                       stacks={**self.pins.stacks, **self.new_stacks},
                       hosts={name: stacks for name, stacks in kept.items() if stacks})
