"""The journal of an unfinished ``rigfleet bump`` (``<pins file>.bump-journal.json``): its plan and
what it did, so converges keep promoted hosts there and the next bump finishes it (docs/bump.md)::

    journal = load_journal(pins)                 # None when no bump is unfinished
    if journal is not None and journal.state == "open":
        journal.pins_for(pins, "host1").stacks["int8"].digest    # the candidate's
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from rigfleet import pins as pins_file
from rigfleet.bump.plan import Plan, PlanHost, Status
from rigfleet.catalog import Catalog
from rigfleet.hostside.records import now_iso
from rigfleet.pins import Pins, PinsError, StackPins, parse_pins, stack_dict, write_keeping_mode
from rigfleet.validate import Problems

SCHEMA = "rigfleet-bump-journal/1"
# A bump's outcomes (a roll's own are never journalled).
STATUSES = [s for s in Status if s not in (Status.CONVERGED, Status.MAINTAINED)]
_KEYS = ("schema", "id", "started", "updated", "by", "owner", "pins_file", "base_serial",
         "new_stacks", "candidate", "version", "hosts", "canary", "batches", "skipped",
         "up_to_date", "batch_size", "max_failures", "outcomes", "deploying", "stopped",
         "history")
_NAME = re.compile(r"[^\s/]+")


def journal_path(pins_path: str | Path) -> Path:
    return Path(f"{pins_path}.bump-journal.json")


class JournalError(PinsError):
    """The journal cannot be read, or it disagrees with the pins file."""


class BumpInFlight(PinsError):
    """A host an interrupted bump was deploying: only the host knows what it runs now."""

    def __init__(self, message: str, host: str, old: Pins, new: Pins) -> None:
        super().__init__(message)
        self.host, self.old, self.new = host, old, new


@dataclass
class BumpJournal:
    """One bump's journal; ``save`` writes it, atomically."""

    path: Path
    id: str
    started: str
    by: str
    owner: dict[str, Any]
    base_serial: int
    planned: Plan  # what it rolls out (``pins``: the pins file as read with the journal)
    candidate: dict[str, Any] | None = None
    version: str = ""
    outcomes: dict[str, dict[str, Any]] = field(default_factory=dict)
    deploying: dict[str, Any] | None = None
    stopped: str | None = None
    updated: str = ""
    history: dict[str, Any] = field(default_factory=dict)  # more of the pins history entry
    state: str = "open"  # open | finished | stale (from the pins file; not written)

    @classmethod
    def start(cls, plan: Plan, journal_id: str, by: str, candidate: Mapping[str, Any] | None,
              version: str, history: Mapping[str, Any] | None = None) -> BumpJournal:
        """The journal of a bump about to roll ``plan`` out, written before any host changes."""
        path = journal_path(plan.pins.path)
        journal = cls(
            path=path, id=journal_id, started=now_iso(suffix="Z"), by=by, owner={},
            base_serial=plan.pins.serial, planned=plan,
            candidate=dict(candidate) if candidate is not None else None, version=version,
            history=dict(history or {}),
        )
        journal.take_over()  # of two bumps starting at once, one finds the other's journal
        return journal

    def take_over(self) -> None:
        """Own the journal as read (none for a new bump; a resume, ``--abandon``): the owner is
        compared and written under the pins file's lock; of two at once one goes on."""
        with pins_file.saving(self.path):
            try:
                owner = json.loads(self.path.read_text(encoding="utf-8")).get("owner")
            except FileNotFoundError:
                owner = {}
            except (OSError, ValueError, AttributeError):
                owner = None
            if owner != self.owner:
                now = (f"another bump owns this journal now (pid {owner.get('pid')} on "
                       f"{owner.get('host')})" if isinstance(owner, dict) and owner else
                       "its journal was removed or rewritten meanwhile")
                raise JournalError(f"{self.describe()}: {now}; nothing changed; allowed: one "
                                   "bump at a time: wait for it to end, then run `rigfleet "
                                   "bump` again")
            self.owner = {"host": socket.gethostname(), "pid": os.getpid()}
            self.save()

    def deploying_batch(self, batch: int, hosts: Sequence[str],
                        before: Mapping[str, dict[str, Any] | None]) -> None:
        """Before a batch's deploy starts: its hosts and what each said before it."""
        self.deploying = {"batch": batch, "hosts": list(hosts), "since": now_iso(suffix="Z"),
                          "before": dict(before)}
        self.save()

    def record(self, host: str, outcome: Mapping[str, Any]) -> None:
        """A host's outcome, as soon as it is known (``HostOutcome.to_record()``)."""
        self.outcomes[host] = {**outcome, "at": now_iso(suffix="Z")}
        if not self.in_flight:
            self.deploying = None
        self.save()

    def finish(self, stopped: str | None) -> None:
        self.deploying, self.stopped = None, stopped
        self.save()

    def save(self) -> None:
        self.updated = now_iso(suffix="Z")
        write_keeping_mode(self.path, json.dumps(self.to_dict(), indent=2) + "\n")

    def to_dict(self) -> dict[str, Any]:
        plan = self.planned  # its fields as they are but the stacks' pins and the hosts
        values = {**vars(self), **vars(plan), "schema": SCHEMA, "pins_file": str(plan.pins.path),
                  "new_stacks": {n: stack_dict(p) for n, p in plan.new_stacks.items()},
                  "hosts": [asdict(h) for h in plan.hosts]}
        return {k: values[k] for k in _KEYS}

    @property
    def in_flight(self) -> list[str]:
        return [h for h in (self.deploying or {}).get("hosts", []) if h not in self.outcomes]

    @property
    def promoted(self) -> list[str]:
        """Hosts recorded as running the candidate's pins, in plan order."""
        return [h.name for h in self.planned.hosts
                if (self.outcomes.get(h.name) or {}).get("runs_new") is True]

    def plan(self, pins: Pins) -> Plan:
        return replace(self.planned, pins=pins)

    def target(self) -> str:
        """What this bump moves to, for messages: ``int8 -> vllm/vllm-openai:v0.21.0``."""
        return ", ".join(f"{n} -> {p.image}" + (f" + Genesis {p.genesis.label}"
                                                if p.genesis else "")
                         for n, p in self.planned.new_stacks.items())

    def describe(self) -> str:
        """``the bump <id> (int8 -> ..., started <t> by <who>, journal <path>)``."""
        return (f"the bump {self.id} ({self.target()}, started {self.started} by {self.by}, "
                f"journal {self.path})")

    def pins_for(self, pins: Pins, host: str) -> Pins:
        """``pins.for_host(host)`` with this bump applied (``BumpInFlight``: only the host
        knows; ``JournalError``: the journal is stale)."""
        old = pins.for_host(host)
        if self.state == "finished":
            return old
        if self.state == "stale":
            raise JournalError(
                f"{pins.path}: serial: {pins.serial}, but {self.describe()} started from serial "
                f"{self.base_serial}: the pins file was saved while that bump was unfinished, "
                "so neither says alone what the hosts run; allowed: run `rigfleet bump "
                "--abandon` (records what the bump promoted into the pins file as it is now "
                "and removes the journal), then check the pins file")
        new = replace(old, stacks={**old.stacks, **self.planned.new_stacks})
        if (self.outcomes.get(host) or {}).get("runs_new") is True:
            return new
        if host in self.in_flight:
            since = (self.deploying or {}).get("since", "?")
            raise BumpInFlight(
                f"{host}: {self.describe()} was deploying this host since {since} when it "
                "stopped; whether its swap promoted or rolled back is known only to the host; "
                "allowed: run `rigfleet bump` again (it reads the outcome from the host and "
                "finishes the rollout) or `rigfleet bump --abandon` (records it and stops); "
                "until then the deploy leaves this host as it is", host, old, new)
        return old

    def host_view(self, host: str) -> dict[str, Any] | None:
        """Where ``host`` stands in this bump, for ``rigfleet status`` (None: not in the plan)."""
        if host not in {h.name for h in self.planned.hosts}:
            return None
        base = {"bump": self.id, "target": self.target(), "started": self.started,
                "by": self.by, "journal": str(self.path)}
        if (outcome := self.outcomes.get(host)) is not None:
            state = "candidate" if outcome.get("runs_new") is True else str(outcome.get("status"))
            return {**base, "state": state, "since": outcome.get("at")}
        if host in self.in_flight:
            return {**base, "state": "in flight", "since": (self.deploying or {}).get("since")}
        if host in self.planned.up_to_date:
            return {**base, "state": "candidate", "since": None}
        if host in self.planned.skipped:
            return {**base, "state": "skipped", "since": self.started}
        return {**base, "state": "old", "since": None}


def load_journal(pins: Pins, catalog: Catalog | None = None) -> BumpJournal | None:
    """The journal beside ``pins.path``, checked, with its ``state`` (None: there is none)."""
    path = journal_path(pins.path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except OSError as e:
        raise JournalError(f"{path}: cannot be read ({e.strerror}); allowed: a readable file "
                           "(or none)") from None
    except ValueError as e:  # not JSON, or not UTF-8 text
        raise JournalError(f"{path}: top level: not JSON ({e}); allowed: a rigfleet bump "
                           "journal (remove it only if no bump is unfinished)") from None
    journal = _parse(path, data, pins, catalog)
    finished = bool(pins.history) and pins.history[-1].get("bump_id") == journal.id
    journal.state = ("open" if pins.serial == journal.base_serial
                     else "finished" if finished else "stale")
    return journal


def _parse(path: Path, data: Any, pins: Pins, catalog: Catalog | None) -> BumpJournal:
    p = Problems(str(path))
    if (top := p.mapping("", data, _KEYS)) is None:
        p.raise_if_any(JournalError)
        raise AssertionError("unreachable")
    if top.get("schema") != SCHEMA:
        p.bad("schema", top.get("schema"), repr(SCHEMA), "is not a supported schema")
    journal_id = p.string("id", top.get("id"), _NAME, "the bump's id")
    serial = p.integer("base_serial", top.get("base_serial"), low=1)
    hosts: list[PlanHost] = []
    listed = top.get("hosts")
    if not isinstance(listed, list):
        p.bad("hosts", listed, "a list of {name, stack, groups}")
        listed = []
    for i, h in enumerate(listed):
        d = p.mapping(f"hosts[{i}]", h, ("name", "stack", "groups"))
        if d is not None:
            name = p.string(f"hosts[{i}].name", d.get("name"), _NAME, "an inventory host name")
            stack = p.string(f"hosts[{i}].stack", d.get("stack"), _NAME, "a stack name")
            groups = p.strings(f"hosts[{i}].groups", d.get("groups"), _NAME, "group names")
            if name and stack:
                hosts.append(PlanHost(name, stack, tuple(groups or ())))
    names = {h.name for h in hosts}
    batches = top.get("batches")
    if not isinstance(batches, list) or not all(
            isinstance(b, list) and all(h in names for h in b) for b in batches):
        p.bad("batches", batches, "a list of lists of the journal's host names")
        batches = []
    outcomes = top.get("outcomes") or {}
    if not isinstance(outcomes, dict):
        p.bad("outcomes", outcomes, "a mapping host -> outcome")
        outcomes = {}
    for host, o in outcomes.items():
        if host not in names or not isinstance(o, dict) or o.get("status") not in STATUSES \
                or o.get("runs_new") not in (True, False, None):
            p.bad(f"outcomes.{host}", o, f"a journal host's {{status: {', '.join(STATUSES)}, "
                  "runs_new: true/false/null, ...}")  # fmt: skip
    deploying = top.get("deploying")
    if deploying is not None and (not isinstance(deploying, dict) or not isinstance(
            deploying.get("hosts"), list) or not set(deploying["hosts"]) <= names):
        p.bad("deploying", deploying, "null or {batch, hosts: [journal hosts], since, before}")
    new_stacks = _parse_stacks(p, top.get("new_stacks"), pins, catalog)
    history = top.get("history") or {}
    if not isinstance(history, dict):
        p.bad("history", history, "a mapping of the pins history entry's fields")
    for key in ("batch_size", "max_failures"):
        p.integer(key, top.get(key), low=1)
    p.raise_if_any(JournalError)
    assert journal_id is not None and serial is not None
    planned = Plan(pins, new_stacks, tuple(hosts), top.get("canary"),
                   tuple(tuple(b) for b in batches), dict(top.get("skipped") or {}),
                   tuple(top.get("up_to_date") or ()), int(top["batch_size"]),
                   int(top["max_failures"]))
    return BumpJournal(
        path=path, id=journal_id, started=str(top.get("started") or ""),
        by=str(top.get("by") or ""), owner=dict(top.get("owner") or {}), base_serial=serial,
        planned=planned, candidate=top.get("candidate"),
        version=str(top.get("version") or ""), outcomes=dict(outcomes), deploying=deploying,
        stopped=top.get("stopped"), updated=str(top.get("updated") or ""),
        history=dict(history),
    )  # fmt: skip


def _parse_stacks(p: Problems, value: Any, pins: Pins,
                  catalog: Catalog | None) -> dict[str, StackPins]:
    if not isinstance(value, dict) or not value:
        p.bad("new_stacks", value, "a mapping stack -> its pins, as in the pins file")
        return {}
    data = pins.to_dict()
    data["stacks"] = {**data["stacks"], **value}
    try:
        parsed = parse_pins(data, str(p.where), catalog=catalog)
    except PinsError as e:
        p.lines += [line.replace(": stacks.", ": new_stacks.", 1) for line in e.problems]
        return {}
    return {n: parsed.stacks[n] for n in value}
