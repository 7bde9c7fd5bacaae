"""Stacks on the host: docker compose, container state, GPU memory, boot-failure diagnosis;
``SystemOps`` (``steps.Ops``; fakes in tests) is the one place that runs commands::

    classify_boot_failure(docker_logs_text)   # BootFailure(kind='transformers-oserror', ...)
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from .drain import draining_workers
from .layout import CONFIG_HASH_LABEL
from .plan import COMPOSE_DOWN_S, COMPOSE_UP_S
from .verify.client import ENGINE_GAVE_UP


def smi_command(query: str) -> list[str]:
    return ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"]


INSPECT_FORMAT = ("{{json .State}}\t{{.RestartCount}}\t{{.Created}}\t"
                  "{{index .Config.Labels " + json.dumps(CONFIG_HASH_LABEL) + "}}\t{{.Image}}")


def compose(file: str, project: str, *args: str) -> list[str]:
    return ["docker", "compose", "-p", project, "-f", file, *args]


@dataclass(frozen=True)
class ContainerState:
    """What ``docker inspect`` says about a serving container."""

    status: str  # created, running, restarting, exited, dead, ...
    exit_code: int = 0
    restarts: int = 0
    oom_killed: bool = False
    created: str = ""
    config_hash: str | None = None
    image_id: str = ""
    started_at: str = ""  # when its process last started (docker's State.StartedAt)

    @property
    def running(self) -> bool:
        return self.status == "running"


def parse_inspect(text: str) -> ContainerState | None:
    """``inspect()`` output -> ``ContainerState``; None when the container does not exist."""
    parts = (text.strip().splitlines() or [""])[0].split("\t")
    if len(parts) not in (4, 5):
        return None
    try:
        state = json.loads(parts[0])
        restarts = int(parts[1])
    except ValueError:
        return None
    label = parts[3].strip()
    return ContainerState(
        status=str(state.get("Status", "")), exit_code=int(state.get("ExitCode") or 0),
        restarts=restarts, oom_killed=bool(state.get("OOMKilled")), created=parts[2],
        config_hash=None if not label or label.startswith("<no") else label,
        image_id=parts[4].strip() if len(parts) == 5 else "",
        started_at=str(state.get("StartedAt") or ""),
    )


def parse_unit_state(text: str) -> str:
    """``systemctl show`` ActiveState and SubState -> ``done`` (ensure served), ``starting``,
    ``stopping``, ``inactive``, ``failed`` or ``unknown``."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) != 2:
        return "unknown"
    active, sub = lines
    if active == "active":
        return "done" if sub == "exited" else "starting" if sub in ("running", "start") \
            else "unknown"
    return {"activating": "starting", "reloading": "starting", "deactivating": "stopping",
            "inactive": "inactive", "failed": "failed"}.get(active, "unknown")


def docker_time(text: str) -> float | None:
    """``2026-11-29T10:00:01.123456789Z`` -> epoch seconds; None: unparseable, or never started."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)?", text.strip())
    if not m or m.group(1).startswith("0001-"):
        return None
    # "+00:00", not "Z": Python 3.10's fromisoformat (Ubuntu 22.04's) does not read "Z"
    zone = m.group(3) or "Z"
    return datetime.fromisoformat(m.group(1) + ("+00:00" if zone == "Z" else zone)).timestamp()


@dataclass(frozen=True)
class GpuMemory:
    index: int
    used_mib: int
    total_mib: int


_NUMBER = re.compile(r"^\s*(\d+)(?:\.\d+)?\s*(?:MiB)?\s*$")


def parse_gpu_memory(text: str) -> list[GpuMemory]:
    """``SystemOps.gpus``' query output (``0, 20480, 24576`` per card); else ValueError."""
    cards = []
    for line in filter(str.strip, text.splitlines()):
        parts = line.split(",")
        nums = [_NUMBER.match(p) for p in parts]
        if len(parts) != 3 or not all(nums):
            raise ValueError(f"nvidia-smi printed {line.strip()[:120]!r}, not "
                             "'index, memory.used, memory.total'")
        cards.append(GpuMemory(*(int(m.group(1)) for m in nums if m)))
    if not cards:
        raise ValueError("nvidia-smi listed no GPUs")
    return cards


def vram_free_enough(cards: list[GpuMemory], utilization: float) -> tuple[bool, str]:
    """vLLM's own start condition: every card's free memory >= utilization x total."""
    short = [c for c in cards if c.total_mib - c.used_mib < utilization * c.total_mib]
    detail = ", ".join(f"card {c.index}: {c.used_mib} MiB used of {c.total_mib}" for c in cards)
    return not short, detail


@dataclass(frozen=True)
class BootFailure:
    """A known reason a serving container died while booting (``hint``: the stack file's)."""

    kind: str
    title: str
    line: str
    hint: str = ""

    def __str__(self) -> str:
        text = f"{self.title}: {self.line}" if self.line else self.title
        return f"{text} (what to do: {self.hint})" if self.hint else text


# Failures any stack can meet, most specific first, after the stack file's own; the first
# found anywhere in the log wins. vLLM's wrapper line is never what we report.
BOOT_FAILURES: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    ("genesis-pin-gate", "Genesis pin-gate strict failure (this vLLM build is not on Genesis' "
     "KNOWN_GOOD_VLLM_PINS)", re.compile(r"\[Genesis pin-gate\] STRICT FAIL.*")),
    ("genesis-patch-failed", "a Genesis patch failed to apply (a restarted container? "
     "a read-only target?)", re.compile(r"Genesis Results: \d+ applied, \d+ skipped, [1-9]\d* "
                                        r"failed.*")),
    ("genesis-missing", "the Genesis patches are missing from the container",
     re.compile(r".*Genesis patches missing.*")),
    ("transformers-oserror", "transformers OSError: the local model path was taken for a Hub "
     "repo id (speculators probe regression of this nightly)",
     re.compile(r"OSError: Repo id must be in the form.*")),
    ("gpu-memory-busy", "out of GPU memory at start (another process holds the cards)",
     re.compile(r".*Free memory on device .* less than desired GPU memory utilization.*")),
    ("cuda-oom", "CUDA out of GPU memory", re.compile(r".*(CUDA out of memory|"
                                                      r"OutOfMemoryError).*")),
    ("kv-cache-too-small", "KV cache too small for max-model-len",
     re.compile(r".*(To serve at least one request with the model'?s max seq len|"
                r"No available memory for the cache blocks).*")),
    ("turboquant-unsupported", "TurboQuant KV cache is not supported here (Genesis not "
     "applied?)", re.compile(r".*TurboQuant KV cache is not supported.*")),
    ("no-gpu", "no GPU visible in the container", re.compile(r".*No CUDA GPUs are available.*")),
)
_LAST_EXCEPTION = re.compile(r"^(?:ERROR .*\] )?([A-Za-z_][\w.]*(?:Error|Exception)): .+")
_WRAPPER = "Engine core initialization failed"


def _compiled(pattern: str) -> re.Pattern[str] | None:
    # A plan written by hand may hold a pattern the validator never saw.
    try:
        return re.compile(pattern)
    except re.error:
        return None


def classify_boot_failure(log: str, known: Sequence[tuple[str, str, str, str]] = ()
                          ) -> BootFailure | None:
    """The known boot failure in a container's log (``known``: the stack's
    ``boot_failures``, looked for first), else its last exception line, else None."""
    for kind, pattern, title, hint in known:
        if (rx := _compiled(pattern)) and (m := rx.search(log)):
            start = log.rfind("\n", 0, m.start()) + 1
            end = log.find("\n", m.end())
            line = log[start:end if end >= 0 else len(log)]
            return BootFailure(kind, title, _strip_prefix(line), hint)
    for kind, title, builtin in BOOT_FAILURES:
        if m := builtin.search(log):
            return BootFailure(kind, title, _strip_prefix(m.group(0)))
    found = [line.strip() for line in log.splitlines()
             if _LAST_EXCEPTION.match(line.strip()) and _WRAPPER not in line]
    return BootFailure("unknown", "the container died while booting", _strip_prefix(found[-1])) \
        if found else None


def missing_boot_lines(log: str, expect: Sequence[tuple[str, str]]) -> list[str]:
    """The titles of the ``expect`` (pattern, title) lines that ``log`` lacks."""
    return [title for pattern, title in expect
            if (rx := _compiled(pattern)) is None or not rx.search(log)]


def _strip_prefix(line: str) -> str:
    # "ERROR 11-29 10:00:00 [core.py:843] ValueError: ..." -> "ValueError: ..."
    return re.sub(r"^(?:ERROR|WARNING|INFO) \d\d-\d\d \d\d:\d\d:\d\d \[[^\]]*\] ", "",
                  line.strip()).strip()[:400]


def run(argv: Sequence[str], timeout: float | None = 30, env: dict[str, str] | None = None
        ) -> tuple[int, str, str]:
    """(exit status, stdout, stderr); 127 when the program is missing, 124 on a timeout."""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                           check=False)
        return p.returncode, p.stdout, p.stderr
    except OSError as e:
        return 127, "", str(e)
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout}s"


def run_cmd(argv: list[str], timeout: float = 120.0) -> tuple[int, str]:
    """(exit status, stdout+stderr), never raised: 127 no binary, 126 cannot start, 124 timeout."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return 127, f"{argv[0]}: not found"
    except OSError as e:  # not executable, or no memory left to start it
        return 126, f"{argv[0]}: {e.strerror or e}"
    except subprocess.TimeoutExpired:
        return 124, f"{' '.join(argv[:4])}...: timed out after {timeout:g}s"
    return proc.returncode, (proc.stdout or "") + (proc.stderr or "")


def http_request(method: str, url: str, headers: dict[str, str], body: bytes | None,
                 timeout: float) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request; (status, headers, body). No answer at all is status 0."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers.items()), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers.items()) if e.headers else {}, e.read() or b""
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as e:
        return 0, {}, str(e).encode()  # HTTPException: cut off mid-answer, or not HTTP


def read_api_key(key_file: Path, env_file: Path | None = None) -> str:
    """The API key: its own file, else ``VLLM_API_KEY=`` from the stacks' env file."""
    with contextlib.suppress(OSError):
        if key := key_file.read_text().strip():
            return key
    with contextlib.suppress(OSError):
        for line in env_file.read_text().splitlines() if env_file is not None else ():
            if line.startswith("VLLM_API_KEY="):
                return line.partition("=")[2].strip()
    return ""


@dataclass
class SystemOps:
    """The real host: docker, nvidia-smi, HTTP on loopback."""

    api_key: str = ""

    def _error(self, argv: list[str], timeout: float) -> str | None:
        """None when ``argv`` succeeds, else the tail of what it printed."""
        rc, out = run_cmd(argv, timeout)
        return None if rc == 0 else out.strip()[-600:] or f"exit {rc}"

    def image_present(self, ref: str) -> bool:
        return self.image_id(ref) is not None

    def image_id(self, ref: str) -> str | None:
        rc, out = run_cmd(["docker", "image", "inspect", "--format", "{{.Id}}", ref], 60.0)
        return out.strip() if rc == 0 and out.strip() else None

    def tag(self, image: str, name: str) -> str | None:
        return self._error(["docker", "image", "tag", image, name], 60.0)

    def remove(self, name: str) -> str | None:
        return self._error(["docker", "rm", "--force", name], 120.0)

    def running(self) -> list[str]:
        rc, out = run_cmd(["docker", "ps", "--format", "{{.Names}}"], 30.0)
        return out.split() if rc == 0 else []

    def compose_check(self, file: str, project: str) -> str | None:
        return self._error(compose(file, project, "config", "-q"), 60.0)

    def up(self, file: str, project: str) -> str | None:
        """Always *recreated* (Genesis text-patches the container's writable layer: a
        restarted one re-patches patched files); never pulling (the deploy staged the image)."""
        return self._error(compose(file, project, "up", "-d", "--force-recreate",
                                   "--remove-orphans", "--pull", "never"), COMPOSE_UP_S)

    def down(self, file: str, project: str) -> str | None:
        return self._error(compose(file, project, "down", "--remove-orphans", "--timeout",
                                   "60"), COMPOSE_DOWN_S)

    def container(self, name: str) -> ContainerState | None:
        rc, out = run_cmd(["docker", "inspect", "--type", "container", "--format",
                           INSPECT_FORMAT, name], 30.0)
        return parse_inspect(out) if rc == 0 else None

    def logs(self, name: str, tail: int = 300) -> str:
        return run_cmd(["docker", "logs", "--tail", str(int(tail)), name], 60.0)[1]

    def gpus(self) -> list[GpuMemory]:
        rc, out = run_cmd(smi_command("index,memory.used,memory.total"), 30.0)
        if rc != 0:
            raise ValueError(f"nvidia-smi failed (exit {rc}): {out.strip()[-200:]}")
        return parse_gpu_memory(out)

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def health(self, port: int, served: str) -> tuple[bool, str]:
        """Ready = ``/health`` 200 and ``/v1/models`` (with the key) lists ``served``."""
        base = f"http://127.0.0.1:{int(port)}"
        status, _, _ = http_request("GET", f"{base}/health", {}, None, 5.0)
        if status != 200:
            return False, f"/health {status or 'no answer'}"
        status, _, body = http_request("GET", f"{base}/v1/models", self._auth(), None, 5.0)
        try:
            ids = [m.get("id") for m in json.loads(body).get("data", [])]
        except (ValueError, AttributeError):
            ids = []
        if status != 200 or served not in ids:
            return False, f"/v1/models {status} lists {ids or 'nothing'}"
        return True, "ready"

    def chat(self, port: int, served: str) -> tuple[bool, str]:
        """A short chat completion: the stack really answers (after a rollback)."""
        body = json.dumps({"model": served, "max_tokens": 8, "temperature": 0,
                           "messages": [{"role": "user", "content": "Reply with: ready"}]})
        status, _, data = http_request("POST", f"http://127.0.0.1:{int(port)}/v1/chat/completions",
                                       {**self._auth(), "Content-Type": "application/json"},
                                       body.encode(), 60.0)
        if status != 200:
            return False, f"chat completion {status or 'no answer'}: {data[:200]!r}"
        try:
            choices = json.loads(data)["choices"]
            reason = choices[0].get("finish_reason") if choices else None
        except (ValueError, KeyError, TypeError, AttributeError):
            return False, "chat completion without choices"
        if reason in ENGINE_GAVE_UP:
            return False, f'the engine gave up on the reply (finish_reason "{reason}")'
        return bool(choices), "answered"

    def metrics(self, port: int) -> str | None:
        """The engine's ``/metrics`` text (no key needed); None unless it answers 200."""
        status, _, body = http_request("GET", f"http://127.0.0.1:{int(port)}/metrics", {},
                                       None, 5.0)
        return body.decode("utf-8", "replace") if status == 200 else None

    # nginx workers of an earlier configuration still serving what they accepted.
    front_draining = staticmethod(draining_workers)
    sleep = staticmethod(time.sleep)
    monotonic = staticmethod(time.monotonic)

    def docker_up(self) -> bool:
        return run_cmd(["docker", "version", "--format", "{{.Server.Version}}"], 30.0)[0] == 0

    def unit(self, unit: str) -> str:
        """How a systemd unit stands (``parse_unit_state``)."""
        rc, out = run_cmd(["systemctl", "show", "--property", "ActiveState", "--property",
                           "SubState", "--value", unit], 30.0)
        return parse_unit_state(out) if rc == 0 else "unknown"
