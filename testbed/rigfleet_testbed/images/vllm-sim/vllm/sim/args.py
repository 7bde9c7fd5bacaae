"""``vllm serve`` arguments: the argument table of the simulated version, parsed the way vLLM does.

Flags the simulator models change behaviour; the other flags the club-3090 stacks pass are
accepted and recorded (so a typo still fails like real vLLM: exit 2 with
``vllm serve: error: unrecognized arguments: ...``). Which flags exist depends on the build's
version (:data:`VERSIONED_FLAGS`, each with its source); the ``--kv-cache-dtype`` choices are
the build's (``kv_cache_dtypes`` in ``_build_info.json``): vLLM derives them from its
``CacheDType`` literal, so a dtype the version lacks is argparse's "invalid choice", exit 2.

:func:`make_arg_parser` is the entry point real vLLM offers (``vllm.entrypoints.openai.cli_args``
before 0.29, ``vllm.entrypoints.launchers.cli_args`` from 0.29: the build's layer puts it where
its version has it), so a tool can check a command line with the image's own parser without
starting an engine (``rigfleet.vllmargs``).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm.sim.buildinfo import BuildInfo, load_build_info
from vllm.utils.argparse_utils import FlexibleArgumentParser

# vLLM's default when neither --model nor a positional model is given.
DEFAULT_MODEL = "Qwen/Qwen3-0.6B"
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
SPEC_METHODS = ("mtp", "qwen3_next_mtp", "eagle", "eagle3", "ngram", "medusa", "draft_model",
                "deepseek_mtp", "suffix")

# Flags that exist only in some versions: (flag, first version with it or None, first version
# without it or None, source). Flags gone before the oldest simulated build (0.20.0) are not in
# the table at all, so every build refuses them: --disable-log-requests (deprecated by
# vllm#21739 for --enable-log-requests, removed by vllm#29402 in v0.12.0) and --swap-space
# (removed by vllm#36216, 2026-03-06; absent from EngineArgs from 0.18.0, unsloth-zoo#1210).
VERSIONED_FLAGS: tuple[tuple[str, str | None, str | None, str], ...] = (
    # "The two flags v0.27.0 removed" (runpod-workers/worker-vllm#324, its serve-flag drift
    # check against vllm/vllm-openai:v0.27.0, 2026-08-10).
    ("--max-num-partial-prefills", None, "0.27.0", "runpod-workers/worker-vllm#324"),
    ("--max-long-partial-prefills", None, "0.27.0", "runpod-workers/worker-vllm#324"),
)


@dataclass
class ServeConfig:
    """Everything ``vllm serve`` was asked to do (typed, validated)."""

    model: str
    served_model_names: list[str]
    host: str | None
    port: int
    api_keys: list[str]
    max_model_len: int | None
    gpu_memory_utilization: float
    kv_cache_dtype: str
    speculative_config: dict[str, Any] | None
    tensor_parallel_size: int
    pipeline_parallel_size: int
    max_num_seqs: int
    max_num_batched_tokens: int | None
    enable_prefix_caching: bool
    async_scheduling: bool
    enable_auto_tool_choice: bool
    tool_call_parser: str | None
    reasoning_parser: str | None
    default_chat_template_kwargs: dict[str, Any]
    disable_log_stats: bool
    enforce_eager: bool
    cudagraph_capture_sizes: list[int] | None = None
    max_cudagraph_capture_size: int | None = None
    non_default: dict[str, Any] = field(default_factory=dict)

    @property
    def mtp_tokens(self) -> int:
        """Number of MTP draft tokens (0 when speculative decoding is off or not MTP)."""
        spec = self.speculative_config or {}
        method = str(spec.get("method", "")).lower()
        if "mtp" not in method:
            return 0
        return int(spec.get("num_speculative_tokens") or 1)

    @property
    def num_speculative_tokens(self) -> int:
        spec = self.speculative_config or {}
        return int(spec.get("num_speculative_tokens") or 0) if spec else 0


def _json_arg(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        # argparse turns this into "argument --x: invalid loads value: '...'" like vLLM.
        raise argparse.ArgumentTypeError(f"invalid JSON: {value!r}") from None


def _json_obj(value: str) -> dict[str, Any]:
    obj = _json_arg(value)
    if not isinstance(obj, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {value!r}")
    return obj


def _util(value: str) -> float:
    v = float(value)
    if not 0.0 < v <= 1.0:
        raise argparse.ArgumentTypeError(
            f"GPU memory utilization must be within (0, 1]. Got {v}.")
    return v


def _max_len(value: str) -> int:
    """vLLM accepts human-readable lengths (``262144``, ``256k``, ``1m``)."""
    text = value.strip().lower()
    mult = 1
    if text and text[-1] in "km":
        mult = 1000 if text[-1] == "k" else 1000_000
        text = text[:-1]
    try:
        return int(float(text) * mult) if mult != 1 else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid max model len {value!r}") from None


def has_flag(flag: str, version: str) -> bool:
    """Does vLLM ``version`` have ``flag`` (:data:`VERSIONED_FLAGS`; other flags: yes)?"""
    from packaging.version import InvalidVersion, Version

    for name, since, until, _source in VERSIONED_FLAGS:
        if name != flag:
            continue
        try:
            v = Version(version)
        except InvalidVersion:
            return True
        return (since is None or v >= Version(since)) and (until is None or v < Version(until))
    return True


def build_parser(kv_cache_dtypes: Sequence[str] | None = None,
                 version: str | None = None) -> argparse.ArgumentParser:
    """The ``vllm serve`` parser of a build of ``version`` offering ``kv_cache_dtypes``
    (default: this one's)."""
    p = FlexibleArgumentParser(
        prog="vllm serve", usage="vllm serve [model_tag] [options]",
        description="Launch a local OpenAI-compatible API server to serve LLM completions via "
                    "HTTP (simulator).",
    )
    p.add_argument("model_tag", nargs="?", default=None, help="The model tag to serve.")
    return add_serve_args(p, kv_cache_dtypes, version)


def make_arg_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """vLLM's entry point: add this build's ``vllm serve`` options to ``parser``."""
    return add_serve_args(parser)


def validate_parsed_serve_args(args: argparse.Namespace) -> None:
    """vLLM's check of a parsed command line (``cli_args``): automatic tool choice needs a
    tool-call parser (TypeError, as vLLM raises it)."""
    if getattr(args, "enable_auto_tool_choice", False) and not getattr(args, "tool_call_parser",
                                                                       None):
        raise TypeError("Error: --enable-auto-tool-choice requires --tool-call-parser")


def add_serve_args(p: argparse.ArgumentParser, kv_cache_dtypes: Sequence[str] | None = None,
                   version: str | None = None) -> argparse.ArgumentParser:
    """Add the options of a build of ``version`` (default: this one's) to ``p``."""
    info = load_build_info() if kv_cache_dtypes is None or version is None else None
    dtypes = tuple(kv_cache_dtypes or (info.kv_cache_dtypes if info else ()))
    ver = version or (info.version if info else "0.0.0+unknown")
    # Model / engine
    p.add_argument("--model", default=None)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--revision", default=None)
    p.add_argument("--max-model-len", type=_max_len, default=None)
    p.add_argument("--gpu-memory-utilization", type=_util, default=0.9)
    p.add_argument("--kv-cache-dtype", choices=dtypes, default="auto")
    p.add_argument("--speculative-config", type=_json_obj, default=None)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--quantization", "-q", default=None)
    p.add_argument("--dtype", choices=DTYPES, default="auto")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    # Async scheduling is on by default (club-3090's v0.27.1 composes turn it off with
    # --no-async-scheduling against vllm#50021).
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--disable-custom-all-reduce", action="store_true")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--language-model-only", action="store_true")
    p.add_argument("--override-generation-config", type=_json_obj, default=None)
    p.add_argument("--generation-config", default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--long-prefill-token-threshold", type=int, default=None)
    p.add_argument("--distributed-executor-backend", default=None)
    p.add_argument("--hf-overrides", type=_json_obj, default=None)
    p.add_argument("--compilation-config", "-O", "-cc", default=None)
    p.add_argument("--max-cudagraph-capture-size", type=int, default=None)
    p.add_argument("--cudagraph-capture-sizes", nargs="+", type=int, default=None)
    p.add_argument("--limit-mm-per-prompt", type=_json_obj, default=None)
    p.add_argument("--mamba-cache-mode", default=None)
    # Frontend
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", nargs="+", default=None)
    p.add_argument("--chat-template", default=None)
    p.add_argument("--default-chat-template-kwargs", type=_json_obj, default=None)
    p.add_argument("--reasoning-parser", default=None)
    p.add_argument("--enable-auto-tool-choice", action="store_true")
    p.add_argument("--tool-call-parser", default=None)
    p.add_argument("--disable-log-stats", action="store_true")
    p.add_argument("--enable-log-requests", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--uvicorn-log-level", default="info")
    p.add_argument("--disable-uvicorn-access-log", action="store_true")
    p.add_argument("--disable-fastapi-docs", action="store_true")
    p.add_argument("--allowed-origins", type=_json_arg, default=None)
    for flag, *_ in VERSIONED_FLAGS:  # all of them take a number
        if has_flag(flag, ver):
            p.add_argument(flag, type=int, default=1)
    return p


def parse_args(argv: Sequence[str], environ: dict[str, str] | None = None,
               build: BuildInfo | None = None) -> ServeConfig:
    """Parse ``vllm serve`` arguments for ``build`` (default: this package's build info);
    argparse exits with status 2 on bad input."""
    env = os.environ if environ is None else environ
    info = build or load_build_info()
    parser = build_parser(info.kv_cache_dtypes, info.version)
    ns = parser.parse_args(list(argv))
    defaults = vars(parser.parse_args([]))
    model = ns.model_tag or ns.model or DEFAULT_MODEL
    if ns.tensor_parallel_size < 1:
        parser.error("argument --tensor-parallel-size: must be >= 1")
    if ns.max_num_seqs < 1:
        parser.error("argument --max-num-seqs: must be >= 1")
    spec = ns.speculative_config
    if spec is not None:
        method = str(spec.get("method", "")).lower()
        if method and method not in SPEC_METHODS:
            parser.error(f"argument --speculative-config: unknown method {spec.get('method')!r}")
        n = spec.get("num_speculative_tokens")
        if n is not None and (not isinstance(n, int) or n < 1):
            parser.error("argument --speculative-config: num_speculative_tokens must be a "
                         "positive integer")
    keys = list(ns.api_key or [])
    if not keys and env.get("VLLM_API_KEY"):
        keys = [env["VLLM_API_KEY"]]
    non_default = {k: v for k, v in vars(ns).items()
                   if k not in ("model_tag",) and v != defaults.get(k)}
    if ns.model_tag:
        non_default["model"] = model
    return ServeConfig(
        model=model,
        served_model_names=list(ns.served_model_name or [model]),
        host=ns.host,
        port=ns.port,
        api_keys=keys,
        max_model_len=ns.max_model_len,
        gpu_memory_utilization=ns.gpu_memory_utilization,
        kv_cache_dtype=ns.kv_cache_dtype,
        speculative_config=spec,
        tensor_parallel_size=ns.tensor_parallel_size,
        pipeline_parallel_size=ns.pipeline_parallel_size,
        max_num_seqs=ns.max_num_seqs,
        max_num_batched_tokens=ns.max_num_batched_tokens,
        # vLLM V1 turns prefix caching on by default.
        enable_prefix_caching=ns.enable_prefix_caching is not False,
        async_scheduling=ns.async_scheduling is not False,
        enable_auto_tool_choice=ns.enable_auto_tool_choice,
        tool_call_parser=ns.tool_call_parser,
        reasoning_parser=ns.reasoning_parser,
        default_chat_template_kwargs=dict(ns.default_chat_template_kwargs or {}),
        disable_log_stats=ns.disable_log_stats,
        enforce_eager=ns.enforce_eager,
        cudagraph_capture_sizes=list(ns.cudagraph_capture_sizes or []) or None,
        max_cudagraph_capture_size=ns.max_cudagraph_capture_size,
        non_default=non_default,
    )
