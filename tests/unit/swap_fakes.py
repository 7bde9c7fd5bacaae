"""Fakes for the swap transaction's tests: a host (docker, nvidia-smi, HTTP), a front, a gate.

``FakeHost`` keeps a fake clock: ``sleep`` advances it, so a two-minute wait runs in
microseconds and tests can assert *when* things happened (fail fast, VRAM settled). Stacks
behave as ``FakeHost.behaviour[stack]`` says: ``ok`` (ready after ``boot_s``), ``die`` (exit
with ``log`` after ``die_after_s``), ``restart-loop`` (Docker restarts it), ``hang`` (never
ready). A serving stack can crash (``crash``: its container exits) or lose its engine while
the API server keeps running (``engine_dies``: ``/health`` answers 503, as vLLM does on
EngineDeadError). ``wall()`` is the same clock in epoch seconds (docker's ``StartedAt``).
Example::

    host = FakeHost()
    host.behaviour["tq3-mtp-genesis"] = ("die", BOOT_LOG)
    t = Transaction(plan, lay, host, FakeFront(), FakeGate(), journal)
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from rigfleet.hostside.active import write_active
from rigfleet.hostside.gate import GateResult, GateRun
from rigfleet.hostside.journal import Journal
from rigfleet.hostside.layout import Layout
from rigfleet.hostside.ledger import TRACKED_KEYS
from rigfleet.hostside.plan import Active, Plan, StackRef
from rigfleet.hostside.stackctl import ContainerState, GpuMemory

TOTAL_MIB = 24576
PORTS = {"int8": 8011, "tq3-mtp-genesis": 8015}
UTIL = {"int8": 0.92, "tq3-mtp-genesis": 0.85}


def compose_text(stack: str, config_hash: str) -> str:
    """A compose file as rigfleet/compose.py writes it (the parts the host side reads)."""
    return (
        "# Managed by rigfleet\n"
        f"name: rigfleet-{stack}\n"
        "services:\n"
        "  vllm:\n"
        f"    image: vllm/vllm-openai:nightly-{config_hash}@sha256:{'a' * 64}\n"
        f"    container_name: rigfleet-{stack}\n"
        "    labels:\n"
        f"      io.rigfleet.stack: {stack}\n"
        f"      io.rigfleet.config-hash: {config_hash}\n"
    )


def make_ref(lay: Layout, stack: str, config_hash: str, write: bool = True) -> StackRef:
    """A stack rendered into ``<root>/opt/rigfleet/stacks/<stack>/compose.yaml``."""
    path = lay.root / "opt/rigfleet/stacks" / stack / "compose.yaml"
    if write:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(compose_text(stack, config_hash))
    record = {k: None for k in TRACKED_KEYS}
    record.update(stack=stack, image=f"vllm/vllm-openai:nightly-{config_hash}",
                  digest=f"sha256:{config_hash * 4}", pins_serial=1)
    return StackRef(stack=stack, project=f"rigfleet-{stack}", container=f"rigfleet-{stack}",
                    port=PORTS[stack], compose_file=str(path), config_hash=config_hash,
                    image_ref=f"vllm/vllm-openai:nightly-{config_hash}@sha256:{'a' * 64}",
                    served_model_name="qwen3.6-27b-autoround",
                    gpu_memory_utilization=UTIL[stack], record=record)


def make_active(lay: Layout, ref: StackRef) -> StackRef:
    """Record ``ref`` as the active (verified) stack; returns its snapshot ref."""
    return write_active(lay, Active(ref, "2026-11-29T10:00:00+00:00", "old-deploy",
                                    "alice@ctl", {"result": "pass"}),
                        compose_text(ref.stack, ref.config_hash)).ref


def serving(lay: Layout, stack: str = "int8",
            config_hash: str = "1111aaaa2222bbbb") -> tuple[FakeHost, FakeFront, StackRef]:
    """``stack`` verified, running since t=0 and routed on a fake host; the clock at t=10."""
    host, front = FakeHost(), FakeFront()
    ref = make_active(lay, make_ref(lay, stack, config_hash))
    host.up(ref.compose_file, ref.project)
    host.t += 10
    front.serve(ref)
    host.calls.clear()
    return host, front, ref


def make_plan(lay: Layout, desired: StackRef, plan_id: str = "20261129T100000Z-abcdef",
              **kw) -> Plan:
    plan = Plan(id=plan_id, by="alice@ctl", why="swap for a test", host="host1",
                desired=desired, projects=(
                    ("rigfleet-int8", str(lay.root / "opt/rigfleet/stacks/int8/compose.yaml")),
                    ("rigfleet-tq3-mtp-genesis",
                     str(lay.root / "opt/rigfleet/stacks/tq3-mtp-genesis/compose.yaml"))),
                ready_timeout_s=kw.pop("ready_timeout_s", 120.0),
                vram_timeout_s=kw.pop("vram_timeout_s", 30.0), **kw)
    lay.swap_dir(plan.id).mkdir(parents=True, exist_ok=True)
    (lay.swap_dir(plan.id) / "plan.json").write_text(plan.dumps())
    return plan


@dataclass
class _Running:
    stack: str
    config_hash: str
    started: float
    state: ContainerState
    stray: bool = False  # started by hand (docker run): no compose project removes it


@dataclass
class FakeHost:
    """docker + nvidia-smi + HTTP of one host, on a fake clock (see the module docstring)."""

    t: float = 0.0
    boot_s: float = 3.0
    release_s: float = 1.0  # memory freed this long after a container goes down
    die_after_s: float = 2.0
    images: set[str] | None = None  # None: every image is present
    behaviour: dict[str, tuple[str, str]] = field(default_factory=dict)
    containers: dict[str, _Running] = field(default_factory=dict)
    freed_at: float = -1.0  # when the last stopped stack's memory is released
    never_release: bool = False
    driver_down: bool = False  # nvidia-smi cannot talk to the driver (no module loaded)
    docker_answers: bool = True  # False: the daemon restarts
    stack_unit: str = "done"  # how rigfleet-stack.service stands (parse_unit_state)
    calls: list[str] = field(default_factory=list)
    logs_of: dict[str, str] = field(default_factory=dict)
    created: dict[str, str] = field(default_factory=dict)
    epoch: float = 1_795_000_000.0  # wall() at t == 0
    dead_engines: set[str] = field(default_factory=set)
    on_up: object = None  # callable(project) before a container is created (a kill, ...)
    # Requests the engine holds: container -> [(start, end)] on the fake clock; /metrics shows
    # them (max_seqs running, the rest waiting), the front's old workers hold them too.
    requests: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    max_seqs: int = 2
    front_readable: bool = True
    metrics_served: bool = True
    stale_running: int = 0  # gauges stuck after aborted requests (vllm#29928)
    cut: list[str] = field(default_factory=list)  # "<container> t=<t>" per request cut
    # Local image names moved by ``docker tag`` (name -> image id); every other name's id is
    # derived from the name (without its digest).
    tags: dict[str, str] = field(default_factory=dict)

    # -- docker ---------------------------------------------------------------------------
    def image_present(self, ref: str) -> bool:
        return self.images is None or ref in self.images

    def image_id(self, ref: str) -> str | None:
        if ref.startswith("sha256:"):
            return ref if self.image_present(ref) else None
        name = ref.split("@", 1)[0]
        if name in self.tags:
            return self.tags[name]
        return "sha256:" + hashlib.sha256(name.encode()).hexdigest() \
            if self.image_present(ref) else None

    def tag(self, image: str, name: str) -> str | None:
        self.calls.append(f"tag {image} {name}")
        found = self.image_id(image)
        if found is None:
            return f"Error response from daemon: No such image: {image}"
        self.tags[name] = found
        return None

    def remove(self, name: str) -> str | None:
        self.calls.append(f"rm {name} t={self.t:g}")
        self.containers.pop(name, None)
        self.freed_at = self.t + self.release_s
        return None

    def compose_check(self, file: str, project: str) -> str | None:
        return None if Path(file).exists() else f"{file}: no such file"

    def up(self, file: str, project: str) -> str | None:
        text = Path(file).read_text()
        stack = re.search(r"io\.rigfleet\.stack: (\S+)", text).group(1)
        config_hash = re.search(r"io\.rigfleet\.config-hash: (\S+)", text).group(1)
        name = re.search(r"container_name: (\S+)", text).group(1)
        self.calls.append(f"up {project} {config_hash} t={self.t:g}")
        if callable(self.on_up):
            self.on_up(project)
        self.dead_engines.discard(name)
        self.logs_of[name] = f"INFO booting {stack}\n"  # a new container: a new log
        kind, log = self.behaviour.get(stack, ("ok", ""))
        if kind == "ok":
            self.logs_of[name] += log  # what a healthy boot prints
        if self._memory_used():
            # What vLLM does when the cards are still busy: dies at start.
            busy = ("ValueError: Free memory on device cuda:0 (1.00/24.00 GiB) on startup is "
                    "less than desired GPU memory utilization (0.92, 22.08 GiB).")
            self.logs_of[name] += busy
            self.behaviour[stack] = ("die", busy)
        image = re.search(r"image: (\S+)", text)
        self.containers[name] = _Running(stack, config_hash, self.t,
                                         ContainerState("running", config_hash=config_hash,
                                                        created="2026-11-29T10:00:00Z",
                                                        started_at=self.iso(self.wall()),
                                                        image_id=(self.image_id(image.group(1))
                                                                  or "") if image else ""))
        return None

    def down(self, file: str, project: str) -> str | None:
        self.calls.append(f"down {project} t={self.t:g}")
        name = project  # container names equal project names in rigfleet
        if name in self.containers:
            self.cut += [f"{name} t={self.t:g}" for _ in self._in_flight(name)]
            self.requests.pop(name, None)
        if name in self.containers and not self.containers[name].stray:
            del self.containers[name]
            self.freed_at = self.t + self.release_s
        return None

    def _current(self, name: str) -> _Running | None:
        run = self.containers.get(name)
        if run is None:
            return None
        kind, log = self.behaviour.get(run.stack, ("ok", ""))
        if kind in ("die", "restart-loop") and self.t - run.started >= self.die_after_s \
                and run.state.status == "running" and not run.state.restarts:
            self.logs_of[name] = self.logs_of.get(name, "") + log
            run.state = (replace(run.state, status="exited", exit_code=1) if kind == "die"
                         else replace(run.state, restarts=1))
        return run

    def container(self, name: str) -> ContainerState | None:
        run = self._current(name)
        if run is None:
            return None
        return replace(run.state, created=self.created.get(name, run.state.created))

    def logs(self, name: str, tail: int = 300) -> str:
        return self.logs_of.get(name, "") if name in self.containers else \
            f"Error response from daemon: No such container: {name}"

    def running(self) -> list[str]:
        return sorted(self.containers)

    # -- nvidia-smi -----------------------------------------------------------------------
    def _memory_used(self) -> bool:
        return bool(self.containers) or self.never_release or self.t < self.freed_at

    def gpus(self) -> list[GpuMemory]:
        self.calls.append(f"gpus t={self.t:g}")
        if self.driver_down:
            raise ValueError("nvidia-smi failed (exit 9): NVIDIA-SMI has failed because it "
                             "couldn't communicate with the NVIDIA driver")
        used = 22611 if self._memory_used() else 1
        return [GpuMemory(0, used, TOTAL_MIB), GpuMemory(1, used, TOTAL_MIB)]

    # -- HTTP -----------------------------------------------------------------------------
    def health(self, port: int, served: str) -> tuple[bool, str]:
        for name, run in self.containers.items():
            if PORTS[run.stack] != port:
                continue
            kind, _ = self.behaviour.get(run.stack, ("ok", ""))
            current = self._current(name)
            if current and current.state.running and name in self.dead_engines:
                return False, "/health 503"
            if kind == "ok" and current and current.state.running \
                    and self.t - run.started >= self.boot_s:
                return True, "ready"
            return False, "/health no answer"
        return False, "/health no answer"

    def chat(self, port: int, served: str) -> tuple[bool, str]:
        return self.health(port, served)

    def hold(self, name: str, *seconds: float) -> None:
        """Requests on ``name`` from now, each lasting ``seconds`` (streams, long answers)."""
        self.requests.setdefault(name, []).extend((self.t, self.t + s) for s in seconds)

    def _in_flight(self, name: str) -> list[tuple[float, float]]:
        return [(a, b) for a, b in self.requests.get(name, []) if b > self.t]

    def metrics(self, port: int) -> str | None:
        for name, run in self.containers.items():
            if PORTS[run.stack] != port or not self.metrics_served:
                continue
            if not run.state.running or name in self.dead_engines:
                return None
            busy = len(self._in_flight(name))
            running = min(busy, self.max_seqs) or self.stale_running
            tokens = sum(40 * (min(self.t, b) - a) for a, b in self.requests.get(name, []))
            return ("# TYPE vllm:num_requests_running gauge\n"
                    f'vllm:num_requests_running{{model_name="m",engine="0"}} {float(running)}\n'
                    f'vllm:num_requests_waiting{{model_name="m",engine="0"}} '
                    f"{float(max(0, busy - self.max_seqs))}\n"
                    f'vllm:generation_tokens_total{{model_name="m",engine="0"}} {tokens}\n')
        return None

    def front_draining(self) -> int | None:
        """The front's old worker holds what is in flight (one worker for all of it)."""
        if not self.front_readable:
            return None
        return 1 if any(self._in_flight(n) for n in self.containers) else 0

    # -- clock ----------------------------------------------------------------------------
    def sleep(self, seconds: float) -> None:
        self.t += seconds

    def monotonic(self) -> float:
        return self.t

    def docker_up(self) -> bool:
        return self.docker_answers

    def unit(self, name: str) -> str:
        return self.stack_unit

    def wall(self) -> float:
        """The fake clock in epoch seconds."""
        return self.epoch + self.t

    @staticmethod
    def iso(t: float) -> str:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    # -- what goes wrong while it serves ------------------------------------------------------
    def crash(self, name: str, log: str, exit_code: int = 1, oom_killed: bool = False) -> None:
        """The engine dies and takes its container with it (vLLM's API server exits)."""
        run = self.containers[name]
        run.state = replace(run.state, status="exited", exit_code=exit_code,
                            oom_killed=oom_killed)
        self.logs_of[name] = self.logs_of.get(name, "") + log
        self.calls.append(f"crash {name} t={self.t:g}")

    def engine_dies(self, name: str) -> None:
        """The engine core dies; the API server keeps running and ``/health`` answers 503."""
        self.dead_engines.add(name)

    def start_by_hand(self, name: str, stack: str) -> None:
        """``docker run --name <name>`` of some image: no labels, holds the cards."""
        self.containers[name] = _Running(stack, "", self.t, ContainerState("running"),
                                         stray=True)

    def running_now(self) -> dict[str, str]:
        """container -> config hash of the live ones."""
        return {n: r.config_hash for n, r in self.containers.items()
                if self._current(n) and self._current(n).state.status == "running"}


@dataclass
class FakeFront:
    routes: list[str] = field(default_factory=list)
    fail_on: str | None = None
    messages: list[str] = field(default_factory=list)  # the 503 messages, in order
    retry_after: list[int] = field(default_factory=list)  # their Retry-After, in order

    def serve(self, ref: StackRef, wait: bool = True) -> None:
        self._set(ref.route_id)

    def maintenance(self, message: str, retry_after_s: int, wait: bool = True) -> None:
        self._set("maintenance")
        self.messages.append(message)
        self.retry_after.append(retry_after_s)

    def _set(self, route: str) -> None:
        from rigfleet.hostside.front import FrontError

        if self.fail_on is not None and route.startswith(self.fail_on):
            raise FrontError(f"nginx -t refused route {route}")
        self.routes.append(route)

    def current(self) -> str | None:
        return self.routes[-1] if self.routes else None


@dataclass
class FakeGate:
    """Writes a report like the real gate and fails the named checks."""

    failed: tuple[str, ...] = ()
    result: str | None = None  # "error" to simulate a broken gate
    runs: list[GateRun] = field(default_factory=list)
    on_run: object = None  # callable(run) for side effects (e.g. a stop request)

    def __call__(self, run: GateRun, on_line, should_stop) -> GateResult:
        self.runs.append(run)
        if callable(self.on_run):
            self.on_run(run)
        if should_stop():
            return GateResult("error", profile=run.profile, exit_status=-15, seconds=0.0,
                              summary="the gate stopped (the transaction was interrupted)")
        if self.result == "error":
            return GateResult("error", profile=run.profile, exit_status=101, seconds=0.0,
                              summary="the gate exited with 101")
        run.report_dir.mkdir(parents=True, exist_ok=True)
        report = run.report_dir / f"verify-{len(self.runs)}.json"
        checks = [{"name": n, "status": "fail" if n in self.failed else "pass",
                   "summary": "recall_miss" if n in self.failed else "ok"}
                  for n in ("preflight", "needles", "needles_deep", "soak")]
        report.write_text(json.dumps({"schema": "rigfleet-verify/1", "checks": checks}))
        report.with_suffix(".md").write_text("# verify-stress gate\n")
        on_line("[ 1/4] preflight: PASS")
        status = len(self.failed)
        return GateResult("pass" if not status else "fail", tuple(self.failed), str(report),
                          str(report.with_suffix(".md")), "2026-11-29T10:00Z", run.profile,
                          f"{4 - status} passed, {status} failed", 1.0, exit_status=status)


def journal(lay: Layout, plan: Plan) -> Journal:
    return Journal(lay.swap_dir(plan.id), echo=None)


def ledger_lines(lay: Layout) -> list[dict]:
    try:
        return [json.loads(line) for line in lay.ledger_file.read_text().splitlines()]
    except FileNotFoundError:
        return []


def gone_pid() -> int:
    """A pid that existed a moment ago and is gone now."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(proc.stdout)
