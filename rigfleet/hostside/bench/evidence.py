"""What the doctor reads on a host: the cards under a short load (the PCIe link trains up only
under load), the engine's log and args. Stdlib, run by the probe; nothing here judges::

    ev = gather(container, port, api_key, load_s=15)
    ev["gpu"]["idle"], ev["gpu"]["load"], ev["engine"]["graph_mode"], ev["load"]["decode_mean"]
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from .. import stackctl
from ..verify.client import Client
from .measure import NARRATIVE, Bench, BenchSettings, ShapeResult

# What nvidia-smi is asked for (``--query-gpu``, CSV without header or units).
GPU_FIELDS: tuple[str, ...] = (
    "index", "name", "pstate", "utilization.gpu", "power.draw", "power.limit",
    "power.default_limit", "power.max_limit", "clocks.sm", "clocks.mem", "clocks.max.sm",
    "clocks.max.mem", "clocks_event_reasons.active", "clocks_event_reasons.sw_power_cap",
    "clocks_event_reasons.hw_slowdown", "clocks_event_reasons.hw_thermal_slowdown",
    "clocks_event_reasons.sw_thermal_slowdown", "clocks_event_reasons.hw_power_brake_slowdown",
    "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.gen.gpumax",
    "pcie.link.width.current", "pcie.link.width.max", "temperature.gpu",
)  # fmt: skip
_INVALID_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')

# Engine log lines that say how it runs (vLLM's wording; seed 004 and the testbed print them).
_BACKEND = re.compile(r"Using ([A-Za-z0-9 ]+?) backend\.")
_DOWNGRADE = re.compile(r"CUDAGraphMode\.(\w+) is not supported with spec-decode .*?"
                        r"setting cudagraph_mode=(\w+)")
_CAPTURE = re.compile(r"Capturing CUDA graphs \(([^)]*)\)")
_CACHE_DIR = re.compile(r"Using cache directory: (\S+) for vLLM's torch\.compile")
_COLD = re.compile(r"Compiling a graph for dynamic shape takes ([\d.]+) s")
_HIT = re.compile(r"Directly load the compiled graph\(s\) for dynamic shape from the cache, "
                  r"took ([\d.]+) s")
_COMPILE_TOTAL = re.compile(r"torch\.compile takes ([\d.]+) s in total")
_WARNING_TOPICS = {
    "kv_cache": re.compile(r"kv[_ -]cache[_ -]dtype|kv cache dtype|fp8_e[45]m[23]|"
                           r"per_token_head|turboquant", re.IGNORECASE),
    "batched_tokens": re.compile(r"max[_-]num[_-]batched[_-]tokens", re.IGNORECASE),
}
LOG_TAIL = 5000

Runner = Callable[[list[str], float], tuple[int, str, str]]


def query_gpus(run: Runner = stackctl.run) -> dict[str, Any]:
    """One nvidia-smi sample: ``{"t", "fields", "rc", "stdout", "stderr"}``; a field the driver
    does not know is dropped (after trying older drivers' ``clocks_throttle_reasons``)."""
    wanted = list(GPU_FIELDS)
    for _ in GPU_FIELDS:
        rc, out, err = run(stackctl.smi_command(",".join(wanted)), 20)
        m = _INVALID_FIELD.search(out + err)
        if rc == 0 or m is None or m.group(1) not in wanted:
            return {"t": time.time(), "fields": wanted, "rc": rc, "stdout": out,
                    "stderr": err[-500:]}
        bad = m.group(1)
        alias = bad.replace("clocks_event_reasons.", "clocks_throttle_reasons.")
        if alias != bad and alias not in wanted:
            wanted = [alias if f == bad else f for f in wanted]
        else:
            wanted = [f for f in wanted if f != bad]
    return {"t": time.time(), "fields": wanted, "rc": 1, "stdout": "",
            "stderr": "no field left to query"}


def engine_facts(lines: Sequence[str]) -> dict[str, Any]:
    """How the engine's own log says it runs; each fact keeps its line as evidence."""
    out: dict[str, Any] = {"backend": None, "graph_mode": None, "downgrade": None,
                           "captures": [], "compile": [], "cache_dirs": [], "warnings": {}}
    for line in lines:
        if (m := _BACKEND.search(line)) and out["backend"] is None:
            out["backend"] = {"name": m.group(1), "line": line.strip()}
        if m := _DOWNGRADE.search(line):
            out["downgrade"] = {"requested": m.group(1), "mode": m.group(2), "line": line.strip()}
        for key, rx in (("captures", _CAPTURE), ("cache_dirs", _CACHE_DIR)):
            if m := rx.search(line):
                out[key].append(m.group(1))
        for kind, rx in (("cold", _COLD), ("hit", _HIT), ("total", _COMPILE_TOTAL)):
            if m := rx.search(line):
                out["compile"].append({"kind": kind, "seconds": float(m.group(1)),
                                       "line": line.strip()})
        if "WARNING" in line:
            for topic, rx in _WARNING_TOPICS.items():
                if rx.search(line):
                    out["warnings"].setdefault(topic, []).append(line.strip()[:400])
    labels = " ".join(out["captures"])
    out["graph_mode"] = (str(out["downgrade"]["mode"]) if out["downgrade"] else
                         "_AND_".join(m for m in ("FULL", "PIECEWISE") if m in labels) or None)
    return out


def container_facts(container: str, run: Runner = stackctl.run) -> dict[str, Any]:
    """The engine container's arguments, mounts and ``engine_facts`` of its log's tail."""
    out: dict[str, Any] = {"container": container}
    rc, so, se = run(["docker", "inspect", "--type", "container", "--format",
                      "{{json .Args}}\t{{json .Mounts}}", container], 30)
    if rc == 0 and "\t" in so:
        argv, _, mounts = so.strip().partition("\t")
        try:
            out["args"] = json.loads(argv) or []
            out["mounts"] = [{"source": m.get("Source"), "destination": m.get("Destination")}
                             for m in json.loads(mounts) or [] if isinstance(m, dict)]
        except ValueError:
            out["error"] = "docker inspect printed no JSON"
    else:
        out["error"] = (se or so).strip()[-300:] or f"docker inspect exited {rc}"
    rc, so, se = run(["docker", "logs", "--tail", str(LOG_TAIL), container], 60)
    lines = (so + "\n" + se).splitlines()
    out.update(engine=engine_facts(lines), log_lines=len(lines),
               enforce_eager="--enforce-eager" in (out.get("args") or []))
    return out


def load(client: Client, model: str, seconds: float,
         sample: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``{"gpu": {"idle", "load"}, "load"}``: narrative requests for about ``seconds`` (one at
    least), a GPU sample before and every second of it (four at least while it runs)."""
    interval_s = min(1.0, max(seconds / 4, 0.05))
    idle = sample()
    bench = Bench(client, BenchSettings(runs=1, warmup=0), model=model)
    results: list[ShapeResult] = []

    def work() -> None:
        deadline = time.monotonic() + seconds
        while not results or time.monotonic() < deadline:
            results.append(bench.shape(NARRATIVE))
            if results[-1].failed:
                break

    worker = threading.Thread(target=work, name="doctor-load", daemon=True)
    worker.start()
    samples = []
    # The first sample once the first request decodes (the link trains up under load).
    worker.join(interval_s)
    while worker.is_alive():
        samples.append(sample())
        worker.join(interval_s)
    runs = [r for s in results for r in s.runs]
    decode = [r.decode_tok_s for r in runs if r.decode_tok_s is not None]
    accepted = [s.acceptance for s in results if s.acceptance is not None]
    return {"gpu": {"idle": idle, "load": samples}, "load": {
        "seconds": seconds, "runs": [r.to_dict() for r in runs],
        "decode_mean": round(sum(decode) / len(decode), 3) if decode else None,
        "acceptance": accepted[-1].to_dict() if accepted else None,
        "acceptance_note": results[-1].acceptance_note if results else "no run"}}


def gather(container: str, port: int, api_key: str | None, load_s: float) -> dict[str, Any]:
    """The doctor's evidence for the stack ``container`` serving on 127.0.0.1:``port``."""
    client = Client(f"http://127.0.0.1:{port}", api_key)
    bench = Bench(client, BenchSettings(runs=0, warmup=0))
    out: dict[str, Any] = {"container": container, "port": port}
    if not bench.prepare():
        out.update(error=bench.result.error, gpu={"idle": query_gpus(), "load": []})
    else:
        out.update(load(client, bench.result.model, load_s, query_gpus))
        out["model"], out["version"] = bench.result.model, bench.result.version
    out.update(container_facts(container))
    return out
