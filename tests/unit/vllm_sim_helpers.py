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

SIM_DIR = Path(__file__).resolve().parents[2] / "testbed" / "rigfleet_testbed" / "images" / "vllm-sim"
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


def make_model(base: Path, shards: int = 4) -> Path:
    model = base / "qwen3.6-27b-autoround-int4"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
        "text_config": {"max_position_embeddings": 262144, "mtp_num_hidden_layers": 1,
                        "layer_types": ["linear_attention"] * 3 + ["full_attention"]},
    }))
    weight_map = {}
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        _shard(model / name, {f"layer{i}.weight": 8})
        weight_map[f"layer{i}.weight"] = name
    (model / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 16 * shards}, "weight_map": weight_map}))
    return model


def make_package(base: Path, version: str = "0.20.2rc1.dev9+g01d4d1ad3",
                 commit: str = "01d4d1ad375dc5854779c593eee093bcebb0cada",
                 regressions: tuple[str, ...] = (),
                 genesis_applied: list[str] | None = None) -> Path:
    """A site dir holding a copy of the simulator package with the given build info."""
    site = base / "site"
    if site.exists():
        shutil.rmtree(site)
    shutil.copytree(SIM_DIR / "vllm", site / "vllm",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (site / "vllm" / "_build_info.json").write_text(json.dumps(
        {"version": version, "commit": commit, "regressions": list(regressions)}))
    if genesis_applied is not None:
        (site / "vllm" / "_genesis_applied.json").write_text(json.dumps(
            {"applied": genesis_applied, "genesis_version": "v7.72.2"}))
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
