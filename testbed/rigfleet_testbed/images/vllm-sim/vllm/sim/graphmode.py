"""The attention backend a configuration gets, and the CUDA-graph mode the engine ends up in.

Facts this follows:

- The KV cache dtype picks the backend on an RTX 3090 (Ampere): ``int8_per_token_head`` runs
  on ``TRITON_ATTN`` only and fp8 KV takes FlashInfer (club-3090 #594, upstream-2026.md
  §1.3; seed 004: ``fp8_e5m2`` -> FlashInfer); TurboQuant KV has its own backend; fp16/bf16
  KV gets FlashAttention (FA2).
- vLLM asks for ``FULL_AND_PIECEWISE`` by default. A backend whose full graphs only cover
  single-token decode (FlashInfer: ``UNIFORM_SINGLE_TOKEN_DECODE``) cannot run spec-decode's
  K+1-token verify steps in a full graph, so with MTP the engine downgrades to
  ``PIECEWISE`` and says so (seed 004's warning, reproduced verbatim by
  :attr:`GraphPlan.warning`).
- ``--enforce-eager`` turns CUDA graphs (and torch.compile) off: mode ``NONE``.
- ``--compilation-config '{"cudagraph_mode": "PIECEWISE"}'`` (``-O``/``-cc``) asks for a mode.

Example::

    plan = graph_plan("fp8_e5m2", spec_tokens=3, enforce_eager=False)
    plan.mode       # "PIECEWISE"
    plan.warning    # "CUDAGraphMode.FULL_AND_PIECEWISE is not supported with spec-decode ..."
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from vllm.sim.perf import (
    FLASH_ATTN,
    FLASHINFER,
    MODE_FULL,
    MODE_NONE,
    MODE_PIECEWISE,
    TRITON_ATTN,
    TURBOQUANT,
)

# AttentionCGSupport of each backend's metadata builder.
ALWAYS = "ALWAYS"
UNIFORM_BATCH = "UNIFORM_BATCH"
UNIFORM_SINGLE_TOKEN_DECODE = "UNIFORM_SINGLE_TOKEN_DECODE"

BACKEND_CLASS = {
    FLASHINFER: "FlashInferBackend",
    TRITON_ATTN: "TritonAttentionBackend",
    FLASH_ATTN: "FlashAttentionBackend",
    TURBOQUANT: "TurboQuantAttentionBackend",
}
CG_SUPPORT = {
    FLASHINFER: UNIFORM_SINGLE_TOKEN_DECODE,
    TRITON_ATTN: ALWAYS,
    FLASH_ATTN: UNIFORM_BATCH,
    TURBOQUANT: UNIFORM_BATCH,
}
# The startup line vLLM logs for the chosen backend (TurboQuant logs its own in boot).
BACKEND_LOG = {
    FLASHINFER: "Using FlashInfer backend.",
    TRITON_ATTN: "Using Triton Attention backend.",
    FLASH_ATTN: "Using Flash Attention backend.",
}
MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
# What a full-graph mode becomes when the backend cannot capture spec-decode steps fully.
_DOWNGRADE = {"FULL_AND_PIECEWISE": MODE_PIECEWISE, "FULL": MODE_PIECEWISE,
              "FULL_DECODE_ONLY": MODE_NONE}


def backend_for(kv_cache_dtype: str) -> str:
    """The attention backend an RTX 3090 gets for this KV cache dtype."""
    if kv_cache_dtype == "int8_per_token_head":
        return TRITON_ATTN
    if kv_cache_dtype.startswith("turboquant"):
        return TURBOQUANT
    if kv_cache_dtype.startswith("fp8"):
        return FLASHINFER
    return FLASH_ATTN


def requested_mode(compilation_config: Any, enforce_eager: bool) -> str:
    """The cudagraph mode asked for: eager, an explicit ``cudagraph_mode``, or the default."""
    if enforce_eager:
        return MODE_NONE
    cfg = compilation_config
    if isinstance(cfg, str):
        try:
            cfg = json.loads(cfg)
        except ValueError:
            cfg = None  # a bare level ("-O3") leaves the mode at its default
    if isinstance(cfg, dict):
        mode = str(cfg.get("cudagraph_mode") or "").upper()
        if mode in MODES:
            return mode
    return MODE_FULL


@dataclass(frozen=True)
class GraphPlan:
    """Backend, the mode asked for, the mode the engine runs in, and the downgrade warning."""

    backend: str
    requested: str
    mode: str
    warning: str | None = None


def graph_plan(kv_cache_dtype: str, spec_tokens: int, enforce_eager: bool,
               compilation_config: Any = None) -> GraphPlan:
    """Decide the backend and the effective CUDA-graph mode."""
    backend = backend_for(kv_cache_dtype)
    asked = requested_mode(compilation_config, enforce_eager)
    support = CG_SUPPORT[backend]
    if spec_tokens > 0 and asked in _DOWNGRADE and support == UNIFORM_SINGLE_TOKEN_DECODE:
        new = _DOWNGRADE[asked]
        warning = (f"CUDAGraphMode.{asked} is not supported with spec-decode for attention "
                   f"backend {BACKEND_CLASS[backend]} (support: {support}); setting "
                   f"cudagraph_mode={new}")
        return GraphPlan(backend, asked, new, warning)
    return GraphPlan(backend, asked, asked)

