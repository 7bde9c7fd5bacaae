"""The supervisor's decisions (a dead engine recreated from its verified snapshot, with a
backoff and a limit; past it 503 with the reason): pure functions over records; the loop is
``rigfleet.hostside.supervisor``; the rules: docs/swap.md ("When the engine dies")::

    record, action = step(record, observation, Policy())
    action.kind    # 'none', 'open-window', 'recreate', 'reroute', 'record', 'give-up', ...
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from .front import MAINTENANCE
from .layout import STACK_UNIT, SUPERVISE_UNIT
from .plan import Active
from .records import SUPERVISE_SCHEMA, Coded, decode_strict, describe, encode, now_iso
from .stackctl import ContainerState, classify_boot_failure, docker_time

WHO = SUPERVISE_UNIT
# How rigfleet-stack.service stands (stackctl.parse_unit_state) -> why that pauses us.
PAUSING_UNIT = {
    "starting": f"{STACK_UNIT} is starting: its ensure owns the host",
    "stopping": f"{STACK_UNIT} is stopping: the host is going down",
    "inactive": f"{STACK_UNIT} is stopped: the host is meant not to serve",
}


@dataclass(frozen=True)
class Policy:
    """When to act, how long to wait and when to give up (the unit's flags: ``POLICY_FLAGS``)."""

    backoff_s: tuple[float, ...] = (10.0, 30.0, 90.0)
    limit: int = 3
    window_s: float = 1800.0
    poll_s: float = 5.0
    unhealthy_after_s: float = 60.0
    ready_timeout_s: float = 1200.0
    vram_timeout_s: float = 120.0
    retry_after_s: int = 30

    def backoff(self, done: int) -> float:
        """The wait before the next recreation when ``done`` happened within the window."""
        if not self.backoff_s:
            return 0.0
        return self.backoff_s[min(done, len(self.backoff_s) - 1)]

    def argv(self) -> list[str]:
        """The ``supervise`` flags that say this policy (``roles/swap.py`` renders them)."""
        out = []
        for name, (flag, _) in POLICY_FLAGS.items():
            value = getattr(self, name)
            out += [flag, ",".join(f"{s:g}" for s in value) if name == "backoff_s"
                    else str(value) if isinstance(value, int) else f"{value:g}"]
        return out

    def summary(self) -> dict[str, Any]:
        kept = ("backoff_s", "limit", "window_s", "unhealthy_after_s", "poll_s")
        return {name: value for name, value in encode(self).items() if name in kept}


# Policy field -> its ``supervise`` flag and help (the order of ``Policy.argv``).
POLICY_FLAGS: dict[str, tuple[str, str | None]] = {
    "backoff_s": ("--backoff-s", "waits before the 1st, 2nd, ... recreation within the window "
                  "(default 10,30,90; the last one repeats)"),
    "limit": ("--limit", "recreations within the window before it gives up (default 3)"),
    "window_s": ("--window-s", None),
    "poll_s": ("--poll-s", None),
    "unhealthy_after_s": ("--unhealthy-s",
                          "/health failing this long after it served = the engine is dead"),
    "ready_timeout_s": ("--ready-timeout-s", None),
    "vram_timeout_s": ("--vram-timeout-s", None),
    "retry_after_s": ("--retry-after-s", None),
}


def parse_backoff(text: str) -> tuple[float, ...]:
    """``"10,30,90"`` -> (10.0, 30.0, 90.0); ValueError naming the value otherwise."""
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        values = ()
    if not values or any(not math.isfinite(v) or v < 0 for v in values):
        raise ValueError(f"{text!r} is not a list of seconds; allowed: comma-separated numbers "
                         ">= 0, e.g. 10,30,90")
    return values


@dataclass(frozen=True)
class Attempt:
    """One recreation; ``result``: ``running``, ``recreated``, ``failed`` or
    ``interrupted``; ``noted``: a ledger line accounts for it."""

    at: float
    reason: str
    result: str = "running"
    detail: str = ""
    seconds: float | None = None
    journal: str = ""
    kept_log: str | None = None
    noted: bool = False


@dataclass(frozen=True)
class Record(Coded):
    """``supervise/state.json`` (times: epoch seconds). ``state``: starting, idle, paused,
    watching, booting, backoff, recreating or gave-up; ``epoch``: the watched stack's
    promotion; ``healthy_start``: ``StartedAt`` of the container last seen healthy."""

    state: str = "starting"
    reason: str = ""
    since: float = 0.0
    route_id: str | None = None
    epoch: str = ""
    reset_token: str = ""
    attempts: tuple[Attempt, ...] = ()
    dead_since: float | None = None
    death: str = ""
    boot_failure: dict[str, str] | None = None
    healthy_start: str = ""
    unhealthy_since: float | None = None
    next_attempt_at: float | None = None
    gave_up_at: float | None = None

    @classmethod
    def from_dict(cls, data: Any) -> Record:
        """A record from ``state.json`` (fresh when it is none); TypeError names a damaged field."""
        if not isinstance(data, dict) or data.get("schema") != SUPERVISE_SCHEMA:
            return cls()
        return decode_strict(cls, data, "")

    def clamped(self, now: float) -> Record:
        """No time after ``now``: a clock stepped back (at boot, an RTC kept in local time) must
        not keep a death's backoff or the window's attempts running for the hours it moved."""
        def at_most(t: float | None) -> float | None:
            return None if t is None else min(t, now)

        return replace(self, since=min(self.since, now), dead_since=at_most(self.dead_since),
                       unhealthy_since=at_most(self.unhealthy_since),
                       attempts=tuple(replace(a, at=min(a.at, now)) for a in self.attempts))

    def recent(self, now: float, window_s: float) -> list[Attempt]:
        """The attempts within the window (what the limit counts)."""
        return [a for a in self.attempts if a.at >= now - window_s]

    def unnoted(self) -> Attempt | None:
        """The newest attempt no ledger line accounts for (its supervisor was killed)."""
        return next((a for a in reversed(self.attempts) if not a.noted), None)

    def noted(self, last: Attempt | None = None) -> Record:
        """Every attempt accounted for; ``last`` replaces (or is added as) the newest one."""
        attempts = [replace(a, noted=True) for a in self.attempts]
        if last is not None:
            if attempts and attempts[-1].at == last.at:
                attempts.pop()
            attempts.append(replace(last, noted=True))
        return replace(self, attempts=tuple(attempts))


def epoch_of(active: Active) -> str:
    """What changes when another stack (or the same one, re-verified) is promoted."""
    return f"{active.deploy_id}|{active.since}|{active.ref.route_id}"


def started(rec: Record, now: float) -> Record:
    """The record as a new supervisor takes it over (an attempt left ``running`` was cut short)."""
    attempts = tuple(replace(a, result="interrupted", detail=a.detail or "the supervisor "
                             "stopped during it (killed or restarted)")
                     if a.result == "running" else a for a in rec.attempts)
    if rec.state == "gave-up":
        return replace(rec, attempts=attempts)  # it stays given up across restarts
    return replace(rec, attempts=attempts, state="starting", since=now,
                   reason="the supervisor (re)started")


@dataclass(frozen=True)
class Observation:
    """What the loop saw, once. ``holder``: a live lock holder other than this process;
    ``damaged``: ``problem`` is a damaged active record; ``window``: ``window_status``'s."""

    now: float
    active: Active | None = None
    problem: str = ""
    damaged: bool = False
    window: str = "none"
    window_why: str = ""
    can_close: bool = False
    container: ContainerState | None = None
    healthy: bool = False
    health: str = ""
    log: str = ""
    holder: dict[str, Any] | None = None
    stack_unit: str = "done"
    route: str | None = None
    reset: dict[str, Any] | None = None


@dataclass(frozen=True)
class Action:
    """What the loop must do now, with the host lock (``none``: nothing)."""

    kind: str = "none"
    reason: str = ""


NOTHING = Action()


def moved(rec: Record, state: str, reason: str, now: float, **changes: Any) -> Record:
    """``rec`` in ``state`` for ``reason`` (``since`` kept while the state stays)."""
    since = rec.since if (state, reason) == (rec.state, rec.reason) or (
        state == rec.state and state in ("booting", "backoff")) else now
    return replace(rec, state=state, reason=reason, since=since, **changes)


def engine_death(rec: Record, obs: Observation, p: Policy) -> str | None:
    """Why the active stack's engine is dead, or None (alive, or still starting)."""
    assert obs.active is not None
    ref, st, now = obs.active.ref, obs.container, obs.now
    if st is None:
        return f"its container {ref.container} is gone"
    if st.config_hash != ref.config_hash:
        return (f"{ref.container} runs config {st.config_hash or 'unlabelled'}, not the "
                f"verified snapshot's {ref.config_hash}")
    if ref.image_id and st.image_id and st.image_id != ref.image_id:
        return (f"{ref.container} runs image {st.image_id[:19]}, not the verified "
                f"{ref.image_id[:19]} (its tag was moved)")
    if st.status in ("exited", "dead"):
        return (f"its container exited (exit code {st.exit_code}"
                + (", OOM-killed" if st.oom_killed else "") + ")")
    if st.status == "restarting" or st.restarts > 0:
        return ("Docker restarted its container in place (Genesis' patches live in the "
                "container's writable layer: recreate, never restart)")
    if not st.running:
        return f"its container is {st.status}"
    if obs.healthy:
        return None
    if rec.healthy_start and rec.healthy_start == st.started_at:
        since = rec.unhealthy_since if rec.unhealthy_since is not None else now
        if now - since >= p.unhealthy_after_s:
            return f"its engine stopped answering ({obs.health} for {now - since:.0f} s)"
        return None
    begun = docker_time(st.started_at)
    if begun is not None and now - begun > p.ready_timeout_s:
        return f"not ready {p.ready_timeout_s:g} s after it started ({obs.health})"
    return None


def _reset(rec: Record, obs: Observation) -> Record:
    """A fresh count when another stack was promoted or someone asked for a reset."""
    assert obs.active is not None
    epoch, reset = epoch_of(obs.active), obs.reset or {}
    token = str(reset.get("token") or "")
    if rec.epoch == epoch and rec.reset_token == token:
        return rec
    if not rec.epoch:
        why = rec.reason  # the first look: nothing to forget
    elif rec.epoch != epoch:
        why = f"a new verified stack: {obs.active.ref.route_id}"
    else:
        why = f"reset by {reset.get('by') or 'someone'}: {reset.get('why') or 'no reason given'}"
    return Record(state=rec.state if not rec.epoch else "watching", reason=why, since=obs.now,
                  route_id=obs.active.ref.route_id, epoch=epoch, reset_token=token,
                  healthy_start=rec.healthy_start if rec.epoch == epoch else "")


def step(rec: Record, obs: Observation, p: Policy) -> tuple[Record, Action]:
    """The record after ``obs``, and what to do now (see the module docstring)."""
    now = obs.now
    rec = rec.clamped(now)
    if obs.problem:
        return (moved(rec, "paused", obs.problem, now),
                Action("repair", obs.problem) if obs.damaged and obs.holder is None
                else NOTHING)
    if obs.active is None:
        return moved(rec, "idle", "nothing was ever verified on this host: nothing to watch", now,
                     route_id=None, dead_since=None, death="", boot_failure=None,
                     next_attempt_at=None), NOTHING
    rec = _reset(rec, obs)
    ref = obs.active.ref
    if obs.holder is not None:
        return moved(rec, "paused", f"{describe(obs.holder)}: they own the host", now), NOTHING
    if obs.stack_unit in PAUSING_UNIT:
        return moved(rec, "paused", PAUSING_UNIT[obs.stack_unit], now), NOTHING
    if obs.window == "abandoned" and obs.can_close:
        return (moved(rec, "paused", f"closing: {obs.window_why}", now),
                Action("close-window", obs.window_why))
    if obs.window in ("failed", "damaged", "abandoned"):
        # Its stack did not pass the gate after the maintenance: never recreated without it.
        out = "" if obs.window == "abandoned" else "out of service: "
        return moved(rec, "paused", f"{out}{obs.window_why}; run the deploy or "
                     "`rigfleet-host.pyz maintenance close`", now), NOTHING
    if rec.state == "gave-up":
        return rec, NOTHING  # until a reset or a new stack: no loop
    st = obs.container
    served = st is not None and st.running and bool(rec.healthy_start) \
        and rec.healthy_start == st.started_at
    since = now if rec.unhealthy_since is None else rec.unhealthy_since
    rec = replace(rec, unhealthy_since=since if served and not obs.healthy else None)
    how = engine_death(rec, obs, p)
    if how is None:
        rec = replace(rec, dead_since=None, death="", boot_failure=None, next_attempt_at=None)
        if st is not None and obs.healthy:
            rec = replace(rec, healthy_start=st.started_at)
            if obs.route != ref.route_id:
                return (moved(rec, "watching", f"{ref.route_id} is up and answers", now),
                        Action("reroute", f"the front routes to {obs.route or 'nothing'}, not "
                               f"to {ref.route_id}, which is up and answers"))
            rec = moved(rec, "watching", f"{ref.route_id} serves", now)
            if (cut := rec.unnoted()) is not None:
                return rec, Action("record", cut.reason)
            if not ref.image_id and st.image_id and st.config_hash == ref.config_hash:
                # A record from before image ids: what it serves on now is what recreations run.
                return rec, Action("record-image", f"{ref.route_id}: its verified image id "
                                   "is not recorded yet")
            return rec, NOTHING
        if served:
            return moved(rec, "watching", f"{ref.route_id}: {obs.health} since "
                          f"{now_iso(rec.unhealthy_since or now)}", now), NOTHING
        detail = obs.health or "not ready"
        return moved(rec, "booting", f"{ref.container} is starting ({detail})", now), NOTHING
    boot = classify_boot_failure(obs.log, ref.boot_failures) if obs.log.strip() else None
    death = how if boot is None else (f"{how}; the last error in its log: {boot.line}"
                                      if boot.kind == "unknown" else f"{how}: {boot}")
    dead_since = now if rec.dead_since is None else rec.dead_since
    rec = replace(rec, dead_since=dead_since, death=death,
                  boot_failure=asdict(boot) if boot else None)
    recent = rec.recent(now, p.window_s)
    if len(recent) >= p.limit:
        first = min((a.at for a in recent), default=now)
        reason = (f"crash loop: {ref.stack} died again ({death}); gave up after {len(recent)} "
                  f"recreations in {max(1, math.ceil((now - first) / 60))} min; run the deploy "
                  "or fix the stack")
        return (moved(rec, "gave-up", reason, now, gave_up_at=now, next_attempt_at=None),
                Action("give-up", reason))
    due = dead_since + p.backoff(len(recent))
    which = f"recreation {len(recent) + 1} of {p.limit}"
    rec = replace(rec, next_attempt_at=due)
    if now >= due:
        return moved(rec, "recreating", f"{ref.stack}'s engine died ({death}); {which}",
                      now), Action("recreate", death)
    waiting = moved(rec, "backoff", f"{ref.stack}'s engine died ({death}); {which} at "
                     f"{now_iso(due)}", now)
    if obs.route != MAINTENANCE:
        return waiting, Action("open-window", f"{ref.stack}'s engine died; {which} in "
                               f"{due - now:.0f} s")
    return waiting, NOTHING


def status_line(data: dict[str, Any] | None) -> str:
    """One line about the supervisor (``rigfleet-host.pyz status``), from ``read_supervisor``."""
    if data is None:
        return "never ran on this host"
    if data.get("error"):
        return f"unreadable: {data['error']}"
    policy = data.get("policy") or {}
    line = (f"{data.get('state')}: {data.get('reason')} ({data.get('recreations', 0)} of "
            f"{policy.get('limit', '?')} recreations within {policy.get('window_s', '?')} s)")
    return line + ("" if data.get("alive") else " [not running]")

