"""The rollout engine of ``rigfleet bump``, ``rollback`` and ``roll``: a ``pyinfra ... --limit`` run
per batch, each host's outcome read back over SSH (docs/bump.md, step 6), the pins file after::

    runner = PyinfraRunner(inventory, hosts_by_name, SshRemote(), log_dir=Path("reports/..."))
    result = rollout(plan, runner, Path(".pins.yaml.bump-123"), on_event=print)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from rigfleet.bump.journal import BumpJournal
from rigfleet.bump.plan import Plan, Status
from rigfleet.fleetview import each_host, probe_or_why
from rigfleet.hostprobe import HostProbe, run_probe
from rigfleet.hostside.records import GateRecord
from rigfleet.inventory import InventoryHost
from rigfleet.pins import Pins, StackPins
from rigfleet.ssh import Remote

BAD = (Status.FAILED, Status.LOST, Status.NOT_ATTEMPTED)


def probe_record(probe: HostProbe) -> dict[str, Any]:
    """What a later probe is compared with (``gate_of``, ``fresh_swap``), for the journal."""
    state = {k: probe.state[k] for k in ("stack", "digest", "genesis_commit", "last_swap",
                                         "gate") if k in probe.state}  # fmt: skip
    return {"state": state, "ledger_count": probe.ledger_count,
            "reports": list(probe.report_files)}


def probe_of_record(data: Mapping[str, Any] | None) -> HostProbe | None:
    """The probe ``probe_record`` kept (None: none kept)."""
    if not isinstance(data, Mapping):
        return None
    state, reports, count = data.get("state"), data.get("reports"), data.get("ledger_count")
    return HostProbe({
        "state": dict(state) if isinstance(state, Mapping) else {},
        "ledger": {"count": count if isinstance(count, int) else 0},
        "reports": {"files": [str(r) for r in reports] if isinstance(reports, list) else []}})


def new_ledger_lines(before: HostProbe | None, after: HostProbe) -> list[dict[str, Any]]:
    new = after.ledger_count - (before.ledger_count if before else 0)
    return list(after.ledger_tail[-new:]) if new > 0 else []


@dataclass(frozen=True)
class DeployResult:
    """One pyinfra run: exit status, the hosts it failed (None: it printed no JSON), its log."""

    rc: int
    failed_hosts: frozenset[str] | None
    log: str = ""
    seconds: float = 0.0

    def failed(self, host: str) -> bool:
        return self.rc != 0 if self.failed_hosts is None else host in self.failed_hosts


@dataclass(frozen=True)
class HostOutcome:
    """What happened to one host; ``runs_new`` is what the pins file must say it runs."""

    host: str
    status: Status
    batch: int | None = None
    runs_new: bool | None = None  # True: the new pins; False: the old ones; None: unknown
    reason: str = ""
    gate: str = ""  # "pass 8/8", "fail: 2 of 8 checks failed", ""
    failed_checks: tuple[str, ...] = ()
    report_file: str | None = None
    seconds: float = 0.0
    serving: str | None = None  # a roll: the route its front ends on (not journalled)

    def to_record(self) -> dict[str, Any]:
        """The outcome as the bump journal keeps it (``from_record`` reads it back)."""
        kept = {k: v for k, v in vars(self).items() if k not in ("host", "serving")}
        return {**kept, "status": str(self.status), "failed_checks": list(self.failed_checks),
                "seconds": round(self.seconds, 1)}

    @classmethod
    def from_record(cls, host: str, data: Mapping[str, Any]) -> HostOutcome:
        batch = data.get("batch")
        return cls(host, Status(str(data["status"])), batch if isinstance(batch, int) else None,
                   data.get("runs_new"), str(data.get("reason") or ""), str(data.get("gate") or ""),
                   tuple(str(c) for c in data.get("failed_checks") or ()),
                   data.get("report_file"), float(data.get("seconds") or 0.0))

    def summary(self) -> dict[str, Any]:
        """For the pins history and the JSON report."""
        optional = {"gate": self.gate, "failed_checks": list(self.failed_checks),
                    "reason": self.reason}
        return {"result": str(self.status), **{k: v for k, v in optional.items() if v}}


@dataclass
class RolloutResult:
    outcomes: dict[str, HostOutcome]  # inventory order
    stopped: str | None = None  # why the rollout stopped early
    seconds: float = 0.0

    def by_status(self, *statuses: Status) -> list[HostOutcome]:
        return [o for o in self.outcomes.values() if o.status in statuses]

    @property
    def reached(self) -> bool:
        """Whether any host got its run (a rollout that skipped every host did nothing)."""
        return any(o.status is not Status.SKIPPED for o in self.outcomes.values())

    @property
    def ok(self) -> bool:
        """A roll's verdict: it reached a host, and none failed, was lost or left behind."""
        return self.reached and not self.by_status(*BAD)


@dataclass(frozen=True)
class Resume:
    """What an interrupted rollout had done: outcomes that stand, the hosts that were deploying
    (with what they said before), and ``stop``: start no batch (``bump --abandon``), why."""

    done: Mapping[str, HostOutcome] = field(default_factory=dict)
    in_flight: Mapping[str, HostProbe | None] = field(default_factory=dict)
    stop: str | None = None


class StillRunning(RuntimeError):
    """A host's swap from the interrupted rollout still runs (its lock is held): wait."""


class Runner(Protocol):
    """The outside world of a rollout (``PyinfraRunner``; tests use a fake)."""

    def reachable(self, hosts: Sequence[str]) -> dict[str, str | None]: ...

    def facts(self, host: str) -> HostProbe: ...

    def deploy(self, hosts: Sequence[str], pins_file: Path | None, batch: int | str,
               on_line: Callable[[str], None]) -> DeployResult: ...


# --- decisions (pure) ------------------------------------------------------------------------


def _runs(state: Mapping[str, Any], stack: str, p: StackPins) -> bool:
    genesis = p.genesis.commit if p.genesis is not None else None
    return (state.get("stack"), state.get("digest"), state.get("genesis_commit")) == (
        stack, p.digest, genesis)


def gate_of(before: HostProbe | None, after: HostProbe
            ) -> tuple[str, tuple[str, ...], str | None]:
    """(summary, failed check names, report file) of the gate made since ``before``."""
    report = after.newest_report
    if report is not None and (before is None or report.file not in set(before.report_files)):
        return report.text, report.failed, report.file
    gate = GateRecord.from_dict(fresh_swap(before, after).get("gate"))
    if gate is None:
        gate = after.gate
        if gate is None or (before is not None and gate == before.gate):
            return "", (), None
    failed = gate.failed_checks
    text = gate.result + (f" ({', '.join(failed)})" if failed else "")
    if gate.summary:
        text += f": {gate.summary}"
    return text.strip(), failed, gate.report


def fresh_swap(before: HostProbe | None, after: HostProbe) -> dict[str, Any]:
    """The swap transaction's ``last_swap`` record when this run wrote it, else {}."""
    swap = after.state.get("last_swap")
    old = before.state.get("last_swap") if before is not None else None
    if not isinstance(swap, dict) or isinstance(old, dict) and old.get("id") == swap.get("id"):
        return {}
    return swap


def host_error(log: str, host: str) -> str | None:
    """pyinfra's last error line for ``host`` (a ``[host] ...`` line that says error/failed)."""
    lines = (re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in reversed(log.splitlines()))
    return next((
        line for line in lines
        if f"[{host}]" in line and re.search(r"error|fail|refus|unreach|lost|timed out", line, re.I)
        and not re.search(r"Error: executed \d+ commands", line)  # pyinfra's own tally
    ), None)  # fmt: skip


def classify(host: str, stack: str, old: StackPins, new: StackPins, deploy: DeployResult,
             before: HostProbe | None, after: HostProbe | str, batch: int) -> HostOutcome:
    """One host's outcome after its batch: its probe (or why none) read with pyinfra's result."""
    error = host_error(deploy.log, host)
    failed = deploy.failed(host)
    if isinstance(after, str) or after.busy and failed:  # its swap runs on: unknown for now
        lost = (f"unreachable after its deploy started ({after})" if isinstance(after, str)
                else f"a transaction still runs on the host ({after.busy})")
        return HostOutcome(host, Status.LOST, batch, None, with_error(error, lost, "; pyinfra"),
                           seconds=deploy.seconds)
    gate, failed_checks, report = gate_of(before, after)
    runs_new = _runs(after.state, stack, new)
    runs_old = _runs(after.state, stack, old)
    outcome = partial(HostOutcome, host, batch=batch, gate=gate, failed_checks=failed_checks,
                      report_file=report, seconds=deploy.seconds)
    if runs_new and not failed:
        return outcome(Status.PROMOTED, runs_new=True)
    if runs_new and runs_old:  # its serving stack was not bumped, and the deploy failed
        return outcome(Status.FAILED, reason=with_error(error, "the deploy failed"))
    if runs_new:
        return outcome(Status.FAILED, runs_new=True, reason=with_error(
            error, "the swap promoted but the deploy failed afterwards"))
    if runs_old:  # why the host says it did not promote: its swap record, new ledger lines
        records = (fresh_swap(before, after), *reversed(new_ledger_lines(before, after)))
        reason = next((f"{r.get('result') or 'not promoted'}: {r['reason']}" for r in records
                       if r.get("reason")), with_error(error, "rolled back to the old pins"))
        if failed_checks and "gate" not in reason:
            reason = f"verify-stress gate failed ({', '.join(failed_checks)}); {reason}"
        return outcome(Status.FAILED, runs_new=False, reason=reason)
    seen = ", ".join(f"{k}={after.state.get(k)}" for k in ("stack", "digest", "genesis_commit"))
    return outcome(Status.FAILED, reason=with_error(error, f"state.json records {seen}"))


def settle(host: str, stack: str, old: StackPins, new: StackPins, before: HostProbe | None,
           after: HostProbe | str, batch: int) -> HostOutcome | None:
    """An interrupted batch's host's outcome from what it says now; None: its swap never
    started (the resumed batch deploys it); ``StillRunning`` while a transaction holds its lock."""
    if isinstance(after, str):
        return HostOutcome(host, Status.LOST, batch, None,
                           f"unreachable when the interrupted bump resumed ({after})")
    if after.busy:
        raise StillRunning(f"{host}: a transaction still runs there ({after.busy})")
    if _runs(after.state, stack, new):
        return HostOutcome(host, Status.PROMOTED, batch, True,
                           "promoted while the bump was interrupted", *gate_of(before, after))
    if _runs(after.state, stack, old) and before is not None and not gate_of(before, after)[0] \
            and not fresh_swap(before, after):
        return None
    return classify(host, stack, old, new, DeployResult(1, None), before, after, batch)


def with_error(error: str | None, fallback: str, sep: str = "") -> str:
    return f"{fallback}{sep}: {error}" if error else fallback


def step_label(batch: int) -> str:
    return "canary" if batch == 0 else f"batch {batch}"


Judge = Callable[[str, DeployResult, "HostProbe | None", "HostProbe | str", int], HostOutcome]


def rollout(plan: Plan, runner: Runner, pins_file: Path,
            on_event: Callable[[str], None] = lambda _: None,
            on_line: Callable[[str], None] = lambda _: None, journal: BumpJournal | None = None,
            resume: Resume | None = None) -> RolloutResult:
    """Roll the plan out on the candidate ``pins_file``, canary first (``resume``: from where)."""
    started = time.monotonic()
    resume = resume or Resume()
    done = dict(resume.done)
    out = {name: HostOutcome(name, Status.UP_TO_DATE, runs_new=True) for name in plan.up_to_date}
    out.update({name: HostOutcome(name, Status.SKIPPED, runs_new=False,
                                  reason=reason if reason.endswith("--limit")  # left out
                                  else f"unreachable at the start ({reason})")
                for name, reason in plan.skipped.items()})

    def pins(h: str) -> tuple[str, StackPins, StackPins]:  # the stack it serves, old, new
        stack = plan.host(h).stack
        return stack, plan.old_for(h)[stack], plan.new_for(h)[stack]

    for i, batch in enumerate(plan.batches):
        for h in (h for h in batch if h in resume.in_flight and h not in done):
            settled = settle(h, *pins(h), resume.in_flight[h], probe_or_why(runner.facts, h), i)
            if settled is not None:
                done[h] = settled
                _record(out, journal, on_event, settled, f"{step_label(i)} (interrupted)")

    return run_batches(plan.batches, runner, pins_file,
                       lambda h, *rest: classify(h, *pins(h), *rest), out, plan.max_failures,
                       [h.name for h in plan.hosts], started, on_event=on_event,
                       on_line=on_line, journal=journal, done=done, stopped=resume.stop)


def run_batches(batches: Sequence[Sequence[str]], runner: Runner, pins_file: Path | None,
                judge: Judge, out: dict[str, HostOutcome], max_failures: int,
                order: Sequence[str], started: float, *,
                canary: bool = True, first: int = 0, label: Callable[[int], str] = step_label,
                on_event: Callable[[str], None] = lambda _: None,
                on_line: Callable[[str], None] = lambda _: None,
                journal: BumpJournal | None = None,
                done: Mapping[str, HostOutcome] | None = None,
                stopped: str | None = None) -> RolloutResult:
    """One ``runner.deploy`` per batch (numbered from ``first``), ``judge`` each host. Stops at
    ``max_failures`` failed or lost hosts, or (``canary``) a failed first batch: the rest is
    ``NOT_ATTEMPTED``; unreachable or busy at its batch: ``SKIPPED``; ``done`` outcomes stand."""
    done = done or {}
    failures = 0
    for i, batch in enumerate(batches):
        n = i + first
        if stopped:
            for h in batch:
                out[h] = done.get(h) or HostOutcome(h, Status.NOT_ATTEMPTED, n, False, stopped)
            continue
        out.update({h: done[h] for h in batch if h in done})
        if todo := [h for h in batch if h not in done]:
            reach = runner.reachable(todo)
            live = [h for h in todo if not reach.get(h)]
            for h in todo:
                if why := reach.get(h):
                    _record(out, journal, on_event, HostOutcome(h, Status.SKIPPED, n, False, why
                            if why.startswith("busy:") else f"unreachable before its batch "
                            f"({why})"), label(n))
            if canary and not live and i == 0 and batch[0] in todo:
                stopped = f"the canary {batch[0]} could not be worked on ({reach[batch[0]]}); " \
                    "nothing was changed"
            if live:
                before = {h: p if isinstance(p := probe_or_why(runner.facts, h), HostProbe)
                          else None for h in live}
                if journal is not None:
                    journal.deploying_batch(n, live, {h: probe_record(f) if f else None
                                                      for h, f in before.items()})
                on_event(f"{label(n)}: deploying {', '.join(live)}")
                result = runner.deploy(live, pins_file, n, on_line)
                for h in live:
                    _record(out, journal, on_event,
                            judge(h, result, before[h], probe_or_why(runner.facts, h), n),
                            label(n))
        failures += sum(1 for h in batch if out[h].status in (Status.FAILED, Status.LOST))
        if stopped:
            continue
        if canary and i == 0 and out[batch[0]].status in (Status.FAILED, Status.LOST):
            stopped = f"the canary {batch[0]} did not promote; no other host touched"
        elif failures >= max_failures:
            stopped = f"{failures} host(s) failed (--max-failures {max_failures})"
    if journal is not None:
        journal.finish(stopped)
    return RolloutResult({h: out[h] for h in order if h in out}, stopped,
                         time.monotonic() - started)


def _record(out: dict[str, HostOutcome], journal: BumpJournal | None,
            on_event: Callable[[str], None], o: HostOutcome, label: str) -> None:
    out[o.host] = o
    gate, reason = f" (gate {o.gate})" if o.gate else "", f": {o.reason}" if o.reason else ""
    on_event(f"{label}: {o.host} {o.status}{gate}{reason}")
    if journal is not None:
        journal.record(o.host, o.to_record())


# --- the pins file afterwards (pure; the rules: docs/bump.md, step 8) --------------------------


def stack_summary(p: StackPins) -> dict[str, Any]:
    """A stack's pins in a history entry: enough for ``rigfleet rollback`` to rebuild them."""
    # image_id null: none pinned (absent: an entry older than this key)
    out: dict[str, Any] = {"image": p.image, "digest": p.digest, "vllm_version": p.vllm_version,
                           "image_id": p.image_id}
    if p.genesis is not None:
        out.update(genesis=p.genesis.commit, genesis_layout=p.genesis.layout)
        if p.genesis.version:
            out["genesis_version"] = p.genesis.version
    return out


def outcome_of(result: RolloutResult) -> str:
    """``promoted`` (every host that was to move did, skipped-at-start hosts aside) |
    ``partial`` | ``failed`` (nothing moved)."""
    if result.by_status(Status.PROMOTED) and not result.by_status(*BAD):
        return "promoted"
    moved = [o for o in result.outcomes.values() if o.runs_new and o.status != Status.UP_TO_DATE]
    return "partial" if moved else "failed"


def pins_after(plan: Plan, result: RolloutResult, when: str, by: str,
               extra: dict[str, Any] | None = None) -> tuple[Pins | None, dict[str, Any] | None]:
    """(pins to save, history entry), or (None, None) when the file must not change."""
    outcome = outcome_of(result)
    if outcome == "failed":
        return None, None
    old = plan.pins
    top = {**old.stacks, **plan.new_stacks} if outcome == "promoted" else dict(old.stacks)
    known = {h.name for h in plan.hosts}
    hosts = {name: dict(stacks) for name, stacks in old.hosts.items() if name not in known}
    for h in plan.hosts:
        o = result.outcomes.get(h.name)
        runs = plan.new_for(h.name) if o is not None and o.runs_new else plan.old_for(h.name)
        if differs := {s: p for s, p in runs.items() if top.get(s) != p}:
            hosts[h.name] = differs
    entry = {"at": when, "by": by, "action": "bump", "outcome": outcome,
             "old": {s: stack_summary(old.stacks[s]) for s in plan.new_stacks},
             "new": {s: stack_summary(p) for s, p in plan.new_stacks.items()},
             "hosts": {name: o.summary() for name, o in result.outcomes.items()},
             **(extra or {})}
    return replace(old, stacks=top, hosts=hosts), entry


def pyinfra_json(stdout: str) -> dict[str, Any] | None:
    """pyinfra's ``--json`` payload (the last JSON object on stdout), or None."""
    first = stdout.find("{")  # then each line that starts one
    starts = [first, *(m.start() + 1 for m in re.finditer(r"\n\{", stdout))] if first >= 0 else []
    for start in starts:
        with contextlib.suppress(ValueError):
            data = json.loads(stdout[start:])
            return data if isinstance(data, dict) else None
    return None


def pyinfra_command(inventory: str, deploy: str, hosts: Sequence[str], pins_file: Path | None
                    ) -> list[str]:
    """The batch's command line (``pins_file`` None: the inventory's own)."""
    exe = Path(sys.executable).with_name("pyinfra")
    cmd = [str(exe) if exe.exists() else "pyinfra", inventory, deploy, "-y", "--json"]
    if pins_file is not None:
        cmd += ["--data", f"pins_file={pins_file}"]
    return cmd + [arg for h in hosts for arg in ("--limit", h)]


@dataclass
class PyinfraRunner:
    """``Runner`` over pyinfra and SSH; each batch's output goes to ``<log_dir>/batch-<n>.log``."""

    inventory: str
    hosts: Mapping[str, InventoryHost]
    remote: Remote
    deploy_file: str = "deploy.py"
    log_dir: Path | None = None
    timeout: float = 4 * 3600
    env: Mapping[str, str] = field(default_factory=dict)

    def reachable(self, hosts: Sequence[str]) -> dict[str, str | None]:
        """Host -> None when the deploy can work on it now, else why not (SSH, a held lock)."""
        answers = each_host([self.hosts[h] for h in hosts],
                            lambda h: f"busy: {b}" if (b := self.facts(h.name).busy) else None,
                            lambda h, why: why)
        return dict(zip(hosts, answers, strict=True))

    def facts(self, host: str) -> HostProbe:
        return run_probe(self.remote, self.hosts[host], full=True)

    def deploy(self, hosts: Sequence[str], pins_file: Path | None, batch: int | str,
               on_line: Callable[[str], None]) -> DeployResult:
        # pyinfra runs in the deploy's directory: the caller's relative paths made absolute
        deploy = Path(self.deploy_file).resolve()
        cmd = pyinfra_command(str(Path(self.inventory).resolve()), str(deploy), hosts,
                              pins_file and pins_file.resolve())
        started = time.monotonic()
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"batch-{batch}.log" if self.log_dir else Path(os.devnull)
        # stdout carries only the JSON at the end; stderr is the progress, read as it comes.
        with log_path.open("w") as log_file, \
                tempfile.TemporaryFile("w+", errors="replace") as out_file:
            log_file.write("$ " + " ".join(cmd) + "\n")
            proc = subprocess.Popen(cmd, cwd=deploy.parent, stdout=out_file, stderr=subprocess.PIPE,
                                    env={**os.environ, **self.env}, text=True, errors="replace")
            assert proc.stderr is not None
            log: list[str] = []
            killer = threading.Timer(self.timeout, proc.kill)  # a hung run holds stderr open
            killer.start()
            try:
                for line in proc.stderr:
                    log.append(line)
                    log_file.write(line)
                    log_file.flush()
                    on_line(line.rstrip())
                rc = proc.wait()
            finally:
                killer.cancel()
            if time.monotonic() - started >= self.timeout:
                log_file.write(f"--- killed after {self.timeout:g} s (timeout)\n")
            out_file.seek(0)
            stdout = out_file.read()
            log_file.write(f"--- exit {rc}; stdout (pyinfra --json)\n" + stdout)
        results = (pyinfra_json(stdout) or {}).get("results")
        failed = frozenset(results.get("failed_hosts") or []) if isinstance(results, dict) else None
        return DeployResult(rc, failed, "".join(log), time.monotonic() - started)
