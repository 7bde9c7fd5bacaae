"""The stack catalog: what each serving stack runs, as data.

A *stack* is one way of serving Qwen3.6-27B on a dual RTX 3090 host: vLLM arguments, the
container environment, the entrypoint, and whether it needs the Genesis patches. The values
are club-3090's validated dual-card composes (``int8.yml`` and ``tq3-mtp-genesis.yml``),
minus what we do not ship (see the notes on ``_TQ3_ENV`` and ``_COMMON_ARGS``).

What is pinned (image, digest, Genesis commit, model revision) lives in ``pins.yaml``
(``rigfleet.pins``); how a host runs a stack (paths, extra env) in host data
(``rigfleet.hostdata``); ``rigfleet.compose`` puts the three together.

Example::

    from rigfleet.catalog import get_stack

    spec = get_stack("tq3-mtp-genesis")
    spec.port                  # 8015, the loopback port the front proxies to
    spec.command("qwen3.6-27b-autoround-int4")[:2]
    # ['--model', '/root/.cache/huggingface/qwen3.6-27b-autoround-int4']
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from rigfleet.errors import RigfleetError

# Paths inside the official vllm/vllm-openai image (Python 3.12, dist-packages).
MODEL_ROOT_IN_CONTAINER = "/root/.cache/huggingface"
VLLM_PORT_IN_CONTAINER = 8000
SITE_PACKAGES_IN_CONTAINER = "/usr/local/lib/python3.12/dist-packages"
GENESIS_IN_CONTAINER = f"{SITE_PACKAGES_IN_CONTAINER}/vllm/_genesis"
TORCH_COMPILE_CACHE_IN_CONTAINER = "/root/.cache/vllm/torch_compile_cache"
TRITON_CACHE_IN_CONTAINER = "/root/.triton/cache"

# Compile caches live on the host, one tree per stack: vLLM's AOT cache key ignores the GPU
# architecture and the quantisation kernel (club-3090 #548), so caches are never shared
# between stacks or copied between hosts.
HOST_CACHE_ROOT = "/var/cache/rigfleet"

SERVED_MODEL_NAME = "qwen3.6-27b-autoround"


class CatalogError(RigfleetError, ValueError):
    """An unknown stack name; the message lists the known ones."""


@dataclass(frozen=True)
class StackSpec:
    """One serving stack, as club-3090 validated it on dual RTX 3090s over PCIe.

    + name: catalog key, also used in paths and the compose project (``rigfleet-<name>``)
    + summary: one line for people
    + container_name: the container's fixed name (teardown finds it by name)
    + port: host loopback port published for the front proxy (container port is 8000)
    + served_model_name: the model id clients ask for
    + kv_cache_dtype, gpu_memory_utilization, max_num_seqs, max_num_batched_tokens,
      tensor_parallel_size, max_model_len, num_speculative_tokens: the vLLM knobs that differ
      between stacks or that other code reads (the gate checks per-position acceptance)
    + needs_genesis: the stack boots only with the Genesis tree mounted and applied
    + env: container environment without the Genesis switches, in a stable order
    + genesis_env: ``GENESIS_*`` variables (switches, parameters, explicit OFFs)
    + entrypoint: the container entrypoint; ``command(...)`` is passed after it

    **Example:**

    .. code:: python

        spec = STACKS["int8"]
        spec.environment["NCCL_P2P_DISABLE"]   # "1"
        spec.compose_project                    # "rigfleet-int8"
    """

    name: str
    summary: str
    container_name: str
    port: int
    served_model_name: str
    kv_cache_dtype: str
    gpu_memory_utilization: float
    max_num_seqs: int
    max_num_batched_tokens: int
    tensor_parallel_size: int
    max_model_len: int
    num_speculative_tokens: int
    needs_genesis: bool
    env: Mapping[str, str]
    genesis_env: Mapping[str, str]
    entrypoint: tuple[str, ...]

    @property
    def compose_project(self) -> str:
        """The compose project name: ``rigfleet-<name>``."""
        return f"rigfleet-{self.name}"

    @property
    def environment(self) -> dict[str, str]:
        """The whole container environment (``env`` then ``genesis_env``), a fresh dict."""
        return {**self.env, **self.genesis_env}

    @property
    def genesis_switches(self) -> tuple[str, ...]:
        """Names of the ``GENESIS_ENABLE_*`` variables set to ``1``, in catalog order."""
        return tuple(
            k for k, v in self.genesis_env.items() if k.startswith("GENESIS_ENABLE_") and v == "1"
        )

    @property
    def vllm_args(self) -> tuple[str, ...]:
        """``vllm serve`` arguments after ``--model <path>`` (all values as strings)."""
        return (
            "--served-model-name", self.served_model_name,
            *_COMMON_ARGS,
            "--tensor-parallel-size", str(self.tensor_parallel_size),
            "--max-model-len", str(self.max_model_len),
            "--gpu-memory-utilization", f"{self.gpu_memory_utilization:g}",
            "--max-num-seqs", str(self.max_num_seqs),
            "--max-num-batched-tokens", str(self.max_num_batched_tokens),
            "--kv-cache-dtype", self.kv_cache_dtype,
            "--speculative-config", _speculative_config(self.num_speculative_tokens),
            "--host", "0.0.0.0",
            "--port", str(VLLM_PORT_IN_CONTAINER),
        )  # fmt: skip

    def model_path(self, local_dir: str) -> str:
        """Where the weights are inside the container, for ``pins.model.local_dir``."""
        return f"{MODEL_ROOT_IN_CONTAINER}/{local_dir}"

    def command(self, local_dir: str) -> list[str]:
        """The full argument list given to the entrypoint (``vllm serve`` reads it).

        + local_dir: the model's directory name under the model dir (``pins.model.local_dir``)
        """
        return ["--model", self.model_path(local_dir), *self.vllm_args]

    @property
    def cache_dirs(self) -> dict[str, str]:
        """Host cache directory -> container path, per stack (the deploy creates them)."""
        root = f"{HOST_CACHE_ROOT}/{self.name}"
        return {
            f"{root}/torch_compile": TORCH_COMPILE_CACHE_IN_CONTAINER,
            f"{root}/triton": TRITON_CACHE_IN_CONTAINER,
        }


def _speculative_config(n: int) -> str:
    # Compact JSON, exactly as club-3090 passes it; vLLM parses it as JSON.
    return json.dumps({"method": "mtp", "num_speculative_tokens": n}, separators=(",", ":"))


# Shared by both stacks (club-3090 §1.1 common args + the PCIe dual-card flags).
# Left out on purpose:
# - ``--disable-log-stats``: it empties /metrics, and the gate reads spec-decode counters.
# - ``--chat-template`` (froggeric template) and the Marlin / PR #35936 / PR #41800 overlays:
#   we do not ship those files; the model's own chat template is used.
# - ``--override-generation-config``: vLLM then takes sampling defaults from the model's
#   generation_config.json.
_COMMON_ARGS: tuple[str, ...] = (
    "--quantization", "auto_round",
    "--dtype", "float16",
    "--trust-remote-code",
    "--reasoning-parser", "qwen3",
    "--default-chat-template-kwargs", '{"enable_thinking": false}',
    "--enable-auto-tool-choice",
    "--tool-call-parser", "qwen3_coder",
    "--enable-chunked-prefill",
    # PCIe without NVLink: vLLM's custom all-reduce needs P2P, which GeForce drivers deny.
    "--disable-custom-all-reduce",
    "--enable-prefix-caching",
)  # fmt: skip

# Environment common to both stacks (club-3090 §1.1 and §7, PCIe dual-card path).
_COMMON_ENV: dict[str, str] = {
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    # NCCL over PCIe without P2P: stock GeForce drivers report P2P as unsupported, and a
    # "granted" P2P with a small BAR1 can hang ncclCommInitRank instead of falling back.
    "NCCL_CUMEM_ENABLE": "0",
    "NCCL_P2P_DISABLE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "OMP_NUM_THREADS": "1",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:512",
    # Weights are local and pinned: no hub calls at boot (a hub outage must not stop a restart).
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TRITON_CACHE_DIR": TRITON_CACHE_IN_CONTAINER,
}

_INT8_ENV: dict[str, str] = {
    **_COMMON_ENV,
    "VLLM_USE_FLASHINFER_SAMPLER": "1",
}

_TQ3_ENV: dict[str, str] = {
    **_COMMON_ENV,
    "VLLM_USE_FLASHINFER_SAMPLER": "1",
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
    "VLLM_MARLIN_USE_ATOMIC_ADD": "1",
    # 0 recovers ~120 MiB of KV per card (club-3090 CLIFFS.md).
    "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "0",
    "VLLM_FLOAT32_MATMUL_PRECISION": "high",
    "VLLM_SSM_CONV_STATE_LAYOUT": "DS",
    "VLLM_USE_FUSED_MOE_GROUPED_TOPK": "1",
    "CUDA_DEVICE_MAX_CONNECTIONS": "8",
}

# The 38 Genesis v7.72.2 patches club-3090 ran for the 7/7 result, by exact env-flag suffix
# (Genesis has no short aliases for the long names; a typo is silently a no-op).
GENESIS_SWITCHES_ON: tuple[str, ...] = (
    "P4",
    "P58_ASYNC_PLACEHOLDER_FIX",
    "P60_GDN_NGRAM_FIX",
    "P60B_TRITON_KERNEL",
    "P61_QWEN3_MULTI_TOOL",
    "P61B_STREAMING_OVERLAP",
    "P62_STRUCT_OUT_SPEC_TIMING",
    "P64_QWEN3CODER_MTP_STREAMING",
    "P66_CUDAGRAPH_SIZE_FILTER",
    # The fix that makes TQ3 + MTP work: multi-query Triton kernel for the K+1 verify.
    "P67_TQ_MULTI_QUERY_KERNEL",
    "P68_AUTO_FORCE_TOOL",
    "P69_LONG_CTX_TOOL_REMINDER",
    "P72_PROFILE_RUN_CAP",
    "P74_CHUNK_CLAMP",
    "P83",
    "P91",
    "P94",
    "P98",
    "PN34_WORKSPACE_LOCK_RELAX",
    "P99",
    "P100",
    "P101",
    "P103",
    "PN8_MTP_DRAFT_ONLINE_QUANT",
    "PN9_INDEPENDENT_DRAFTER_ATTN",
    "PN11_GDN_AB_CONTIGUOUS",
    "PN12_FFN_INTERMEDIATE_POOL",
    "PN13_CUDA_GRAPH_LAMBDA_ARITY",
    "PN14_TQ_DECODE_OOB_CLAMP",
    "PN17_FA2_LSE_CLAMP",
    "PN19_SCOPED_MAX_SPLIT",
    "PN22_LOCAL_ARGMAX_TP",
    "PN26_SPARSE_V",
    "PN59_STREAMING_GDN",
    "P38B_COMPILE_SAFE",
    "P15B_FA_VARLEN_CLAMP",
    "PN25_SILU_INDUCTOR_SAFE",
    "PN30_DS_LAYOUT_SPEC_DECODE",
)

# Explicit OFFs. The validated config ran with P87 off (there it would have re-patched the
# RO-mounted Marlin overlay and, under `set -e`, aborted the boot: club-3090 #49). We ship no
# Marlin overlay, but keep the switch set identical to the validated one. P78/P81 were off;
# P40, PN54 and P82 were "default 0" knobs of that compose. P65 (exclusive with P67) and P85
# (needs P84) are simply absent.
GENESIS_SWITCHES_OFF: tuple[str, ...] = (
    "P87",
    "P78_TOLIST_CAPTURE_GUARD",
    "P81_FP8_BLOCK_SCALED_M_LE_8",
    "P40",
    "PN54",
    "P82",
)

GENESIS_PARAMS: dict[str, str] = {
    "GENESIS_P68_P69_LONG_CTX_THRESHOLD_CHARS": "50000",
    "GENESIS_PROFILE_RUN_CAP_M": "4128",
    "GENESIS_PN26_SPARSE_V_BLOCK_KV": "8",
    "GENESIS_PN26_SPARSE_V_NUM_WARPS": "4",
    "GENESIS_PN26_SPARSE_V_THRESHOLD": "0.01",
    "GENESIS_PREALLOC_TOKEN_BUDGET": "4128",
    "GENESIS_BUFFER_MODE": "shared",
    "GENESIS_P82_THRESHOLD_SINGLE": "0.3",
    # Defence in depth: Genesis itself refuses (exit 2) a vLLM build that is not on its
    # KNOWN_GOOD_VLLM_PINS, on top of the deploy's own allowlist check.
    "GENESIS_VLLM_PIN_POLICY": "strict",
}

_TQ3_GENESIS_ENV: dict[str, str] = {
    **{f"GENESIS_ENABLE_{s}": "1" for s in GENESIS_SWITCHES_ON},
    **{f"GENESIS_ENABLE_{s}": "0" for s in GENESIS_SWITCHES_OFF},
    **GENESIS_PARAMS,
}

_GENESIS_CHECK_FILE = f"{GENESIS_IN_CONTAINER}/patches/apply_all.py"

# Runs as `/bin/bash -c <script> -- <command...>`, so "$@" is the vLLM argument list.
# - pip: Genesis needs these at runtime and the image lacks them (network, or PIP_INDEX_URL).
# - the check: an empty Genesis mount makes apply_all a silent no-op and the boot then fails
#   later with a cryptic upstream error (club-3090 #13); fail at once with a clear line.
# - apply_all text-patches vLLM in the container's writable layer; `set -e` stops the boot
#   if any patch FAILED (exit 1) or the strict pin gate refused the build (exit 2).
TQ3_ENTRYPOINT_SCRIPT = f"""\
set -e
pip install xxhash pandas scipy -q
if [ ! -f {_GENESIS_CHECK_FILE} ]; then
  echo "rigfleet: Genesis patches missing: {_GENESIS_CHECK_FILE} not found; the host's \
Genesis checkout is empty or not at the pinned commit. Re-run the deploy." >&2
  exit 1
fi
python3 -m vllm._genesis.patches.apply_all
exec vllm serve "$@"
"""

STACKS: dict[str, StackSpec] = {
    "int8": StackSpec(
        name="int8",
        summary="INT8 per-token-head KV + MTP n=3 (no Genesis), ~605K-token KV pool",
        container_name="rigfleet-int8",
        port=8011,
        served_model_name=SERVED_MODEL_NAME,
        kv_cache_dtype="int8_per_token_head",
        gpu_memory_utilization=0.92,
        max_num_seqs=2,
        max_num_batched_tokens=8192,
        tensor_parallel_size=2,
        max_model_len=262144,
        num_speculative_tokens=3,
        needs_genesis=False,
        env=MappingProxyType(_INT8_ENV),
        genesis_env=MappingProxyType({}),
        # The image's own entrypoint is `vllm serve` too; spelled out so a different image
        # default cannot change what runs.
        entrypoint=("vllm", "serve"),
    ),
    "tq3-mtp-genesis": StackSpec(
        name="tq3-mtp-genesis",
        summary="TurboQuant 3-bit KV + MTP n=3 + Genesis v7.72.2 (P67), ~1.22M-token KV pool",
        container_name="rigfleet-tq3-mtp-genesis",
        port=8015,
        served_model_name=SERVED_MODEL_NAME,
        kv_cache_dtype="turboquant_3bit_nc",
        gpu_memory_utilization=0.85,
        max_num_seqs=2,
        # 4128, not 8192: the Mamba block size of hybrid Qwen3-Next at 262K must fit in one
        # batch (club-3090 CLIFFS.md), and P72 caps the profile run to the same figure.
        max_num_batched_tokens=4128,
        tensor_parallel_size=2,
        max_model_len=262144,
        num_speculative_tokens=3,
        needs_genesis=True,
        env=MappingProxyType(_TQ3_ENV),
        genesis_env=MappingProxyType(_TQ3_GENESIS_ENV),
        entrypoint=("/bin/bash", "-c", TQ3_ENTRYPOINT_SCRIPT, "--"),
    ),
}

STACK_NAMES: tuple[str, ...] = tuple(STACKS)


def get_stack(name: str) -> StackSpec:
    """Return the stack called ``name``; an unknown name raises ``CatalogError``.

    + name: a catalog key (``int8`` or ``tq3-mtp-genesis``)

    **Example:**

    .. code:: python

        get_stack("int8").port   # 8011
        get_stack("fp8")         # CatalogError: unknown stack 'fp8'; allowed: int8, ...
    """
    try:
        return STACKS[name]
    except (KeyError, TypeError):
        raise CatalogError(f"unknown stack {name!r}; allowed: {', '.join(STACK_NAMES)}") from None
