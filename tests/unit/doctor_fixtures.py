"""Host-side evidence for the doctor's tests: nvidia-smi CSV rows in the probe's field
order, the engine's log lines as vLLM (and the testbed's engine) print them, and a fake
command runner that answers ``nvidia-smi`` / ``docker inspect`` / ``docker logs``."""

from __future__ import annotations

import json
from typing import Any

from rigfleet.hostside.bench.evidence import GPU_FIELDS

BACKEND_FLASHINFER = "INFO 12-01 10:00:01 [cuda.py:368] Using FlashInfer backend."
BACKEND_TRITON = "INFO 12-01 10:00:01 [cuda.py:368] Using Triton Attention backend."
DOWNGRADE = ("WARNING 12-01 10:00:09 [gpu_model_runner.py:4110] CUDAGraphMode."
             "FULL_AND_PIECEWISE is not supported with spec-decode for attention backend "
             "FlashInferBackend (support: UNIFORM_SINGLE_TOKEN_DECODE); setting "
             "cudagraph_mode=PIECEWISE")
CAPTURE_PIECEWISE = ("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): "
                     "100%|██████████| 4/4 [00:01<00:00,  3.20it/s]")
CAPTURE_FULL = ("Capturing CUDA graphs (decode, FULL): 100%|██████████| 3/3 "
                "[00:01<00:00,  3.0it/s]")
CACHE_DIR = ("INFO 12-01 10:00:02 [backends.py:548] Using cache directory: /root/.cache/vllm/"
             "torch_compile_cache/3f9a0c1d2e/rank_0_0/backbone for vLLM's torch.compile")
COLD = "INFO 12-01 10:00:40 [backends.py:197] Compiling a graph for dynamic shape takes 35.12 s"
HIT = ("INFO 12-01 10:00:06 [backends.py:161] Directly load the compiled graph(s) for dynamic "
       "shape from the cache, took 3.912 s")
TOTAL = "INFO 12-01 10:00:41 [monitor.py:34] torch.compile takes 53.43 s in total"
BATCHED = ("WARNING 12-01 10:00:00 [arg_utils.py:1720] max_num_batched_tokens (2048) is "
           "smaller than the spec-decode verify batch needs; prefill throughput suffers")
COMPILE_MOUNT = {"Source": "/var/cache/rigfleet/x/torch_compile",
                 "Destination": "/root/.cache/vllm/torch_compile_cache"}


def row(index: int = 0, *, pstate: str = "P2", util: float = 97, draw: float = 220.0,
        limit: float = 290.0, default: float = 350.0, maximum: float = 350.0,
        sm: float = 1695, mem: float = 9501, reasons: tuple[str, ...] = (),
        gen: int = 4, gen_max: int = 4, gpumax: int = 4, width: int = 16, width_max: int = 16,
        temp: float = 62) -> list[str]:
    """One card's CSV values in ``GPU_FIELDS`` order (``--format=csv,noheader,nounits``)."""
    names = ("sw_power_cap", "hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown",
             "hw_power_brake_slowdown")
    bits = {"sw_power_cap": 0x4, "hw_slowdown": 0x8, "sw_thermal_slowdown": 0x20,
            "hw_thermal_slowdown": 0x40, "hw_power_brake_slowdown": 0x80}
    mask = sum(bits[r] for r in reasons) | (0x1 if pstate == "P8" else 0)
    return [str(index), "NVIDIA GeForce RTX 3090", pstate, f"{util:g}", f"{draw:.2f}",
            f"{limit:.2f}", f"{default:.2f}", f"{maximum:.2f}", f"{sm:g}", f"{mem:g}", "2100",
            "9751", f"0x{mask:016x}", *("Active" if n in reasons else "Not Active"
                                        for n in names),
            str(gen), str(gen_max), str(gpumax), str(width), str(width_max), f"{temp:g}"]


def sample(*rows: list[str], fields: tuple[str, ...] = GPU_FIELDS) -> dict[str, Any]:
    assert all(len(r) == len(fields) for r in rows)
    return {"t": 0.0, "fields": list(fields), "rc": 0,
            "stdout": "\n".join(", ".join(r) for r in rows) + "\n", "stderr": ""}


def section(idle: list[list[str]], load: list[list[list[str]]], *, lines: list[str],
            args: list[str] | None = None, mounts: list[dict[str, str]] | None = None,
            decode: float | None = 40.0, acceptance: list[float] | None = None,
            stack: str = "single-fp8-mtp") -> dict[str, Any]:
    """A probe ``doctor`` section as ``rigfleet.hostside.bench.evidence.gather`` returns it."""
    from rigfleet.hostside.bench.evidence import engine_facts

    return {"container": f"rigfleet-{stack}", "port": 8020, "stack": stack,
            "model": "qwen3.6-27b-autoround", "version": "0.27.1",
            "gpu": {"idle": sample(*idle), "load": [sample(*s) for s in load]},
            "load": {"decode_mean": decode, "runs": [],
                     "acceptance": {"per_position": acceptance, "length": 1 + sum(acceptance),
                                    "drafts": 900} if acceptance else None},
            "args": args or ["--model", "/root/.cache/huggingface/m"],
            "mounts": [{"source": m["Source"], "destination": m["Destination"]}
                       for m in (mounts or [])],
            "engine": engine_facts(lines), "enforce_eager": "--enforce-eager" in (args or [])}


class FakeRunner:
    """Answers the commands ``evidence`` runs; records them."""

    def __init__(self, smi: dict[str, Any] | None = None, logs: str = "",
                 args: list[str] | None = None, mounts: list[dict[str, str]] | None = None,
                 invalid: tuple[str, ...] = ()):
        self.smi = smi
        self.logs = logs
        self.args = args or []
        self.mounts = mounts or []
        self.invalid = invalid
        self.calls: list[list[str]] = []

    def __call__(self, cmd: list[str], timeout: float = 30) -> tuple[int, str, str]:
        self.calls.append(cmd)
        if cmd[0] == "nvidia-smi":
            fields = cmd[1].removeprefix("--query-gpu=").split(",")
            for f in fields:
                if f in self.invalid:
                    return 2, f'Field "{f}" is not a valid field to query.\n\n', ""
            rows = [row(0)]
            return 0, "\n".join(", ".join(r[: len(fields)]) for r in rows) + "\n", ""
        if cmd[:2] == ["docker", "inspect"]:
            return 0, json.dumps(self.args) + "\t" + json.dumps(self.mounts) + "\n", ""
        if cmd[:2] == ["docker", "logs"]:
            return 0, self.logs, ""
        return 127, "", "unknown command"
