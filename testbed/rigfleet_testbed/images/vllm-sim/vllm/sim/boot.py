"""``vllm serve``: the boot sequence, its failure modes, the serving loop and shutdown.

Failures come in two kinds, as in real vLLM:

- *config* failures happen in the API server process while it builds the engine config
  (bad model path, the speculators regression, tensor parallel size above the GPU count,
  max-model-len above the model's): a plain traceback, exit 1.
- *engine* failures happen in the engine core process (no GPU, not enough free memory,
  TurboQuant on a hybrid model on a build without hybrid support and without Genesis P4, an
  INT4 Marlin layer narrower than the kernel's tile on a build that cannot pad it, broken
  shards, KV cache too small): vLLM logs
  ``EngineCore failed to start.`` with the root cause, and the API server then dies with
  ``RuntimeError: Engine core initialization failed. See root cause above. Failed core
  proc(s): {}``; exit 1.

The port is bound right away (a port clash fails first) but only listens once the engine is
ready, so clients see "connection refused" during boot, as with uvicorn.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

from vllm.sim import hardware, kvcache, logs, modelfiles, startup, weights
from vllm.sim.args import ServeConfig, parse_args
from vllm.sim.buildinfo import (
    REGRESSION_SPECULATORS_OSERROR,
    BuildInfo,
    GenesisState,
    load_build_info,
    load_genesis_state,
    marlin_pad_present,
    package_dir,
)
from vllm.sim.engine import Engine, EngineSettings
from vllm.sim.logs import Frame
from vllm.sim.metrics import Metrics
from vllm.sim.server import App, SimHTTPServer

ENGINE_WRAPPER = ("RuntimeError: Engine core initialization failed. See root cause above. "
                  "Failed core proc(s): {}")
# Marlin's smallest output tile (vLLM's GPTQ_MARLIN_MIN_THREAD_N).
GPTQ_MARLIN_MIN_THREAD_N = 64


class BootFailure(Exception):
    """Boot cannot continue; ``exc_line`` is the final traceback line (``Type: message``)."""

    def __init__(self, exc_line: str, stage: str, frames: list[Frame] | None = None):
        super().__init__(exc_line)
        self.exc_line = exc_line
        self.stage = stage  # "config" | "engine"
        self.frames = frames or []


@dataclass
class Booted:
    alloc: hardware.GpuAllocation
    plan: kvcache.KvPlan
    max_model_len: int


def _env_float(name: str, default: float) -> float:
    try:
        return max(0.0, float(os.environ.get(name, default)))
    except ValueError:
        return default


class Boot:
    """One run of ``vllm serve``."""

    def __init__(self, cfg: ServeConfig):
        self.cfg = cfg
        self.pkg = package_dir()
        self.site = str(self.pkg.parent)
        self.build: BuildInfo = load_build_info(self.pkg)
        self.genesis: GenesisState | None = load_genesis_state(self.pkg)
        self.boot_seconds = _env_float("SIM_BOOT_SECONDS", 3.0)
        self.release_seconds = _env_float("SIM_RELEASE_SECONDS", 1.0)
        self.stop = threading.Event()
        self.fatal = threading.Event()
        self.alloc: hardware.GpuAllocation | None = None

    # -- helpers -----------------------------------------------------------------------------
    def _f(self, rel: str, line: int, func: str, src: str) -> Frame:
        return (f"{self.site}/{rel}", line, func, src)

    def _cli_frames(self) -> list[Frame]:
        return [
            ("/usr/local/bin/vllm", 10, "<module>", "sys.exit(main())"),
            self._f("vllm/entrypoints/cli/main.py", 73, "main", "args.dispatch_function(args)"),
            self._f("vllm/entrypoints/cli/serve.py", 60, "cmd", "uvloop.run(run_server(args))"),
            self._f("vllm/entrypoints/openai/api_server.py", 1922, "run_server",
                    "await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)"),
            self._f("vllm/entrypoints/openai/api_server.py", 1941, "run_server_worker",
                    "async with build_async_engine_client("),
        ]

    def _pause(self, seconds: float) -> None:
        """Boot work takes time; SIGTERM during boot stops at once."""
        if seconds > 0 and self.stop.wait(seconds):
            raise KeyboardInterrupt

    def clock_scale(self) -> float:
        """Logged start-up seconds -> real ones: SIM_BOOT_SECONDS stands for a warm boot."""
        return self.boot_seconds / startup.REAL_WARM_BOOT_SECONDS

    def _share(self, fraction: float) -> None:
        self._pause(self.boot_seconds * fraction)

    def config_failure(self, exc_line: str, frames: list[Frame]) -> BootFailure:
        return BootFailure(exc_line, "config", self._cli_frames() + frames)

    def engine_failure(self, exc_line: str, frames: list[Frame]) -> BootFailure:
        core = [
            self._f("vllm/v1/engine/core.py", 834, "run_engine_core",
                    "engine_core = EngineCoreProc(*args, **kwargs)"),
            self._f("vllm/v1/engine/core.py", 606, "__init__",
                    "super().__init__(vllm_config, executor_class, log_stats,"),
            self._f("vllm/v1/engine/core.py", 102, "__init__",
                    "self.model_executor = executor_class(vllm_config)"),
        ]
        return BootFailure(exc_line, "engine", core + frames)

    # -- the sequence ------------------------------------------------------------------------
    def boot(self) -> Booted:
        cfg = self.cfg
        gpus = hardware.visible_gpus()
        if not gpus:
            raise self.engine_failure("RuntimeError: No CUDA GPUs are available", [
                self._f("vllm/v1/worker/gpu_worker.py", 194, "init_device",
                        "torch.cuda.set_device(self.device)"),
                self._f("torch/cuda/__init__.py", 402, "_lazy_init", "torch._C._cuda_init()"),
            ])
        logs.info("__init__.py:216", "Automatically detected platform cuda.")
        world = cfg.tensor_parallel_size * cfg.pipeline_parallel_size
        if world > len(gpus):
            raise self.config_failure(
                "pydantic_core._pydantic_core.ValidationError: 1 validation error for "
                f"ParallelConfig\n  Value error, World size ({world}) is larger than the number "
                f"of available GPUs ({len(gpus)}) in this node. If this is intentional and you "
                "are using:\n- ray, set '--distributed-executor-backend ray'.\n- "
                "multiprocessing, set '--nnodes' appropriately. [type=value_error, "
                "input_value=ArgsKwargs(()), input_type=ArgsKwargs]",
                [self._f("vllm/engine/arg_utils.py", 1512, "create_engine_config",
                         "parallel_config = ParallelConfig(")])
        try:
            model_path = modelfiles.resolve(cfg.model)
            info = modelfiles.load_config(model_path)
        except modelfiles.ModelFileError as err:
            raise self.config_failure(f"{err.exc_type}: {err.message}", [
                self._f("vllm/engine/arg_utils.py", 1290, "create_engine_config",
                        "maybe_override_with_speculators("),
                self._f("vllm/transformers_utils/config.py", 512,
                        "maybe_override_with_speculators",
                        "config_dict, _ = PretrainedConfig.get_config_dict("),
                self._f("transformers/configuration_utils.py", 662, "get_config_dict",
                        "config_dict, kwargs = cls._get_config_dict(pretrained_model_name_or_path,"
                        " **kwargs)"),
                self._f("transformers/utils/hub.py", 322, "cached_file",
                        "file = cached_files(path_or_repo_id=path_or_repo_id, "
                        "filenames=[filename], **kwargs)"),
            ]) from None
        if cfg.mtp_tokens and self.build.has(REGRESSION_SPECULATORS_OSERROR) \
                and modelfiles.is_local_path(cfg.model):
            # post-#41434 + transformers 5.8: the speculator probe validates the local path
            # as a Hub repo id and aborts the boot (club-3090 570fa712).
            raise self.config_failure(modelfiles.repo_id_error(cfg.model).exc_type + ": "
                                      + modelfiles.repo_id_error(cfg.model).message, [
                self._f("vllm/engine/arg_utils.py", 1290, "create_engine_config",
                        "maybe_override_with_speculators("),
                self._f("vllm/transformers_utils/config.py", 518,
                        "maybe_override_with_speculators",
                        "config_dict, _ = PretrainedConfig.get_config_dict("),
                self._f("transformers/configuration_utils.py", 662, "get_config_dict",
                        "config_dict, kwargs = cls._get_config_dict(pretrained_model_name_or_path,"
                        " **kwargs)"),
                self._f("transformers/utils/hub.py", 322, "cached_file",
                        "file = cached_files(path_or_repo_id=path_or_repo_id, "
                        "filenames=[filename], **kwargs)"),
                self._f("transformers/utils/hub.py", 533, "cached_files",
                        "raise OSError(f\"{e}\") from e"),
            ])
        max_len = cfg.max_model_len or info.max_position_embeddings
        if max_len > info.max_position_embeddings and os.environ.get(
                "VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0") not in ("1", "true", "True"):
            raise self.config_failure(
                "pydantic_core._pydantic_core.ValidationError: 1 validation error for "
                f"ModelConfig\n  Value error, User-specified max_model_len ({max_len}) is "
                f"greater than the derived max_model_len (max_position_embeddings="
                f"{info.max_position_embeddings} or model_max_length=None in model's "
                "config.json). To allow overriding this maximum, set the env var "
                "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with "
                "extreme caution. If the model uses relative position encoding (RoPE), positions "
                "exceeding derived_max_model_len lead to nan. If the model uses absolute position "
                "encoding, positions exceeding derived_max_model_len will cause a CUDA array "
                "out-of-bounds error. [type=value_error, input_value=ArgsKwargs(()), "
                "input_type=ArgsKwargs]",
                [self._f("vllm/engine/arg_utils.py", 1188, "create_model_config",
                         "return ModelConfig(")])
        logs.info("model.py:547", f"Resolved architecture: {info.architectures[0]}")
        logs.info("model.py:1510", f"Using max model len {max_len}")
        if cfg.kv_cache_dtype != "auto":
            logs.info("cache.py:180", f"Using {cfg.kv_cache_dtype} data type to store kv cache.")
        logs.info("scheduler.py:222", "Chunked prefill is enabled with max_num_batched_tokens="
                  f"{cfg.max_num_batched_tokens or 8192}.")
        if cfg.speculative_config:
            logs.info("speculative.py:245",
                      f"Speculative decoding: {json.dumps(cfg.speculative_config)}")
        self._share(0.1)

        # ---- engine core ----
        logs.info("core.py:93", f"Initializing a V1 LLM engine (v{self.build.version}) with "
                  f"config: model='{cfg.model}', speculative_config={cfg.speculative_config}, "
                  f"tokenizer='{cfg.model}', dtype=torch.float16, max_seq_len={max_len}, "
                  f"tensor_parallel_size={cfg.tensor_parallel_size}, "
                  f"pipeline_parallel_size={cfg.pipeline_parallel_size}, "
                  f"quantization={cfg.non_default.get('quantization')}, "
                  f"enforce_eager={cfg.enforce_eager}, kv_cache_dtype={cfg.kv_cache_dtype}, "
                  f"served_model_name={cfg.served_model_names[0]}, "
                  f"enable_prefix_caching={cfg.enable_prefix_caching}")
        if cfg.kv_cache_dtype.startswith("turboquant"):
            # Hybrid support arrived with vllm#39931 (0.20.2rc1.dev60); before it Genesis P4
            # text-patches the refusal away (vllm_builds.turboquant_hybrid). P4 has no switch
            # in either generation (env_flag GENESIS_LEGACY_P4): Genesis v7.72.2 applies it on
            # every run (apply_patch_4_tq_hybrid in vllm/_genesis/patches/apply_all.py), and so
            # does v12.1.0 although its registry marks it retired: the same hook in
            # sndr/apply/_per_patch_dispatch.py runs outside the dispatcher's lifecycle gate
            # (sndr/dispatcher/decision.py). On hybrid-capable builds it finds nothing to patch.
            if info.hybrid and not (self.build.turboquant_hybrid or self._has_patch("P4")):
                raise self.engine_failure(
                    "NotImplementedError: TurboQuant KV cache is not supported for hybrid "
                    "attention models (sliding-window / linear attention layers present). "
                    "Only models with standard attention (e.g. GQA) are supported.", [
                        self._f("vllm/v1/executor/multiproc_executor.py", 596, "worker_main",
                                "worker = WorkerProc(*args, **kwargs)"),
                        self._f("vllm/v1/attention/backends/turboquant_attn.py", 118,
                                "validate_configuration",
                                "raise NotImplementedError("),
                    ])
            logs.info("cuda.py:368", "Using TurboQuant attention backend "
                      f"({cfg.kv_cache_dtype}) for full-attention layers.")
        try:
            self.alloc = hardware.allocate(gpus[: cfg.tensor_parallel_size],
                                           cfg.gpu_memory_utilization)
        except hardware.FreeMemoryError as err:
            raise self.engine_failure(f"ValueError: {err.message()}", [
                self._f("vllm/v1/executor/multiproc_executor.py", 596, "worker_main",
                        "worker = WorkerProc(*args, **kwargs)"),
                self._f("vllm/v1/worker/gpu_worker.py", 222, "init_device",
                        "self.requested_memory = request_memory(init_snapshot, self.cache_config)"),
                self._f("vllm/v1/worker/utils.py", 377, "request_memory", "raise ValueError("),
            ]) from None
        card_gib = min(g.memory_total_mib for g in gpus[: cfg.tensor_parallel_size]) / 1024.0
        logs.info("gpu_model_runner.py:3346", f"Starting to load model {cfg.model}...")
        self._check_marlin(info)
        try:
            modelfiles.check_weights(model_path)
            weights.set_served(weights.inspect(model_path))
        except modelfiles.ModelFileError as err:
            raise self.engine_failure(f"{err.exc_type}: {err.message}", [
                self._f("vllm/model_executor/model_loader/default_loader.py", 301,
                        "load_weights",
                        "loaded_weights = model.load_weights(self.get_all_weights(model_config, "
                        "model))"),
                self._f("vllm/model_executor/model_loader/weight_utils.py", 612,
                        "safetensors_weights_iterator",
                        "with safe_open(st_file, framework=\"pt\") as f:"),
            ]) from None
        load_s = self.boot_seconds * 0.4
        self._pause(load_s)
        weights_gib = kvcache.MODEL_WEIGHTS_BYTES / kvcache.GIB / cfg.tensor_parallel_size
        logs.info("default_loader.py:267", f"Loading weights took {load_s:.2f} seconds")
        logs.info("gpu_model_runner.py:3375", f"Model loading took {weights_gib:.4f} GiB and "
                  f"{load_s + 0.5:.6f} seconds")
        startup.compile_model(cfg, self.build, self._pause, self.clock_scale())
        crash = os.environ.get("SIM_FAULT_CRASH_AT_BOOT")
        if crash:
            line = crash if _looks_like_exception(crash) else f"RuntimeError: {crash}"
            raise self.engine_failure(line, [
                self._f("vllm/v1/worker/gpu_worker.py", 263, "determine_available_memory",
                        "self.model_runner.profile_run()"),
            ])
        try:
            plan = kvcache.plan(card_gib, cfg.gpu_memory_utilization, cfg.tensor_parallel_size,
                                cfg.kv_cache_dtype, bool(cfg.mtp_tokens), max_len)
        except kvcache.KvCacheError as err:
            raise self.engine_failure(f"ValueError: {err}", [
                self._f("vllm/v1/engine/core.py", 215, "_initialize_kv_caches",
                        "kv_cache_configs = get_kv_cache_configs(vllm_config, kv_cache_specs,"),
                self._f("vllm/v1/core/kv_cache_utils.py", 1183, "check_enough_kv_cache_memory",
                        "raise ValueError("),
            ]) from None
        self._share(0.3)
        logs.info("gpu_worker.py:298", f"Available KV cache memory: {plan.kv_gib_per_card:.2f} GiB")
        logs.info("kv_cache_utils.py:1087", f"GPU KV cache size: {plan.num_tokens:,} tokens")
        logs.info("kv_cache_utils.py:1091", f"Maximum concurrency for {max_len:,} tokens per "
                  f"request: {plan.max_concurrency:.2f}x")
        sizes = startup.capture_sizes(cfg)
        if not cfg.enforce_eager:
            sizes = self._p66_filter(sizes)
        if startup.capture_graphs(cfg, self._pause, self.clock_scale(), sizes).mode != "NONE":
            self._share(0.15)
            logs.info("gpu_model_runner.py:3480", "Graph capturing finished in "
                      f"{self.boot_seconds * 0.15:.0f} secs, took 0.55 GiB")
        logs.info("core.py:218", "init engine (profile, create kv cache, warmup model) took "
                  f"{self.boot_seconds * 0.6:.2f} seconds")
        return Booted(self.alloc, plan, max_len)

    def _has_patch(self, patch: str) -> bool:
        return self.genesis is not None and self.genesis.has_patch(patch)

    def _check_marlin(self, info: modelfiles.ModelInfo) -> None:
        """INT4 Marlin needs each rank's output shard to be at least one tile wide.

        Qwen3.6's GDN in_proj_ba has 2 x linear_num_value_heads outputs (96 for the 27B), so at
        tensor-parallel-size 2 a rank holds 48 < GPTQ_MARLIN_MIN_THREAD_N. Builds before v0.21.0
        die here unless the pad fix is in marlin.py (the vllm#40361 overlay or Genesis P87);
        v0.21.0 boots this model, v0.24.0 pads natively (vllm_builds.marlin_sub_tile_n).
        """
        tp = self.cfg.tensor_parallel_size
        if not info.marlin_int4 or not info.linear_num_value_heads or tp < 2:
            return
        out_features = 2 * info.linear_num_value_heads // tp
        if out_features >= GPTQ_MARLIN_MIN_THREAD_N or self.build.marlin_sub_tile_n != \
                "needs-pad" or marlin_pad_present(self.pkg):
            return
        raise self.engine_failure(
            "ValueError: Failed to find a kernel that can implement the WNA16 linear layer. "
            "Reasons: \n MarlinLinearKernel cannot implement due to: GPTQ_MARLIN_MIN_THREAD_N "
            f"({GPTQ_MARLIN_MIN_THREAD_N}) > out_features ({out_features})", [
                self._f("vllm/v1/executor/multiproc_executor.py", 596, "worker_main",
                        "worker = WorkerProc(*args, **kwargs)"),
                self._f("vllm/v1/worker/gpu_model_runner.py", 3350, "load_model",
                        "self.model = model_loader.load_model("),
                self._f("vllm/model_executor/models/qwen3_next.py", 412, "__init__",
                        "self.in_proj_ba = ColumnParallelLinear("),
                self._f("vllm/model_executor/layers/quantization/gptq_marlin.py", 478,
                        "create_weights", "kernel_type = choose_mp_linear_kernel(mp_linear_"
                        "kernel_config)"),
                self._f("vllm/model_executor/kernels/linear/__init__.py", 101,
                        "choose_mp_linear_kernel", "raise ValueError("),
            ])

    def _p66_filter(self, sizes: list[int]) -> list[int]:
        """The capture sizes Genesis P66's patched sizing code keeps (upstream wiring
        patch_66), and its log line: sizes not divisible by the spec-decode query length
        (1 + K) are dropped. Without MTP or without P66's marker, ``sizes`` as given.

        vLLM's default sizes (:func:`startup.capture_sizes`) for max-num-seqs 2 with MTP n=3
        are [1, 2, 4, 8, 16] -> kept [4, 8, 16], removed [1, 2] (the club-3090 boot the seed
        document quotes).
        """
        k = self.cfg.num_speculative_tokens
        if not (k and self._has_patch("P66")):
            return sizes
        q = 1 + k
        kept = sorted(s for s in sizes if s % q == 0)
        removed = sorted(set(sizes) - set(kept))
        if removed:
            logs.info("vllm.py:1530", f"[Genesis P66] Filtered cudagraph_capture_sizes for "
                      f"spec-decode uniform_query_len={q}: removed {len(removed)} non-divisible "
                      f"sizes {removed}; kept {kept}.")
        return kept

    # -- failure reporting -------------------------------------------------------------------
    def report(self, failure: BootFailure) -> None:
        if failure.stage == "engine":
            logs.error("core.py:843", "EngineCore failed to start.")
            logs.error_traceback("core.py:843", failure.frames, failure.exc_line)
            logs.print_traceback(self._cli_frames() + [
                self._f("vllm/v1/engine/core_client.py", 97, "make_async_mp_client",
                        "return AsyncMPClient(*client_args)"),
                self._f("vllm/v1/engine/utils.py", 919, "wait_for_engine_startup",
                        "raise RuntimeError("),
            ], ENGINE_WRAPPER)
        else:
            logs.print_traceback(failure.frames, failure.exc_line)

    # -- serving -----------------------------------------------------------------------------
    def run(self) -> int:
        cfg = self.cfg
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop.set())
        logs.info("api_server.py:1880", f"vLLM API server version {self.build.version}")
        logs.info("utils.py:328", f"non-default args: {cfg.non_default}")
        host = cfg.host if cfg.host is not None else "0.0.0.0"
        try:
            server = SimHTTPServer((host, cfg.port))
        except OSError as exc:
            logs.print_traceback(self._cli_frames()[:4] + [
                self._f("vllm/entrypoints/openai/api_server.py", 1839, "create_server_socket",
                        "sock.bind(addr)")], f"OSError: [Errno {exc.errno}] {exc.strerror}")
            return 1
        try:
            booted = self.boot()
        except BootFailure as failure:
            self.report(failure)
            self._release_now()
            server.server_close()
            return 1
        except KeyboardInterrupt:
            server.server_close()
            hardware.release_slowly(self.alloc, self.release_seconds)
            return 0

        metrics = Metrics(
            cfg.served_model_names[0], cfg.mtp_tokens, booted.plan.num_tokens,
            {"block_size": "16", "cache_dtype": cfg.kv_cache_dtype,
             "enable_prefix_caching": str(cfg.enable_prefix_caching),
             "gpu_memory_utilization": str(cfg.gpu_memory_utilization),
             "num_gpu_blocks": str(booted.plan.num_tokens // 16),
             "num_speculative_tokens": str(cfg.num_speculative_tokens)},
            enabled=not cfg.disable_log_stats, max_model_len=booted.max_model_len)
        settings = EngineSettings.from_env()
        engine = Engine(cfg, self.build, self.genesis, booted.plan.num_tokens,
                        booted.max_model_len, metrics, on_fatal=self.fatal.set, settings=settings,
                        alloc=self.alloc)
        server.app = App(cfg, engine, metrics, self.build.version, booted.max_model_len,
                         hang=settings.hang)
        port = server.server_address[1]
        logs.info("api_server.py:1971", f"Starting vLLM API server 0 on http://{host}:{port}")
        logs.info("launcher.py:37", "Available routes are:")
        for route, methods in (("/health", "GET"), ("/load", "GET"), ("/ping", "POST, GET"),
                               ("/tokenize", "POST"), ("/detokenize", "POST"),
                               ("/v1/models", "GET"), ("/version", "GET"),
                               ("/v1/chat/completions", "POST"), ("/v1/completions", "POST"),
                               ("/invocations", "POST"), ("/metrics", "GET")):
            logs.info("launcher.py:45", f"Route: {route}, Methods: {methods}")
        server.start_listening()
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                  name="http", daemon=True)
        thread.start()
        logs.uvicorn(f"Started server process [{os.getpid()}]")
        logs.uvicorn("Waiting for application startup.")
        logs.uvicorn("Application startup complete.")
        if not cfg.disable_log_stats:
            interval = _env_float("VLLM_LOG_STATS_INTERVAL", 10.0) or 10.0
            threading.Thread(target=self._stats_loop, args=(metrics, interval), daemon=True,
                             name="stats").start()
        while not (self.stop.is_set() or self.fatal.is_set()):
            self.stop.wait(0.5)
        if self.fatal.is_set():
            time.sleep(0.5)  # let the in-flight request get its error out
        logs.uvicorn("Shutting down")
        server.shutdown()
        server.server_close()
        logs.uvicorn("Waiting for application shutdown.")
        logs.uvicorn("Application shutdown complete.")
        logs.uvicorn(f"Finished server process [{os.getpid()}]")
        if self.fatal.is_set():
            self._release_now()  # the process dies; the driver frees its memory
            return 1
        hardware.release_slowly(self.alloc, self.release_seconds)
        return 0

    def _stats_loop(self, metrics: Metrics, interval: float) -> None:
        while not self.stop.wait(interval):
            metrics.log_stats()

    def _release_now(self) -> None:
        if self.alloc is not None:
            self.alloc.release()


def _looks_like_exception(text: str) -> bool:
    head = text.split(":", 1)[0]
    return ":" in text and " " not in head and (head.endswith(("Error", "Exception"))
                                                or "." in head)


def serve(argv: list[str]) -> int:
    """Entry point of ``vllm serve``; returns the exit status."""
    cfg = parse_args(argv)
    return Boot(cfg).run()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(serve(sys.argv[1:]))
