"""The Genesis fixture's patches: one table, rendered into both generations' registries.

Genesis v7 keeps ``PATCH_REGISTRY`` in ``vllm/_genesis/dispatcher.py``, v12 in
``sndr/dispatcher/registry.py`` with a ``lifecycle`` and an optional
``applies_to.vllm_version_range`` per patch (upstream-2026.md 3.4). The env switches are the same
``GENESIS_ENABLE_*`` names in both. Each entry's id, ``env_flag``, ``default_on``, lifecycle and
version range are the real registries' (v7.72.2 ``7b9fd319``, v12.1.0 ``66e37841``; a unit test
holds them against ``tests/fixtures/genesis/*-registry.json``, an extract of those facts);
categories and applies_to conditions are the real ones too; titles are the fixture's own. Ids keep
the real spelling: ``P60b``, ``P61b``, ``P67b`` (a second patch behind P67's switch) and ``PN26b``
(``GENESIS_ENABLE_PN26_SPARSE_V``).

P4 is a *legacy* patch in both generations: its ``env_flag`` is ``GENESIS_LEGACY_P4``, which is no
switch, and its own apply hook runs it on every apply (v7.72.2 ``apply_patch_4_tq_hybrid`` in
``vllm/_genesis/patches/apply_all.py``; v12.1.0 the same hook in
``sndr/apply/_per_patch_dispatch.py``, which the default apply loop calls without the dispatcher's
lifecycle gate, so v12's ``lifecycle: retired`` does not stop it). It text-patches vLLM's refusal
of TurboQuant on hybrid models away and skips itself on builds that support them (vllm#39931,
0.20.2rc1.dev60): there its anchor is gone.

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
CAP_023 = (">=0.20.0", "<0.23.0")  # P61b, P64, PN30 (v12.1.0 registry)
LEGACY_PREFIX = "GENESIS_LEGACY_"
ENABLE_PREFIX = "GENESIS_ENABLE_"


@dataclass(frozen=True)
class PatchDef:
    """One Genesis patch.

    + pid: the id as both registries spell it (``P67``, ``P60b``)
    + switch: the env switch is ``GENESIS_ENABLE_<switch>``; empty for a legacy patch, whose
      ``env_flag`` is ``GENESIS_LEGACY_<pid>`` and which applies on every apply (no switch)
    + lifecycle: v12's (experimental | retired | legacy | research)
    + vllm_range: v12's ``applies_to.vllm_version_range`` (specifiers, or one specifier string as
      some real entries have it; enforced only with ``GENESIS_ENFORCE_VERSION_RANGE=1``)
    + v7_lifecycle: what v7's entry declares: empty (nothing: ``stable``), ``legacy`` or
      ``retired`` (a ``lifecycle`` key), ``deprecated`` (``deprecated: True``)
    + default_on: the generations whose entry says ``default_on: True`` (informational in both:
      v7 reads only the switch, v12 is strict opt-in)
    + aliases: v12's ``env_flag_aliases`` (older switch names that still turn the patch on)
    """

    pid: str
    switch: str
    title: str
    category: str
    lifecycle: str = "experimental"
    vllm_range: tuple[str, ...] | str | None = None
    v7_lifecycle: str = ""
    default_on: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()

    @property
    def legacy(self) -> bool:
        """Applied by its own hook on every apply; its ``env_flag`` switches nothing."""
        return not self.switch

    @property
    def env_flag(self) -> str:
        return f"{LEGACY_PREFIX}{self.pid}" if self.legacy else f"{ENABLE_PREFIX}{self.switch}"


def _p(pid: str, switch: str, title: str, category: str, lifecycle: str = "experimental",
       vllm_range: tuple[str, ...] | str | None = None, v7: str = "",
       default_on: tuple[str, ...] = (), aliases: tuple[str, ...] = ()) -> PatchDef:
    return PatchDef(pid, switch, title, category, lifecycle, vllm_range, v7, default_on,
                    tuple(f"{ENABLE_PREFIX}{a}" for a in aliases))


R = "retired"
PATCHES: tuple[PatchDef, ...] = (
    _p("P4", "", "TurboQuant KV cache on hybrid (GDN + attention) models", "kv_cache", R,
       v7="legacy", default_on=("v7",)),
    _p("P15B", "P15B_FA_VARLEN_CLAMP", "FlashAttention varlen max_seqlen clamp", "perf_hotfix"),
    _p("P38B", "P38B_COMPILE_SAFE", "torch.compile-safe KV view", "perf_hotfix"),
    _p("P40", "P40", "grouped-query decode fast path", "kernel_perf", "legacy", v7="legacy"),
    _p("P58", "P58_ASYNC_PLACEHOLDER_FIX", "async scheduling placeholder fix", "spec_decode"),
    _p("P60", "P60_GDN_NGRAM_FIX", "GDN state rollback for n-gram/MTP rejects", "spec_decode"),
    _p("P60b", "P60B_TRITON_KERNEL", "GDN rollback Triton kernel", "spec_decode"),
    _p("P61", "P61_QWEN3_MULTI_TOOL", "Qwen3 multiple tool calls per turn", "structured_output", R,
       v7="deprecated"),
    _p("P61b", "P61B_STREAMING_OVERLAP", "tool-call streaming overlap fix", "structured_output", R,
       CAP_023, aliases=("P59_QWEN3_TOOL_RECOVERY", "PN51_QWEN3_STREAMING_THINKING_DISABLED")),
    _p("P62", "P62_STRUCT_OUT_SPEC_TIMING", "structured output timing under spec-decode",
       "structured_output"),
    _p("P64", "P64_QWEN3CODER_MTP_STREAMING", "qwen3_coder tool streaming with MTP",
       "structured_output", R, CAP_023,
       aliases=("P61C_QWEN3CODER_DEFERRED_COMMIT", "PN56_QWEN3CODER_XML_FALLBACK")),
    _p("P65", "P65_TURBOQUANT_SPEC_CG_DOWNGRADE", "TurboQuant spec-decode cudagraph downgrade",
       "spec_decode"),
    _p("P66", "P66_CUDAGRAPH_SIZE_FILTER", "cudagraph_capture_sizes spec-decode divisibility "
       "filter", "spec_decode"),
    _p("P67", "P67_TQ_MULTI_QUERY_KERNEL", "TurboQuant multi-query kernel for spec-decode K+1 "
       "verify", "spec_decode", vllm_range=CAP_024),
    _p("P67b", "P67_TQ_MULTI_QUERY_KERNEL", "TurboQuant spec-verify routing to the P67 kernel",
       "spec_decode"),
    _p("P68", "P68_AUTO_FORCE_TOOL", "auto-force tool choice on long contexts",
       "structured_output"),
    _p("P69", "P69_LONG_CTX_TOOL_REMINDER", "long-context tool reminder", "structured_output"),
    _p("P72", "P72_PROFILE_RUN_CAP", "cap the memory profile run (GENESIS_PROFILE_RUN_CAP_M)",
       "compile_safety", vllm_range=CAP_024),
    _p("P74", "P74_CHUNK_CLAMP", "chunked-prefill chunk clamp for Mamba block size",
       "compile_safety"),
    _p("P78", "P78_TOLIST_CAPTURE_GUARD", "tolist() under cudagraph capture guard",
       "compile_safety", R),
    _p("P81", "P81_FP8_BLOCK_SCALED_M_LE_8", "FP8 block-scaled GEMM for M <= 8", "kernel_perf"),
    _p("P82", "P82", "spec-decode acceptance threshold (GENESIS_P82_THRESHOLD_SINGLE)",
       "spec_decode", "research", CAP_024),
    _p("P83", "P83", "MTP draft KV reuse", "spec_decode", R, "<0.22.1"),
    _p("P87", "P87", "Marlin pad-sub-tile-n (vllm#40361 backport)", "kernel"),
    _p("P91", "P91", "GDN chunk state dtype fix", "quantization"),
    _p("P94", "P94", "prefix-cache hit accounting with MTP", "spec_decode", R, "<0.20.2rc1.dev9"),
    _p("P98", "P98", "draft probs in fp32", "perf_hotfix"),
    _p("P99", "P99", "MTP position ids for hybrid models", "perf_hotfix"),
    _p("P100", "P100", "TurboQuant decode split heuristic", "perf_hotfix"),
    _p("P101", "P101", "TurboQuant prefill workspace reuse", "perf_hotfix"),
    _p("P103", "P103", "rebind sampler after worker spawn", "memory_hotfix", vllm_range=CAP_024),
    _p("PN8", "PN8_MTP_DRAFT_ONLINE_QUANT", "online quantization of the MTP draft",
       "spec_decode"),
    _p("PN9", "PN9_INDEPENDENT_DRAFTER_ATTN", "independent drafter attention backend",
       "spec_decode", R, "<0.20.2rc1.dev9"),
    _p("PN11", "PN11_GDN_AB_CONTIGUOUS", "contiguous GDN a/b tensors", "model_correctness"),
    _p("PN12", "PN12_FFN_INTERMEDIATE_POOL", "pooled FFN intermediate buffers", "memory_savings",
       vllm_range=CAP_024),
    _p("PN13", "PN13_CUDA_GRAPH_LAMBDA_ARITY", "cudagraph wrapper lambda arity fix",
       "compile_safety", R, "<0.20.2", v7="retired"),
    _p("PN14", "PN14_TQ_DECODE_OOB_CLAMP", "TurboQuant decode out-of-bounds clamp", "kernel_safety",
       vllm_range=CAP_024),
    _p("PN17", "PN17_FA2_LSE_CLAMP", "FA2 log-sum-exp clamp", "memory_savings"),
    _p("PN19", "PN19_SCOPED_MAX_SPLIT", "scoped max_split for decode", "memory_savings", R,
       "<0.20.2rc1.dev93"),
    _p("PN22", "PN22_LOCAL_ARGMAX_TP", "local argmax under tensor parallel", "spec_decode", R,
       "<0.23.1rc1.dev101"),
    _p("PN25", "PN25_SILU_INDUCTOR_SAFE", "inductor-safe SiLU-and-mul", "memory_savings"),
    _p("PN26b", "PN26_SPARSE_V", "sparse V accumulation (GENESIS_PN26_SPARSE_V_*)", "perf_hotfix",
       "research"),
    _p("PN30", "PN30_DS_LAYOUT_SPEC_DECODE", "DS conv-state layout under spec-decode",
       "model_correctness", vllm_range=CAP_023),
    _p("PN34", "PN34_WORKSPACE_LOCK_RELAX", "relax workspace lock", "perf_hotfix", R),
    _p("PN54", "PN54_GDN_CONTIGUOUS_DEDUP", "GDN contiguous-call deduplication", "perf_hotfix", R),
    _p("PN59", "PN59_STREAMING_GDN", "streaming GDN prefill", "hybrid"),
)  # fmt: skip


# applies_to's conditions besides the version range, as the real registries have them (v12;
# V7_CONDITIONS where v7.72.2's differ). rigfleet reads them to tell which correctness patches
# concern a stack (rigfleet/genesis.py); the fixture's apply loop does not.
CONDITIONS: dict[str, dict[str, object]] = {
    "P60": {"is_hybrid": [True]},
    "P60b": {"is_hybrid": [True]},
    "P61": {"model_class": ['qwen3', 'qwen3_5', 'qwen3_6', 'qwen3_moe', 'qwen3_next']},
    "P61b": {"model_class": ['qwen3', 'qwen3_5', 'qwen3_6', 'qwen3_moe', 'qwen3_next']},
    "P62": {"model_class": ['qwen3', 'qwen3_5', 'qwen3_6', 'qwen3_moe', 'qwen3_next']},
    "P64": {"model_class": ['qwen3', 'qwen3_5', 'qwen3_6', 'qwen3_moe', 'qwen3_next']},
    "P65": {"is_turboquant": [True]},
    "P67": {"is_turboquant": [True]},
    "P67b": {"is_turboquant": [True]},
    "P68": {"model_class": ['qwen3', 'qwen3_5', 'qwen3_6', 'qwen3_moe', 'qwen3_next']},
    "P69": {"model_class": ['qwen3', 'qwen3_5', 'qwen3_6', 'qwen3_moe', 'qwen3_next']},
    "P74": {"model_class": ['qwen3', 'qwen3_5', 'qwen3_6', 'qwen3_moe', 'qwen3_next']},
    "P78": {"is_turboquant": [True], "quant_format": ['fp8', 'compressed_tensors']},
    "P81": {"quant_format": ['fp8']},
    "P83": {"is_hybrid": [True]},
    "P87": {"quant_format": ['int8_w8a16', 'int4_w4a16', 'autoround_int8', 'autoround_int4', 'gptq_int4', 'awq_int4', 'compressed_tensors']},  # noqa: E501
    "P91": {"quant_format": ['autoround_int8', 'autoround_int4', 'gptq_int4', 'int8_w8a16', 'int4_w4a16', 'compressed_tensors']},  # noqa: E501
    "P98": {"kv_cache_dtype": ['turboquant_k8v4', 'turboquant_4bit_nc', 'turboquant_k3v4_nc', 'turboquant_3bit_nc']},  # noqa: E501
    "P101": {"kv_cache_dtype": ['turboquant_k8v4', 'turboquant_4bit_nc', 'turboquant_k3v4_nc', 'turboquant_3bit_nc']},  # noqa: E501
    "P103": {"model_arch": ['Qwen3MoeForCausalLM', 'Qwen3_5ForConditionalGeneration', 'Qwen3_5MoeForConditionalGeneration', 'Qwen3_5MoeForCausalLM', 'Qwen3_6MoeForConditionalGeneration', 'Qwen3_6MoeForCausalLM', 'Qwen3NextForCausalLM', '*']},  # noqa: E501
    "PN14": {"is_turboquant": [True]},
    "PN54": {"model_class": ['qwen3_5', 'qwen3_6']},
    "PN59": {"model_class": ['qwen3_5', 'qwen3_6']},
}  # fmt: skip
V7_CONDITIONS: dict[str, dict[str, object]] = {
    "P61": {"model_class": ['qwen3', 'qwen3_5', 'qwen3_moe', 'qwen3_next']},
    "P61b": {"model_class": ['qwen3', 'qwen3_5', 'qwen3_moe', 'qwen3_next']},
    "P64": {"model_class": ['qwen3', 'qwen3_5', 'qwen3_moe', 'qwen3_next']},
    "P68": {"model_class": ['qwen3', 'qwen3_5', 'qwen3_moe', 'qwen3_next']},
    "P69": {"model_class": ['qwen3', 'qwen3_5', 'qwen3_moe', 'qwen3_next']},
    "P74": {"model_class": ['qwen3', 'qwen3_5', 'qwen3_moe', 'qwen3_next']},
    "P103": {"model_arch": ['Qwen3MoeForCausalLM', 'Qwen3_5ForConditionalGeneration', 'Qwen3NextForCausalLM']},  # noqa: E501
}  # fmt: skip

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
        "        # [Genesis P67 TurboQuant multi-query kernel] "
        "verify the K+1 queries in one pass.\n"
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
        "        state = self.recurrent_update(hidden_states, state, "
        "metadata.num_accepted_tokens)\n",
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


def registry_entries(generation: str) -> dict[str, dict[str, object]]:
    """The PATCH_REGISTRY of ``generation`` ("v7" or "v12") as data."""
    out: dict[str, dict[str, object]] = {}
    for p in PATCHES:
        entry: dict[str, object] = {"title": p.title, "env_flag": p.env_flag,
                                    "default_on": generation in p.default_on,
                                    "category": p.category}
        conditions = (V7_CONDITIONS.get(p.pid, CONDITIONS.get(p.pid, {})) if generation == "v7"
                      else CONDITIONS.get(p.pid, {}))
        if generation == "v7":
            if p.v7_lifecycle == "deprecated":
                entry["deprecated"] = True
            elif p.v7_lifecycle:
                entry["lifecycle"] = p.v7_lifecycle
            if conditions:
                entry["applies_to"] = dict(conditions)
        else:
            entry["lifecycle"] = p.lifecycle
            if conditions or p.vllm_range:
                applies: dict[str, object] = dict(conditions)
                if p.vllm_range:
                    applies["vllm_version_range"] = p.vllm_range
                entry["applies_to"] = applies
            if p.aliases:
                entry["env_flag_aliases"] = p.aliases
        out[p.pid] = entry
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
    """``TEXT_PATCHES: dict[str, TextPatch] = {...}`` as Python source."""
    lines = ["TEXT_PATCHES: dict[str, TextPatch] = {"]
    for pid, t in TEXT_PATCHES.items():
        drift = t.drift_marker if generation == "v12" else ""
        lines.append(f"    {_py(pid)}: TextPatch({_py(pid)}, {_py(t.target)},")
        lines.append(f"        anchor={_py(t.anchor)},")
        lines.append(f"        replacement={_py(t.replacement)},")
        lines.append(f"        drift_marker={_py(drift)}),")
    lines.append("}")
    return "\n".join(lines) + "\n"
