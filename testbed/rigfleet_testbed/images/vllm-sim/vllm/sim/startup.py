"""Start-up work whose cost the throughput model knows: torch.compile and CUDA-graph capture.

Called by ``boot`` at the points real vLLM does this work (after the weights load, and after
the KV cache is sized). Log lines follow vLLM's (``backends.py``/``monitor.py`` for the
compile, ``gpu_model_runner.py`` and tqdm bars for graph capture); the CUDA-graph downgrade
warning is seed 004's, verbatim. The boot is compressed like the rest of it:
``SIM_BOOT_SECONDS`` stands for a warm boot of a real rig (~3.2 min, club-3090 5aa97a25), so
the work takes its logged seconds x SIM_BOOT_SECONDS / 192 (a cold compile of ~65 s adds ~1 s
to the default 3 s boot; nothing with ``SIM_BOOT_SECONDS=0``).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from vllm.sim import compilecache, graphmode, logs
from vllm.sim.args import ServeConfig
from vllm.sim.buildinfo import BuildInfo

Pause = Callable[[float], None]
DEFAULT_CAPTURE_SIZES = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 513, 16))
SECONDS_PER_GRAPH = 0.25
REAL_WARM_BOOT_SECONDS = 192.0  # club-3090 5aa97a25: cold ~6 min -> warm ~3.2 min


def plan_for(cfg: ServeConfig) -> graphmode.GraphPlan:
    """The backend and CUDA-graph mode of this configuration (boot and engine agree)."""
    return graphmode.graph_plan(cfg.kv_cache_dtype, cfg.mtp_tokens, cfg.enforce_eager,
                                cfg.non_default.get("compilation_config"))


def compile_key(cfg: ServeConfig, build: BuildInfo) -> str:
    nd = cfg.non_default
    return compilecache.cache_key({
        "vllm": build.version, "commit": build.commit, "model": cfg.model,
        "dtype": nd.get("dtype"), "quantization": nd.get("quantization"),
        "tp": cfg.tensor_parallel_size, "kv_cache_dtype": cfg.kv_cache_dtype,
        "speculative_config": cfg.speculative_config, "max_model_len": cfg.max_model_len,
        "max_num_batched_tokens": cfg.max_num_batched_tokens,
        "compilation_config": nd.get("compilation_config"),
    })


def compile_model(cfg: ServeConfig, build: BuildInfo, pause: Pause, scale: float,
                  rng: random.Random | None = None) -> list[compilecache.CompileUnit]:
    """Log the backend, then torch.compile each module: a cold compile or a cache load."""
    rng = rng or random.Random()
    plan = plan_for(cfg)
    if plan.backend in graphmode.BACKEND_LOG:
        logs.info("cuda.py:368", graphmode.BACKEND_LOG[plan.backend])
    if cfg.enforce_eager:
        return []  # eager mode: no torch.compile, no graphs
    key = compile_key(cfg, build)
    units = compilecache.plan_compile(key, compilecache.cache_root(), bool(cfg.mtp_tokens),
                                      cfg.tensor_parallel_size)
    for unit in [u for u in units if u.rank == 0]:
        dynamo, work = (s * rng.uniform(0.97, 1.03) for s in unit.seconds)
        logs.info("backends.py:548", f"Using cache directory: {unit.path} for vLLM's "
                  "torch.compile")
        pause(dynamo * scale)
        logs.info("backends.py:559", f"Dynamo bytecode transform time: {dynamo:.2f} s")
        pause(work * scale)
        if unit.hit:
            logs.info("backends.py:161", "Directly load the compiled graph(s) for dynamic "
                      f"shape from the cache, took {work:.3f} s")
        else:
            logs.info("backends.py:197", f"Compiling a graph for dynamic shape takes "
                      f"{work:.2f} s")
        logs.info("monitor.py:34", f"torch.compile takes {dynamo + work:.2f} s in total")
    for unit in units:
        if not unit.hit:
            compilecache.store(unit, key)
    return units


def capture_sizes(cfg: ServeConfig) -> list[int]:
    """Batch sizes captured: ``--cudagraph-capture-sizes``, else vLLM's default list (1, 2, 4,
    multiples of 8 to 256, then of 16) up to ``--max-cudagraph-capture-size`` or
    min(512, 2 x max_num_seqs x (1 + K))."""
    if cfg.cudagraph_capture_sizes:
        return sorted(set(cfg.cudagraph_capture_sizes))
    top = cfg.max_cudagraph_capture_size or min(
        512, cfg.max_num_seqs * 2 * (1 + cfg.num_speculative_tokens))
    return [s for s in DEFAULT_CAPTURE_SIZES if s <= top] or [1]


def _bar(label: str, n: int, seconds: float) -> str:
    secs = max(int(round(seconds)), 0)
    rate = n / seconds if seconds > 0 else float(n)
    return (f"Capturing CUDA graphs ({label}): 100%|██████████| {n}/{n} "
            f"[00:{secs:02d}<00:00, {rate:5.2f}it/s]")


def capture_graphs(cfg: ServeConfig, pause: Pause, scale: float,
                   sizes: list[int] | None = None) -> graphmode.GraphPlan:
    """The downgrade warning (if any) and the capture bars of the mode the engine runs in.

    + sizes: the batch sizes to capture (default :func:`capture_sizes`; Genesis P66 filters
      them first)
    """
    plan = plan_for(cfg)
    if plan.warning:
        logs.warning("gpu_model_runner.py:4110", plan.warning)
    if plan.mode == "NONE":
        return plan
    sizes = capture_sizes(cfg) if sizes is None else sizes
    step = 1 + cfg.mtp_tokens
    decode = [s for s in sizes if s % step == 0 and s <= cfg.max_num_seqs * step] or [step]
    jobs: list[tuple[str, int]] = []
    if plan.mode in ("FULL_AND_PIECEWISE", "PIECEWISE"):
        jobs.append(("mixed prefill-decode, PIECEWISE", len(sizes)))
    if plan.mode == "FULL":
        jobs.append(("mixed prefill-decode, FULL", len(sizes)))
    if plan.mode in ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY"):
        jobs.append(("decode, FULL", len(decode)))
    for label, n in jobs:
        seconds = n * SECONDS_PER_GRAPH
        pause(seconds * scale)
        logs.plain(_bar(label, n, seconds))
    return plan
