"""Helpers for the vLLM simulator tests: a temp GPU root, a fake model, a server process.

Each server runs as a subprocess from a private copy of the ``vllm`` package, so a test can
give it its own ``_build_info.json`` / ``_genesis_applied.json`` exactly as an image build and
Genesis would, without touching the source tree.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rigfleet_testbed import vllm_builds
from rigfleet_testbed.genesis_patches import TEXT_PATCHES

SIM_DIR = (Path(__file__).resolve().parents[2] / "testbed" / "rigfleet_testbed" / "images"
           / "vllm-sim")
if str(SIM_DIR) not in sys.path:
    sys.path.insert(0, str(SIM_DIR))

MTP = '{"method":"mtp","num_speculative_tokens":3}'
FILLER = (
    "The history of computing stretches from mechanical calculators through vacuum tubes, "
    "transistors and integrated circuits to the microprocessors of today; each generation "
    "made machines smaller, faster and cheaper, and brought computation to more people and "
    "more problems than the one before it. "
)


def make_gpu_root(base: Path, cards: int = 2, memory_mib: int = 24576,
                  loaded: bool = True) -> Path:
    root = base / "nvidia-sim"
    root.mkdir(parents=True, exist_ok=True)
    gpus = [{"index": i, "name": "NVIDIA GeForce RTX 3090", "uuid": f"GPU-test-{i}",
             "pci_bus_id": f"00000000:{1 + 32 * i:02X}:00.0", "memory_total_mib": memory_mib}
            for i in range(cards)]
    (root / "hardware.json").write_text(json.dumps({"nvlink": False, "gpus": gpus}))
    if loaded:
        (root / "loaded").write_text("580.105.08\n")
    return root


def _shard(path: Path, tensors: dict[str, int]) -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, n in tensors.items():
        header[name] = {"dtype": "F16", "shape": [n], "data_offsets": [offset, offset + 2 * n]}
        offset += 2 * n
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + b"\0" * offset)


def make_model(base: Path, shards: int = 4, quantized: bool = True) -> Path:
    """A small model directory shaped like Lorbus/Qwen3.6-27B-int4-AutoRound (its config's
    GDN head count and AutoRound INT4 quantization, which is what Marlin sees)."""
    model = base / "qwen3.6-27b-autoround-int4"
    model.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
        "text_config": {"max_position_embeddings": 262144, "mtp_num_hidden_layers": 1,
                        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
                        "linear_num_value_heads": 48},
    }
    if quantized:
        config["quantization_config"] = {"quant_method": "auto-round", "bits": 4,
                                         "group_size": 128}
    (model / "config.json").write_text(json.dumps(config))
    weight_map = {}
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        _shard(model / name, {f"layer{i}.weight": 8})
        weight_map[f"layer{i}.weight"] = name
    (model / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 16 * shards}, "weight_map": weight_map}))
    return model


# The build a test server is unless it says otherwise: a release on which both stacks boot
# clean (int8_per_token_head, TurboQuant on hybrid, Marlin padding) and that carries neither
# vllm#50021 nor vllm#43559.
DEFAULT_TAG = "v0.24.0"
# Where each Genesis patch a test names leaves its marker (the fixture's text-patch targets;
# rebind-only patches get one in a file of their own kind).
_MARKER_FILES = {pid: t.target for pid, t in TEXT_PATCHES.items()}


def make_package(base: Path, tag: str = DEFAULT_TAG, *, version: str | None = None,
                 commit: str | None = None, regressions: tuple[str, ...] | None = None,
                 genesis_applied: list[str] | None = None) -> Path:
    """A site dir holding a copy of the simulator package as the image of ``tag`` has it.

    ``version``/``commit``/``regressions`` override the build info (a hypothetical build);
    ``genesis_applied`` (ids or env-style names such as ``P67_TQ_MULTI_QUERY_KERNEL``) leaves
    the ``[Genesis <id>`` markers Genesis' text patches would.
    """
    site = base / "site"
    if site.exists():
        shutil.rmtree(site)
    shutil.copytree(SIM_DIR / "vllm", site / "vllm",
                    ignore=shutil.ignore_patterns("__pycache__"))
    overrides: dict[str, Any] = {}
    if version is not None:
        overrides["version"] = version
    if commit is not None:
        overrides["commit"] = commit
    if regressions is not None:
        overrides["regressions"] = list(regressions)
    vllm_builds.layer_files(vllm_builds.by_tag(tag), overrides).write(site)
    for name in genesis_applied or []:
        pid = name.split("_", 1)[0]
        target = site / "vllm" / _MARKER_FILES.get(pid, "v1/worker/genesis_rebinds.py")
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a", encoding="utf-8") as fh:
            fh.write(f"# [Genesis {pid}] (left by the test, as Genesis' patch would)\n")
    return site


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Response:
    status: int
    body: bytes
    headers: dict[str, str]

    def json(self) -> Any:
        return json.loads(self.body)


class SimServer:
    """``vllm serve`` as a subprocess on 127.0.0.1."""

    def __init__(self, site: Path, gpu_root: Path, model: Path, args: list[str],
                 env: dict[str, str] | None = None, log: Path | None = None,
                 port: int | None = None):
        self.log = log or (site.parent / f"vllm-{time.monotonic_ns()}.log")
        self.port = port
        full_env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("SIM_", "VLLM_", "NVIDIA_", "CUDA_"))}
        full_env.update({
            "PYTHONPATH": str(site), "NVIDIA_SIM_ROOT": str(gpu_root),
            "NVIDIA_SIM_HARDWARE": str(gpu_root / "hardware.json"),
            "SIM_BOOT_SECONDS": "0", "SIM_RELEASE_SECONDS": "0.05",
            "SIM_TOKENS_PER_SECOND": "200000", "PYTHONDONTWRITEBYTECODE": "1",
            # torch.compile's cache (simulated) stays inside the test's directory.
            "VLLM_CACHE_ROOT": str(site.parent / "vllm-cache"),
        })
        full_env.update(env or {})
        cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "--model",
               str(model), "--host", "127.0.0.1", "--port", str(port or 0), *args]
        self._fh = open(self.log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, env=full_env, stdout=self._fh,
                                     stderr=subprocess.STDOUT, cwd=str(site.parent))

    # -- lifecycle ---------------------------------------------------------------------------
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 15.0) -> SimServer:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.output()
            if "Application startup complete." in out:
                m = re.search(r"Starting vLLM API server 0 on http://[^:]+:(\d+)", out)
                assert m, out
                self.port = int(m.group(1))
                return self
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}:\n{out}")
            time.sleep(0.02)
        raise AssertionError(f"server not ready in {timeout}s:\n{self.output()}")

    def wait_exit(self, timeout: float = 15.0) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._fh.close()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            self._fh.close()

    def __enter__(self) -> SimServer:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.stop(signal.SIGKILL)

    # -- HTTP --------------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None,
                headers: dict[str, str] | None = None, timeout: float = 30.0,
                raw: bytes | None = None) -> Response:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = raw if raw is not None else (
                json.dumps(body).encode() if body is not None else None)
            hdrs = {"content-type": "application/json", **(headers or {})}
            conn.request(method, path, body=data, headers=hdrs)
            resp = conn.getresponse()
            return Response(resp.status, resp.read(), {k.lower(): v for k, v in
                                                       resp.getheaders()})
        finally:
            conn.close()

    def chat(self, messages: list[dict[str, Any]], **kw: Any) -> Response:
        headers = kw.pop("headers", None)
        body = {"model": kw.pop("model", "qwen3.6-27b-autoround"), "messages": messages, **kw}
        return self.request("POST", "/v1/chat/completions", body, headers=headers)

    def stream_chat(self, messages: list[dict[str, Any]], **kw: Any) -> list[dict[str, Any]]:
        """SSE events of a streamed chat completion (the final ``[DONE]`` as a string)."""
        resp = self.chat(messages, stream=True, **kw)
        assert resp.status == 200, resp.body
        assert resp.headers["content-type"].startswith("text/event-stream")
        events: list[Any] = []
        for block in resp.body.decode().split("\n\n"):
            if not block.strip():
                continue
            assert block.startswith("data: "), block
            payload = block[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
        return events

    def metrics(self) -> dict[str, float]:
        """``/metrics`` samples as {"name{labels}": value}."""
        text = self.request("GET", "/metrics").body.decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out


def metric(samples: dict[str, float], name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for key, value in samples.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += value
    return total


def needle_prompt(filler_units: int, depth: float, secret: str, salt: str) -> str:
    """verify-stress style NIAH prompt: salt, filler, the needle at ``depth``, the question."""
    before = int(filler_units * depth)
    return (f"SESSION-{salt}. " + FILLER * before
            + f"IMPORTANT MEMORY: The hidden phrase is '{secret}'. Remember this exactly. "
            + FILLER * (filler_units - before)
            + "\n\nWhat is the hidden phrase? Reply with only the phrase.")
