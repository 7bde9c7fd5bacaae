"""Helpers for the verify gate's end-to-end tests: the serving simulator in the stacks' shapes.

    with sim_server(tmp_path, INT8_MTP) as srv:          # vllm_sim_helpers.SimServer, ready
        url = f"http://127.0.0.1:{srv.port}"

Servers are subprocesses on 127.0.0.1 with an ephemeral port, started from a private copy of
the simulator package carrying the build info / Genesis marker under test (exactly what an
image build and Genesis leave behind), sped up through the simulator's env knobs.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_sim_helpers import MTP, SimServer, make_gpu_root, make_model, make_package

NAME = "qwen3.6-27b-autoround"
COMMON = ["--served-model-name", NAME, "--tensor-parallel-size", "2", "--reasoning-parser",
          "qwen3", "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder",
          "--default-chat-template-kwargs", '{"enable_thinking": false}',
          "--enable-prefix-caching", "--quantization", "auto_round", "--dtype", "float16",
          "--max-num-seqs", "2", "--disable-custom-all-reduce"]
INT8_MTP = [*COMMON, "--max-model-len", "262144", "--kv-cache-dtype", "int8_per_token_head",
            "--gpu-memory-utilization", "0.92", "--speculative-config", MTP]
TQ3_MTP = [*COMMON, "--max-model-len", "262144", "--kv-cache-dtype", "turboquant_3bit_nc",
           "--gpu-memory-utilization", "0.85", "--speculative-config", MTP]
# A smaller stack without MTP: deep needles do not fit, and there are no spec-decode counters.
INT8_SHORT_NO_MTP = [*COMMON, "--max-model-len", "14000", "--kv-cache-dtype",
                     "int8_per_token_head", "--gpu-memory-utilization", "0.92"]

GENESIS_WITH_P67 = ["P4", "P66_CUDAGRAPH_SIZE_FILTER", "P67_TQ_MULTI_QUERY_KERNEL", "PN14"]
GENESIS_WITHOUT_P67 = ["P4", "P66_CUDAGRAPH_SIZE_FILTER", "PN14"]
REGRESSED_BUILD: dict[str, Any] = {
    "version": "0.20.2rc1.dev240+gb7e4d1c9a",
    "commit": "b7e4d1c9a2f5e8b3d6c0a9f2e5b8d1c4a7f0e3b6",
    "regressions": ("spec-decode-acceptance-collapse",),
}
FAST_ENV = {"SIM_BOOT_SECONDS": "0", "SIM_TOKENS_PER_SECOND": "200000",
            "SIM_PREFILL_TOKENS_PER_SECOND": "2000000"}


@contextmanager
def sim_server(tmp_path: Path, args: list[str], env: dict[str, str] | None = None,
               **pkg: Any) -> Iterator[SimServer]:
    """A ready simulator (``**pkg``: build info / genesis_applied for make_package)."""
    base = tmp_path / "sim"
    site = make_package(base / "pkg", **pkg)
    srv = SimServer(site, make_gpu_root(base), make_model(base), args,
                    env={**FAST_ENV, **(env or {})})
    with srv:
        srv.wait_ready()
        yield srv
        srv.stop()
