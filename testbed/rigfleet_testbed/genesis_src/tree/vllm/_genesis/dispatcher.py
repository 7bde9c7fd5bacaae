"""Patch registry and the apply/skip decision.

Every patch is opt-in through its ``env_flag`` (exact name; there are no short aliases for the
long ones): a truthy value (``1``, ``true``, ``yes``, ``on``) applies it, unset skips it, a falsy
value (``0``, ``false``, ``no``, ``off``, empty) skips it as explicitly disabled. The typo guard
compares every ``GENESIS_ENABLE_*`` variable in the environment with the registered flags and
names the closest one (``GENESIS_TYPO_GUARD_STRICT=1`` turns the warning into a setup error).

    from vllm._genesis.dispatcher import decide_all
    for d in decide_all(os.environ):
        print(d.patch.patch_id, d.apply, d.reason)
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass

TRUTHY = frozenset({"1", "true", "yes", "on"})
FALSY = frozenset({"0", "false", "no", "off", ""})
TYPO_GUARD_STRICT_ENV = "GENESIS_TYPO_GUARD_STRICT"


@dataclass(frozen=True)
class PatchSpec:
    """One registered patch. ``target`` is the file it edits, relative to the vllm package."""

    patch_id: str
    env_flag: str
    title: str
    target: str


def _p(patch_id: str, suffix: str, title: str, target: str) -> PatchSpec:
    flag = f"GENESIS_ENABLE_{patch_id}" + (f"_{suffix}" if suffix else "")
    return PatchSpec(patch_id, flag, title, target)


_ATTN = "v1/attention/backends"
_SPEC = "v1/spec_decode"
_GDN = "model_executor/layers/mamba/gdn_linear_attn.py"
_TOOLS = "entrypoints/openai/tool_parsers/qwen3coder_tool_parser.py"

REGISTRY: tuple[PatchSpec, ...] = (
    _p("P4", "", "TurboQuant KV cache on hybrid (GDN + attention) models", f"{_ATTN}/turboquant_attn.py"),
    _p("P15B", "FA_VARLEN_CLAMP", "FlashAttention varlen max_seqlen clamp", f"{_ATTN}/flash_attn.py"),
    _p("P38B", "COMPILE_SAFE", "torch.compile-safe KV view", "v1/worker/gpu_model_runner.py"),
    _p("P40", "", "grouped-query decode fast path", f"{_ATTN}/triton_attn.py"),
    _p("P58", "ASYNC_PLACEHOLDER_FIX", "async scheduling placeholder fix", "v1/core/sched/async_scheduler.py"),
    _p("P60", "GDN_NGRAM_FIX", "GDN state rollback for n-gram/MTP rejects", _GDN),
    _p("P60B", "TRITON_KERNEL", "GDN rollback Triton kernel", _GDN),
    _p("P61", "QWEN3_MULTI_TOOL", "Qwen3 multiple tool calls per turn", _TOOLS),
    _p("P61B", "STREAMING_OVERLAP", "tool-call streaming overlap fix", _TOOLS),
    _p("P62", "STRUCT_OUT_SPEC_TIMING", "structured output timing under spec-decode", "v1/structured_output/__init__.py"),
    _p("P64", "QWEN3CODER_MTP_STREAMING", "qwen3_coder tool streaming with MTP", _TOOLS),
    _p("P66", "CUDAGRAPH_SIZE_FILTER", "filter cudagraph_capture_sizes by spec-decode divisibility", "config/compilation.py"),
    _p("P67", "TQ_MULTI_QUERY_KERNEL", "TurboQuant multi-query kernel for spec-decode K+1 verify (+P67b)", f"{_ATTN}/turboquant_attn.py"),
    _p("P68", "AUTO_FORCE_TOOL", "auto-force tool choice on long contexts", "entrypoints/openai/serving_chat.py"),
    _p("P69", "LONG_CTX_TOOL_REMINDER", "long-context tool reminder", "entrypoints/openai/serving_chat.py"),
    _p("P72", "PROFILE_RUN_CAP", "cap the memory profile run (GENESIS_PROFILE_RUN_CAP_M)", "v1/worker/gpu_model_runner.py"),
    _p("P74", "CHUNK_CLAMP", "chunked-prefill chunk clamp for Mamba block size", "v1/core/sched/scheduler.py"),
    _p("P78", "TOLIST_CAPTURE_GUARD", "tolist() under cudagraph capture guard", f"{_SPEC}/eagle.py"),
    _p("P81", "FP8_BLOCK_SCALED_M_LE_8", "FP8 block-scaled GEMM for M <= 8", "model_executor/layers/quantization/utils/fp8_utils.py"),
    _p("P82", "", "spec-decode acceptance threshold (GENESIS_P82_THRESHOLD_SINGLE)", f"{_SPEC}/metrics.py"),
    _p("P83", "", "MTP draft KV reuse", f"{_SPEC}/mtp.py"),
    _p("P87", "", "Marlin pad-sub-tile-n for TP=2 int4", "model_executor/kernels/linear/mixed_precision/marlin.py"),
    _p("P91", "", "GDN chunk state dtype fix", _GDN),
    _p("P94", "", "prefix-cache hit accounting with MTP", "v1/core/kv_cache_manager.py"),
    _p("P98", "", "draft probs in fp32", f"{_SPEC}/utils.py"),
    _p("P99", "", "MTP position ids for hybrid models", f"{_SPEC}/mtp.py"),
    _p("P100", "", "TurboQuant decode split heuristic", f"{_ATTN}/turboquant_attn.py"),
    _p("P101", "", "TurboQuant prefill workspace reuse", f"{_ATTN}/turboquant_attn.py"),
    _p("P103", "", "rebind sampler after worker spawn", "v1/sample/sampler.py"),
    _p("PN8", "MTP_DRAFT_ONLINE_QUANT", "online quantization of the MTP draft", f"{_SPEC}/mtp.py"),
    _p("PN9", "INDEPENDENT_DRAFTER_ATTN", "independent drafter attention backend", f"{_SPEC}/eagle.py"),
    _p("PN11", "GDN_AB_CONTIGUOUS", "contiguous GDN a/b tensors", _GDN),
    _p("PN12", "FFN_INTERMEDIATE_POOL", "pooled FFN intermediate buffers", "model_executor/models/qwen3_next.py"),
    _p("PN13", "CUDA_GRAPH_LAMBDA_ARITY", "cudagraph wrapper lambda arity fix", "compilation/cuda_graph.py"),
    _p("PN14", "TQ_DECODE_OOB_CLAMP", "TurboQuant decode out-of-bounds clamp", f"{_ATTN}/turboquant_attn.py"),
    _p("PN17", "FA2_LSE_CLAMP", "FA2 log-sum-exp clamp", f"{_ATTN}/flash_attn.py"),
    _p("PN19", "SCOPED_MAX_SPLIT", "scoped max_split for decode", f"{_ATTN}/turboquant_attn.py"),
    _p("PN22", "LOCAL_ARGMAX_TP", "local argmax under tensor parallel", "v1/sample/sampler.py"),
    _p("PN25", "SILU_INDUCTOR_SAFE", "inductor-safe SiLU-and-mul", "model_executor/layers/activation.py"),
    _p("PN26", "SPARSE_V", "sparse V accumulation (GENESIS_PN26_SPARSE_V_*)", f"{_ATTN}/turboquant_attn.py"),
    _p("PN30", "DS_LAYOUT_SPEC_DECODE", "DS conv-state layout under spec-decode", "model_executor/layers/mamba/mamba_utils.py"),
    _p("PN34", "WORKSPACE_LOCK_RELAX", "relax workspace lock", "v1/worker/workspace.py"),
    _p("PN54", "", "hybrid KV page size alignment", "v1/core/kv_cache_utils.py"),
    _p("PN59", "STREAMING_GDN", "streaming GDN prefill", _GDN),
)  # fmt: skip

BY_ID: dict[str, PatchSpec] = {p.patch_id: p for p in REGISTRY}
ENV_FLAGS: frozenset[str] = frozenset(p.env_flag for p in REGISTRY)


@dataclass(frozen=True)
class Decision:
    patch: PatchSpec
    apply: bool
    reason: str
    explicit: bool  # the env variable is set (to anything)


def should_apply(spec: PatchSpec, env: Mapping[str, str]) -> Decision:
    """Opt-in: truthy env -> apply; unset -> skip; falsy or unknown value -> skip."""
    raw = env.get(spec.env_flag)
    if raw is None:
        return Decision(spec, False, "opt-in not set", False)
    value = raw.strip().lower()
    if value in TRUTHY:
        return Decision(spec, True, f"{spec.env_flag}={raw}", True)
    if value in FALSY:
        return Decision(spec, False, f"disabled by {spec.env_flag}={raw}", True)
    return Decision(spec, False, f"unrecognised value {spec.env_flag}={raw!r}", True)


def decide_all(env: Mapping[str, str]) -> list[Decision]:
    return [should_apply(spec, env) for spec in REGISTRY]


def unknown_enable_flags(env: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """``GENESIS_ENABLE_*`` variables no patch registers, with the closest registered flag."""
    out = []
    for key in sorted(env):
        if key.startswith("GENESIS_ENABLE_") and key not in ENV_FLAGS:
            close = difflib.get_close_matches(key, sorted(ENV_FLAGS), n=1, cutoff=0.6)
            out.append((key, close[0] if close else None))
    return out
