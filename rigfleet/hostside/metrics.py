"""The host's metrics as node-exporter textfiles (docs/monitoring.md): the cards
(``rigfleet-gpu.prom``) and rigfleet's facts (``rigfleet.prom``), every 15 s and after a swap::

    text = gpu_textfile(csv_output)        # csv_output None: nvidia-smi failed
    text = facts_textfile(read_facts(lay, front_port=8000))
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from . import stackctl
from .atomic import write_atomic
from .front import READY_PATH
from .layout import STACK_LABEL, SUPERVISE_UNIT, Layout
from .maintenance import window_status
from .plan import RETRY_AFTER_S, Plan, PlanError
from .records import (
    SOURCE_GATE,
    ThroughputRecord,
    ledger_tail,
    read_holder,
    read_json,
    read_state,
    read_supervisor,
)
from .steps import read_timings, window_estimate

GPU_FILE = "rigfleet-gpu.prom"
FACTS_FILE = "rigfleet.prom"
# The node exporter's textfile collector directory on Debian and Ubuntu (the package's own).
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"

# Throttle reasons: the contract's label -> nvidia-smi's field (clocks_event_reasons.*).
THROTTLE = {"sw_power_cap": "sw_power_cap", "hw_slowdown": "hw_slowdown",
            "sw_thermal": "sw_thermal_slowdown", "hw_thermal": "hw_thermal_slowdown",
            "hw_power_brake": "hw_power_brake_slowdown"}
# (metric, nvidia-smi --query-gpu field, factor, help); None metric: read for labels only.
GPU_FIELDS: tuple[tuple[str | None, str, float, str], ...] = (
    (None, "index", 1, ""),
    (None, "uuid", 1, ""),
    ("rigfleet_gpu_power_watts", "power.draw", 1, "Power draw (W)."),
    ("rigfleet_gpu_power_limit_watts", "enforced.power.limit", 1, "Enforced power limit (W)."),
    ("rigfleet_gpu_temperature_celsius", "temperature.gpu", 1, "GPU core temperature (C)."),
    ("rigfleet_gpu_sm_clock_mhz", "clocks.current.sm", 1, "Current SM clock (MHz)."),
    ("rigfleet_gpu_memory_used_bytes", "memory.used", 1024 * 1024, "Memory used (bytes)."),
    ("rigfleet_gpu_memory_total_bytes", "memory.total", 1024 * 1024, "Memory total (bytes)."),
    ("rigfleet_gpu_utilization_ratio", "utilization.gpu", 0.01, "GPU utilisation (0-1)."),
    *((None, f"clocks_event_reasons.{f}", 1, "") for f in THROTTLE.values()),
    *((None, f"pcie.link.{k}.{s}", 1, "") for k in ("gen", "width") for s in ("current", "max")),
)
GPU_QUERY = ",".join(f for _, f, _, _ in GPU_FIELDS)
# ECC apart: a card without it answers [N/A], and a driver that does not know the field
# refuses the whole query; the figures above must not depend on it.
ECC_QUERY = "index,ecc.errors.uncorrected.volatile.total"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@dataclass
class Textfile:
    """Samples grouped per metric, each with its HELP and TYPE (``*_total``: a counter)."""

    metrics: dict[str, tuple[str, str, list[str]]] = field(default_factory=dict)

    def add(self, name: str, help_: str, value: float, **labels: str) -> None:
        kind = "counter" if name.endswith("_total") else "gauge"
        entry = self.metrics.setdefault(name, (help_, kind, []))
        lab = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
        number = str(int(value)) if float(value).is_integer() else repr(float(value))
        entry[2].append(f"{name}{{{lab}}} {number}" if lab else f"{name} {number}")

    def render(self) -> str:
        out: list[str] = []
        for name, (help_, kind, samples) in self.metrics.items():
            out += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", *samples]
        return "\n".join(out) + "\n"


def _number(text: str) -> float | None:
    """A csv cell as a number; None for [N/A], [Not Supported] and the like."""
    try:
        return float(text.strip())
    except ValueError:
        return None


def gpu_textfile(csv_text: str | None, ecc_text: str | None = None) -> str:
    """``rigfleet-gpu.prom`` from ``nvidia-smi``'s csv answers to ``GPU_QUERY`` (None: it
    failed; only ``rigfleet_gpu_scrape_ok 0``) and ``ECC_QUERY`` (None: no ECC figures)."""
    t = Textfile()
    rows = (row.partition(",") for row in (ecc_text or "").splitlines())
    ecc = {i.strip(): value for i, _, count in rows if (value := _number(count)) is not None}
    parsed = [[c.strip() for c in r.split(",")] for r in (csv_text or "").splitlines() if r.strip()]
    ok = csv_text is not None and all(len(p) == len(GPU_FIELDS) for p in parsed)
    for cells in parsed if ok else ():
        by = {f: c for (_, f, _, _), c in zip(GPU_FIELDS, cells, strict=True)}
        labels = {"gpu": by["index"], "uuid": by["uuid"]}
        for metric, name, factor, help_ in GPU_FIELDS:
            value = _number(by[name])
            if metric and value is not None:
                t.add(metric, help_, value * factor, **labels)
        if by["index"] in ecc:
            t.add("rigfleet_gpu_ecc_errors_total", "Uncorrected ECC errors since the driver "
                  "loaded (only cards that report ECC).", ecc[by["index"]], **labels)
        for reason, name in THROTTLE.items():
            state = by[f"clocks_event_reasons.{name}"]
            if state in ("Active", "Not Active"):
                t.add("rigfleet_gpu_throttle", "Clock event reason active (1) or not (0).",
                      1 if state == "Active" else 0, reason=reason, **labels)
        for kind in ("gen", "width"):
            for s in ("current", "max"):
                if (value := _number(by[f"pcie.link.{kind}.{s}"])) is not None:
                    t.add(f"rigfleet_gpu_pcie_link_{kind}", f"PCIe link {kind}.", value,
                          state=s, **labels)
    t.add("rigfleet_gpu_scrape_ok", "1 when nvidia-smi answered, else 0.", 1 if ok else 0)
    return t.render()


def _stdout(argv: list[str]) -> str | None:
    """What ``argv`` prints, None when it fails (no binary, a hang, an error)."""
    rc, out, _ = stackctl.run(argv, 10)
    return out if rc == 0 else None


def read_gpus(query: str = GPU_QUERY) -> str | None:
    """nvidia-smi's csv answer to ``query``, None when it fails (no driver, a hung card)."""
    return _stdout(stackctl.smi_command(query))


def fact(metric: str, help_: str, default: Any = MISSING) -> Any:
    """A field of ``Facts`` and the metric ``rigfleet.prom`` writes it as (None: no sample)."""
    return field(default=default, metadata={"metric": metric, "help": help_})


@dataclass(frozen=True)
class GateFacts:
    """The last gate's figures (their samples are labelled with its stack)."""

    stack: str
    tokens_per_s: float | None = fact("rigfleet_gate_tokens_per_second",
                                      "The last gate's decode tok/s (narrative).")
    baseline_tokens_per_s: float | None = fact(
        "rigfleet_gate_baseline_tokens_per_second",
        "The baseline the last gate was judged against (tok/s).")
    margin: float | None = fact("rigfleet_gate_margin_ratio",
                                "The stack's allowed shortfall below the baseline.")
    passed: bool = fact("rigfleet_gate_passed",
                        "The last gate's throughput verdict: passed (1) or not (0).")
    at: float | None = fact("rigfleet_gate_timestamp_seconds", "When the last gate ran (epoch s).")
    acceptance_floor: float | None = fact("rigfleet_mtp_acceptance_floor",
                                          "The stack's lowest MTP acceptance floor.")


@dataclass(frozen=True)
class Facts:
    """What ``rigfleet.prom`` says, in its order (``gate``'s figures where it stands)."""

    serving: dict[str, str] | None = None
    ready: bool = fact("rigfleet_ready", "The front's readiness path answers 200 (1) or not (0).",
                       False)
    engine_up: bool = fact("rigfleet_engine_up", "The serving stack's engine container runs (1) "
                           "or not (0), busy or not.", False)
    swap_in_progress: bool = fact("rigfleet_swap_in_progress",
                                  "A swap transaction holds the host (1) or not (0).", False)
    swap_expected_s: float | None = fact("rigfleet_swap_expected_seconds",
                                         "The running swap's expected duration (s).", None)
    window_open: bool = fact("rigfleet_maintenance_window_open",
                             "A maintenance window is open (1) or not (0).", False)
    window_opened_at: float | None = fact("rigfleet_maintenance_window_opened_timestamp_seconds",
                                          "When the open maintenance window opened (epoch s).",
                                          None)
    gate: GateFacts | None = None
    recreations: int = fact("rigfleet_supervisor_recreations_total",
                            "Engines the supervisor recreated (ledger).", 0)
    gave_up: bool = fact("rigfleet_supervisor_gave_up", "The supervisor gave up (1) or not (0).",
                         False)
    drain_s: float | None = fact("rigfleet_drain_seconds", "The last drain's duration (s).", None)
    now: float = fact("rigfleet_facts_timestamp_seconds",
                      "When these facts were written (epoch s).", 0.0)


def _gate_limits(report: str | None) -> tuple[float | None, float | None]:
    """(margin, lowest acceptance floor) of the throughput check in a gate report."""
    for check in (read_state(Path(report)) if report else {}).get("checks") or ():
        limits = (check.get("details") or {}).get("limits") if isinstance(check, dict) else None
        if isinstance(limits, dict):
            floors = [f for f in limits.get("acceptance_floor") or () if isinstance(f, int | float)]
            margin = limits.get("margin")
            return (float(margin) if isinstance(margin, int | float) else None,
                    float(min(floors)) if floors else None)
    return None, None


def engine_running(stack: str) -> bool:
    """Is a container of ``stack`` running (busy or not)? One ``docker ps``."""
    fmt = f'{{{{.Label "{STACK_LABEL}"}}}}\t{{{{.State}}}}'
    out = _stdout(["docker", "ps", "--filter", f"label={STACK_LABEL}={stack}", "--format", fmt])
    return any(line.split("\t") == [stack, "running"] for line in (out or "").splitlines())


def front_ready(port: int | None) -> bool:
    url = f"http://127.0.0.1:{port}{READY_PATH}"
    return port is not None and stackctl.http_request("GET", url, {}, None, 3)[0] == 200


def is_swap(holder: dict[str, object] | None) -> bool:
    """Does a live lock holder take the engine down on purpose (a swap, ``ensure``, ``adopt``,
    ``record``)? Not a maintenance window (its own metric) and not the supervisor: it holds the
    lock to recreate an engine that died, which is the outage "engine down" is about."""
    return bool(holder and holder.get("alive") and not holder.get("window")
                and holder.get("who") != SUPERVISE_UNIT)


def _swap_plan(lay: Layout, holder: dict[str, Any] | None) -> Plan | None:
    """The plan of the transaction that holds the lock; None for none (``ensure``, ``record``)."""
    deploy_id = (holder or {}).get("deploy_id")
    try:
        return Plan.load(lay.plan_file(deploy_id)) if isinstance(deploy_id, str) \
            and deploy_id else None
    except PlanError:
        return None


def read_facts(lay: Layout, front_port: int | None, now: float | None = None) -> Facts:
    """The host's facts from its records, its engine container and its front."""
    now = time.time() if now is None else now
    state = read_state(lay.state_file)
    stack = state.get("stack") if isinstance(state.get("stack"), str) else None
    serving = None if not stack else {
        "stack": stack, "image_digest": str(state.get("digest") or ""),
        "model_revision": str(state.get("model_revision") or ""),
        "genesis_commit": str(state.get("genesis_commit") or "")}
    # The engine and the front before the lock: a swap takes the lock before it stops the
    # engine, so an engine seen down is seen with its swap (read the other way, a run begun
    # just before a swap could write "down, no swap" and fire the engine-down alert).
    engine_up = bool(stack) and engine_running(str(stack))
    ready = front_ready(front_port)
    holder = read_holder(lay.lock_dir)
    swapping = is_swap(holder)
    times = read_timings(lay)
    # A swap's window is its desired stack's, as its own Retry-After said (its plan).
    plan = _swap_plan(lay, holder) if swapping else None
    target = plan.desired.stack if plan else stack
    expected = (float(window_estimate(times, target, True, plan.retry_after_s if plan
                                      else RETRY_AFTER_S).seconds)
                if swapping and target else None)
    window, status, _ = window_status(lay)
    window_open = status in ("held", "abandoned")
    supervisor = read_supervisor(lay.supervise_state, now) or {}
    last = ThroughputRecord.from_dict(read_json(lay.throughput_last)[0])
    gate = None
    if last is not None and last.source == SOURCE_GATE:
        margin, floor = _gate_limits(last.report)
        base = last.baseline.get("narrative")
        gate = GateFacts(stack=last.stack, tokens_per_s=last.decode("narrative"),
                         baseline_tokens_per_s=float(base) if isinstance(base, int | float)
                         else None, margin=margin, acceptance_floor=floor,
                         passed=last.result == "pass", at=stackctl.docker_time(last.at))
    # The supervisor's recreations in the whole ledger (a counter: it only grows).
    ledger, _, _ = ledger_tail(lay.ledger_file, 10**9)
    recreations = sum((line.get("event"), line.get("result")) == ("supervise", "recreated")
                      for line in ledger)
    return Facts(now=now, serving=serving, ready=ready, engine_up=engine_up,
                 swap_in_progress=swapping, swap_expected_s=expected, window_open=window_open,
                 window_opened_at=window.opened_at if window and window_open else None,
                 gate=gate, recreations=recreations,
                 gave_up=supervisor.get("state") == "gave-up", drain_s=times.drain_s)


def facts_textfile(f: Facts) -> str:
    """``rigfleet.prom``."""
    t = Textfile()
    if f.serving is not None:
        t.add("rigfleet_serving_info", "What serves on this host (labels), always 1.", 1,
              **f.serving)
    _add_facts(t, f, {})
    return t.render()


def _add_facts(t: Textfile, source: Facts | GateFacts, labels: dict[str, str]) -> None:
    """``source``'s figures that have a value, in field order (the gate's where it stands)."""
    for f in fields(source):
        value = getattr(source, f.name)
        if isinstance(value, GateFacts):
            _add_facts(t, value, {"stack": value.stack})
        elif "metric" in f.metadata and value is not None:
            t.add(f.metadata["metric"], f.metadata["help"], value, **labels)


def run(lay: Layout, directory: Path, front_port: int | None) -> int:
    """``rigfleet-host metrics``: both textfiles, now."""
    gpus = read_gpus()
    ecc = read_gpus(ECC_QUERY) if gpus is not None else None
    for name, text in [(GPU_FILE, gpu_textfile(gpus, ecc)),
                       (FACTS_FILE, facts_textfile(read_facts(lay, front_port)))]:
        write_atomic(directory / name, text, 0o644)  # world-readable: no secret in them
    return 0


def refresh(lay: Layout, front_port: int | None) -> None:
    """Both textfiles now, after a swap, where the node exporter's directory is; never raises."""
    directory = lay.root / TEXTFILE_DIR.lstrip("/")
    if not directory.is_dir():
        return
    with contextlib.suppress(OSError, ValueError):
        run(lay, directory, front_port)
