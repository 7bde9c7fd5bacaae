"""The Genesis fixture's patches: one table, rendered into both generations' registries.

Genesis v7 keeps ``PATCH_REGISTRY`` in ``vllm/_genesis/dispatcher.py``, v12 in
``sndr/dispatcher/registry.py`` with a ``lifecycle`` and an optional
``applies_to.vllm_version_range`` per patch (upstream-2026.md 3.4). The env switches are the same
``GENESIS_ENABLE_*`` names in both. Which switch is retired, legacy or research in v12, and which
is capped ``<0.24.0``, is the reference's mapping of club-3090's 44 switches; P4 and PN54 are not
in the v12 registry at all (P4 was archived).

A few patches are *text patches*: they replace an anchor in a vLLM source file and leave a
``[Genesis <id>`` marker there (the simulator reads those markers; a second apply in the same
container finds the anchor gone and fails). The anchors are copied from the simulator's vLLM
source stubs (``images/vllm-sim/vllm/...`` and ``images/vllm-build/variants/``), as real
Genesis anchors are copied from vLLM; a unit test checks that each anchor exists where it
should. The other patches are in-memory rebinds: nothing on disk.

    from rigfleet_testbed.genesis_patches import PATCHES, render_registry
    print(render_registry("v12"))      # the PATCH_REGISTRY literal of sndr/dispatcher/registry.py
"""

from __future__ import annotations

import json
from dataclasses import dataclass

CAP_024 = (">=0.20.0", "<0.24.0")  # P67, P72, P82, P103, PN12, PN14 (upstream-2026.md 3.4)


@dataclass(frozen=True)
class PatchDef:
    """One Genesis patch.

    + pid: the id (``P67``); ``v12_id`` when v12 files it under another key (``PN26B``)
    + suffix: the env switch is ``GENESIS_ENABLE_<pid>[_<suffix>]``
    + lifecycle: v12's (experimental | retired | legacy | research); v7 has none
    + vllm_range: v12's ``applies_to.vllm_version_range`` (enforced only with
      ``GENESIS_ENFORCE_VERSION_RANGE=1``)
    + in_v12: False for the switches v12 no longer registers (P4, PN54)
    """

    pid: str
    suffix: str
    title: str
    category: str
    lifecycle: str = "experimental"
    vllm_range: tuple[str, str] | None = None
    v12_id: str = ""
    in_v12: bool = True

    @property
    def env_flag(self) -> str:
        return f"GENESIS_ENABLE_{self.pid}" + (f"_{self.suffix}" if self.suffix else "")


def _p(pid: str, suffix: str, title: str, category: str, lifecycle: str = "experimental",
       vllm_range: tuple[str, str] | None = None, **kw: str | bool) -> PatchDef:
    return PatchDef(pid, suffix, title, category, lifecycle, vllm_range, **kw)  # type: ignore[arg-type]


R = "retired"
PATCHES: tuple[PatchDef, ...] = (
    _p("P4", "", "TurboQuant KV cache on hybrid (GDN + attention) models", "kv_cache", R, in_v12=False),
    _p("P15B", "FA_VARLEN_CLAMP", "FlashAttention varlen max_seqlen clamp", "attention"),
    _p("P38B", "COMPILE_SAFE", "torch.compile-safe KV view", "compile_safety"),
    _p("P40", "", "grouped-query decode fast path", "attention", "legacy"),
    _p("P58", "ASYNC_PLACEHOLDER_FIX", "async scheduling placeholder fix", "scheduler"),
    _p("P60", "GDN_NGRAM_FIX", "GDN state rollback for n-gram/MTP rejects", "gdn"),
    _p("P60B", "TRITON_KERNEL", "GDN rollback Triton kernel", "gdn"),
    _p("P61", "QWEN3_MULTI_TOOL", "Qwen3 multiple tool calls per turn", "tools", R),
    _p("P61B", "STREAMING_OVERLAP", "tool-call streaming overlap fix", "tools", R),
    _p("P62", "STRUCT_OUT_SPEC_TIMING", "structured output timing under spec-decode", "spec_decode"),
    _p("P64", "QWEN3CODER_MTP_STREAMING", "qwen3_coder tool streaming with MTP", "tools", R,
       (">=0.20.0", "<0.23.0")),
    _p("P65", "TURBOQUANT_SPEC_CG_DOWNGRADE", "TurboQuant spec-decode cudagraph downgrade",
       "spec_decode"),
    _p("P66", "CUDAGRAPH_SIZE_FILTER", "cudagraph_capture_sizes spec-decode divisibility filter",
       "compile_safety"),
    _p("P67", "TQ_MULTI_QUERY_KERNEL", "TurboQuant multi-query kernel for spec-decode K+1 verify "
       "(+P67b)", "spec_decode", vllm_range=CAP_024),
    _p("P68", "AUTO_FORCE_TOOL", "auto-force tool choice on long contexts", "tools"),
    _p("P69", "LONG_CTX_TOOL_REMINDER", "long-context tool reminder", "tools"),
    _p("P72", "PROFILE_RUN_CAP", "cap the memory profile run (GENESIS_PROFILE_RUN_CAP_M)",
       "memory", vllm_range=CAP_024),
    _p("P74", "CHUNK_CLAMP", "chunked-prefill chunk clamp for Mamba block size", "scheduler"),
    _p("P78", "TOLIST_CAPTURE_GUARD", "tolist() under cudagraph capture guard", "compile_safety", R),
    _p("P81", "FP8_BLOCK_SCALED_M_LE_8", "FP8 block-scaled GEMM for M <= 8", "kernels"),
    _p("P82", "", "spec-decode acceptance threshold (GENESIS_P82_THRESHOLD_SINGLE)",
       "spec_decode", "research", CAP_024),
    _p("P83", "", "MTP draft KV reuse", "spec_decode", R),
    _p("P87", "", "Marlin pad-sub-tile-n (vllm#40361 backport)", "kernels"),
    _p("P91", "", "GDN chunk state dtype fix", "gdn"),
    _p("P94", "", "prefix-cache hit accounting with MTP", "spec_decode", R),
    _p("P98", "", "draft probs in fp32", "spec_decode"),
    _p("P99", "", "MTP position ids for hybrid models", "spec_decode"),
    _p("P100", "", "TurboQuant decode split heuristic", "kv_cache"),
    _p("P101", "", "TurboQuant prefill workspace reuse", "kv_cache"),
    _p("P103", "", "rebind sampler after worker spawn", "spec_decode", vllm_range=CAP_024),
    _p("PN8", "MTP_DRAFT_ONLINE_QUANT", "online quantization of the MTP draft", "spec_decode", R),
    _p("PN9", "INDEPENDENT_DRAFTER_ATTN", "independent drafter attention backend", "spec_decode",
       R),
    _p("PN11", "GDN_AB_CONTIGUOUS", "contiguous GDN a/b tensors", "gdn"),
    _p("PN12", "FFN_INTERMEDIATE_POOL", "pooled FFN intermediate buffers", "memory",
       vllm_range=CAP_024),
    _p("PN13", "CUDA_GRAPH_LAMBDA_ARITY", "cudagraph wrapper lambda arity fix", "compile_safety",
       R),
    _p("PN14", "TQ_DECODE_OOB_CLAMP", "TurboQuant decode out-of-bounds clamp", "kv_cache",
       vllm_range=CAP_024),
    _p("PN17", "FA2_LSE_CLAMP", "FA2 log-sum-exp clamp", "attention"),
    _p("PN19", "SCOPED_MAX_SPLIT", "scoped max_split for decode", "kv_cache", R),
    _p("PN22", "LOCAL_ARGMAX_TP", "local argmax under tensor parallel", "sampling", R),
    _p("PN25", "SILU_INDUCTOR_SAFE", "inductor-safe SiLU-and-mul", "compile_safety"),
    _p("PN26", "SPARSE_V", "sparse V accumulation (GENESIS_PN26_SPARSE_V_*)", "kv_cache",
       "research", v12_id="PN26B"),
    _p("PN30", "DS_LAYOUT_SPEC_DECODE", "DS conv-state layout under spec-decode", "gdn", R),
    _p("PN34", "WORKSPACE_LOCK_RELAX", "relax workspace lock", "memory", R),
    _p("PN54", "", "hybrid KV page size alignment", "kv_cache", R, in_v12=False),
    _p("PN59", "STREAMING_GDN", "streaming GDN prefill", "gdn"),
)  # fmt: skip


@dataclass(frozen=True)
class TextPatchDef:
    """A text patch: ``anchor`` in ``target`` (relative to the vllm package) becomes
    ``replacement``; ``drift_marker`` (v12 only) is upstream text that means "fixed upstream"."""

    target: str
    anchor: str
    replacement: str
    drift_marker: str = ""


_TQ = "v1/attention/backends/turboquant_attn.py"
_GDN = "model_executor/layers/mamba/gdn_linear_attn.py"
_TOOLS = "tool_parsers/qwen3coder_tool_parser.py"
_MARLIN = "model_executor/kernels/linear/mixed_precision/marlin.py"

TEXT_PATCHES: dict[str, TextPatchDef] = {
    "P4": TextPatchDef(
        _TQ,
        "        if any(t != \"full_attention\" for t in layer_types):\n"
        "            raise NotImplementedError(\"TurboQuant KV cache is not supported for hybrid "
        "models\")\n",
        "        # [Genesis P4 TurboQuant on hybrid] quantize the full-attention layers only.\n"
        "        layer_types = [t for t in layer_types if t == \"full_attention\"]\n"),
    "P67": TextPatchDef(
        _TQ,
        "        return self.decode_single_query(query, kv_cache, metadata)\n",
        "        # [Genesis P67 TurboQuant multi-query kernel] verify the K+1 queries in one pass.\n"
        "        return self.decode_multi_query(query, kv_cache, metadata)\n"),
    "PN14": TextPatchDef(
        _TQ,
        "        return metadata.seq_lens\n",
        "        # [Genesis PN14 decode OOB clamp]\n"
        "        return metadata.seq_lens.clamp(max=self.max_seq_len)\n"),
    "P66": TextPatchDef(
        "config/vllm.py",
        "        self.compilation_config.cudagraph_capture_sizes = cudagraph_capture_sizes\n",
        "        # [Genesis P66 cudagraph_capture_sizes spec-decode divisibility filter]\n"
        "        q = 1 + getattr(self.speculative_config, \"num_speculative_tokens\", 0)\n"
        "        kept = [s for s in cudagraph_capture_sizes if s % q == 0]\n"
        "        self.compilation_config.cudagraph_capture_sizes = kept\n"),
    "P87": TextPatchDef(
        _MARLIN,
        "        out_features = c.partition_weight_shape[1]\n",
        "        # [Genesis P87 vllm#40361 backport] pad sub-tile output shards on load.\n"
        "        out_features = max(c.partition_weight_shape[1], GPTQ_MARLIN_MIN_THREAD_N)\n",
        drift_marker="marlin_padded_nk"),
    "P58": TextPatchDef(
        "v1/core/sched/async_scheduler.py",
        "            self.requests[req_id].num_output_placeholders += num_tokens\n",
        "            # [Genesis P58 async placeholder fix] never count the -1 placeholder.\n"
        "            self.requests[req_id].num_output_placeholders += max(num_tokens, 0)\n"),
    "P60": TextPatchDef(
        _GDN,
        "        state = self.recurrent_update(hidden_states, state, metadata.num_accepted_tokens)\n",
        "        # [Genesis P60 GDN state rollback for rejected drafts]\n"
        "        state = self.recurrent_update(hidden_states, state.rolled_back(metadata),\n"
        "                                      metadata.num_accepted_tokens)\n"),
    "P91": TextPatchDef(
        _GDN,
        "        return model_dtype\n",
        "        # [Genesis P91 GDN chunk state dtype]\n"
        "        return \"float32\"\n"),
    "PN59": TextPatchDef(
        _GDN,
        "        chunks = self.chunk(hidden_states, metadata.chunk_size)\n",
        "        # [Genesis PN59 streaming GDN prefill]\n"
        "        chunks = self.stream_chunks(hidden_states, metadata.chunk_size)\n"),
    "P61": TextPatchDef(
        _TOOLS,
        "        tool_call_index = self.last_tool_call_index\n",
        "        # [Genesis P61 first-occurrence tool call index]\n"
        "        tool_call_index = self.first_tool_call_index\n"),
    "P64": TextPatchDef(
        _TOOLS,
        "            self.is_tool_call_started = True\n",
        "            # [Genesis P64 defer until <function=]\n"
        "            self.is_tool_call_started = \"<function=\" in delta_text\n"),
}  # fmt: skip


def v12_id(p: PatchDef) -> str:
    return p.v12_id or p.pid


def registry_entries(generation: str) -> dict[str, dict[str, object]]:
    """The PATCH_REGISTRY of ``generation`` ("v7" or "v12") as data."""
    out: dict[str, dict[str, object]] = {}
    for p in PATCHES:
        entry: dict[str, object] = {"title": p.title, "env_flag": p.env_flag,
                                    "default_on": False, "category": p.category}
        if generation == "v7":
            out[p.pid] = entry
            continue
        if not p.in_v12:
            continue
        entry["lifecycle"] = p.lifecycle
        if p.vllm_range:
            entry["applies_to"] = {"vllm_version_range": p.vllm_range}
        out[v12_id(p)] = entry
    return out


def _py(value: object) -> str:
    """A literal as Python source, strings double-quoted."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, tuple):
        return "(" + ", ".join(_py(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_py(k)}: {_py(v)}" for k, v in value.items()) + "}"
    return repr(value)


def render_registry(generation: str) -> str:
    """``PATCH_REGISTRY: dict[str, dict[str, Any]] = {...}`` as Python source."""
    lines = ["PATCH_REGISTRY: dict[str, dict[str, Any]] = {"]
    for pid, entry in registry_entries(generation).items():
        lines.append(f"    {_py(pid)}: {{")
        lines += [f"        {_py(k)}: {_py(v)}," for k, v in entry.items()]
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_text_patches(generation: str) -> str:
    """``TEXT_PATCHES: dict[str, TextPatch] = {...}`` as Python source (ids as registered)."""
    ids = {p.pid: (p.pid if generation == "v7" else v12_id(p)) for p in PATCHES
           if generation == "v7" or p.in_v12}
    lines = ["TEXT_PATCHES: dict[str, TextPatch] = {"]
    for pid, t in TEXT_PATCHES.items():
        if pid not in ids:
            continue
        drift = t.drift_marker if generation == "v12" else ""
        lines.append(f"    {_py(ids[pid])}: TextPatch({_py(ids[pid])}, {_py(t.target)},")
        lines.append(f"        anchor={_py(t.anchor)},")
        lines.append(f"        replacement={_py(t.replacement)},")
        lines.append(f"        drift_marker={_py(drift)}),")
    lines.append("}")
    return "\n".join(lines) + "\n"
