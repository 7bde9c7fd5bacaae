"""vLLM's environment variables: ``environment_variables``, the table ``vllm/envs.py`` defines.

Real vLLM reads every ``VLLM_*`` setting through this table and warns about a ``VLLM_*`` name
that is not in it (the setting does nothing). The simulator's table holds the names of
vLLM's own ``vllm/envs.py`` (vllm-project/vllm) that a serving stack of the simulated builds sets:
those club-3090's composes and Genesis' stacks pass on the 0.20-0.28 builds, and the image's
own ``VLLM_USAGE_SOURCE``. No source known to the project names a ``VLLM_*`` variable added or
removed within the simulated versions (0.20-0.33), so one table serves every build.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def _get(name: str) -> Callable[[], Any]:
    return lambda: os.environ.get(name)


_NAMES = (
    # vllm/envs.py: server, logging and usage-stats settings.
    "VLLM_HOST_IP", "VLLM_PORT", "VLLM_API_KEY", "VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT",
    "VLLM_CONFIGURE_LOGGING", "VLLM_LOGGING_LEVEL", "VLLM_LOGGING_PREFIX",
    "VLLM_LOGGING_STREAM", "VLLM_LOGGING_CONFIG_PATH", "VLLM_LOG_STATS_INTERVAL",
    "VLLM_NO_USAGE_STATS", "VLLM_DO_NOT_TRACK", "VLLM_USAGE_SOURCE", "VLLM_USAGE_STATS_SERVER",
    "VLLM_RPC_BASE_PATH", "VLLM_ENGINE_ITERATION_TIMEOUT_S", "VLLM_MODEL_REDIRECT_PATH",
    "VLLM_USE_MODELSCOPE", "VLLM_RINGBUFFER_WARNING_INTERVAL", "VLLM_NCCL_SO_PATH",
    "VLLM_TRACE_FUNCTION", "VLLM_PP_LAYER_PARTITION", "VLLM_FLASH_ATTN_VERSION",
    "VLLM_DISABLE_FLASHINFER_PREFILL", "VLLM_TARGET_DEVICE",
    # vllm/envs.py: what the club-3090 composes and Genesis stacks set (rigfleet's stacks too).
    "VLLM_WORKER_MULTIPROC_METHOD", "VLLM_USE_FLASHINFER_SAMPLER",
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN", "VLLM_MARLIN_USE_ATOMIC_ADD",
    "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "VLLM_SSM_CONV_STATE_LAYOUT",
    "VLLM_FLOAT32_MATMUL_PRECISION", "VLLM_USE_FUSED_MOE_GROUPED_TOPK",
)  # fmt: skip

environment_variables: dict[str, Callable[[], Any]] = {name: _get(name) for name in _NAMES}


def __getattr__(name: str) -> Any:
    if name in environment_variables:
        return environment_variables[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
