"""Stacks on the host: docker compose, container state, GPU memory, boot-failure diagnosis.

Command builders return argv lists and run nothing (the Kamal way); parsers turn output into
data; ``SystemOps`` is the one place that runs them, behind the small interface the
transaction uses (``rigfleet.hostside.steps.Ops``), so the transaction's decisions are tested
with fakes::

    compose_up("/var/lib/rigfleet/swap/X/compose.yaml", "rigfleet-int8")
    # ['docker', 'compose', '-p', 'rigfleet-int8', '-f', '...', 'up', '-d', '--force-recreate', ...]
    classify_boot_failure(docker_logs_text)
    # BootFailure(kind='transformers-oserror', title='transformers OSError ...', line='OSError: ...')
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from .drain import draining_workers
from .layout import CONFIG_HASH_LABEL

# --- commands ----------------------------------------------------------------------------------

GPU_MEMORY_QUERY = ["nvidia-smi", "--query-gpu=index,memory.used,memory.total",
                    "--format=csv,noheader,nounits"]


def compose(file: str, project: str, *args: str) -> list[str]:
    return ["docker", "compose", "-p", project, "-f", file, *args]


def compose_up(file: str, project: str) -> list[str]:
    """Start the project's container *recreated* (Genesis text-patches the container's writable
    layer: a restarted container re-patches patched files), never pulling (the deploy staged
    the image by digest; a pull here could fetch something else)."""
    return compose(file, project, "up", "-d", "--force-recreate", "--remove-orphans",
                   "--pull", "never")


def compose_down(file: str, project: str) -> list[str]:
    """Stop and remove the project's containers (``down``, never ``stop``)."""
    return compose(file, project, "down", "--remove-orphans", "--timeout", "60")


def compose_config(file: str, project: str) -> list[str]:
    return compose(file, project, "config", "-q")


def inspect(container: str) -> list[str]:
    fmt = ("{{json .State}}\t{{.RestartCount}}\t{{.Created}}\t"
           "{{index .Config.Labels " + json.dumps(CONFIG_HASH_LABEL) + "}}\t{{.Image}}")
    return ["docker", "inspect", "--type", "container", "--format", fmt, container]


def remove(container: str) -> list[str]:
    return ["docker", "rm", "--force", container]


def running_names() -> list[str]:
    return ["docker", "ps", "--format", "{{.Names}}"]


def server_version() -> list[str]:
    """Answers only while the Docker daemon does."""
    return ["docker", "version", "--format", "{{.Server.Version}}"]


def image_id(ref: str) -> list[str]:
    return ["docker", "image", "inspect", "--format", "{{.Id}}", ref]


def tag_image(image: str, name: str) -> list[str]:
    """Name ``image`` (an id or a digest reference) ``name`` (``<repo>:<tag>``)."""
    return ["docker", "image", "tag", image, name]


def logs(container: str, tail: int = 300) -> list[str]:
    return ["docker", "logs", "--tail", str(int(tail)), container]


def image_present(ref: str) -> list[str]:
    return ["docker", "image", "inspect", "--format", "{{.Id}}", ref]


def unit_state(unit: str) -> list[str]:
    """``ActiveState`` and ``SubState`` of a systemd unit, one per line."""
    return ["systemctl", "show", "--property", "ActiveState", "--property", "SubState",
            "--value", unit]


# --- parsers ---------------------------------------------------------------------------------


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
    line = text.strip().splitlines()[0] if text.strip() else ""
    parts = line.split("\t")
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


# What ``unit_state`` prints (ActiveState, SubState) -> how the stack unit stands:
# ``done`` (its start command finished: ensure served), ``starting`` (ensure runs now),
# ``stopping``, ``inactive`` (stopped: the host is meant to be down), ``failed``, ``unknown``.
def parse_unit_state(text: str) -> str:
    """``unit_state()`` output -> ``done``, ``starting``, ``stopping``, ``inactive``,
    ``failed`` or ``unknown`` (no systemd, or an answer not understood)."""
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
    """``2026-11-29T10:00:01.123456789Z`` -> epoch seconds (None when unparseable, and for
    docker's zero time ``0001-01-01T00:00:00Z``: a container that never started)."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)?", text.strip())
    if not m or m.group(1).startswith("0001-"):
        return None
    tz = m.group(3) or "Z"
    stamp = m.group(1) + ("+00:00" if tz == "Z" else tz)
    return datetime.fromisoformat(stamp).timestamp()


@dataclass(frozen=True)
class GpuMemory:
    index: int
    used_mib: int
    total_mib: int

    @property
    def free_mib(self) -> int:
        return self.total_mib - self.used_mib


_NUMBER = re.compile(r"^\s*(\d+)(?:\.\d+)?\s*(?:MiB)?\s*$")


def parse_gpu_memory(text: str) -> list[GpuMemory]:
    """``GPU_MEMORY_QUERY`` output (``0, 20480, 24576`` per card); raises ValueError naming the
    line when it is not that (a driver error, ``[N/A]``)."""
    cards = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(",")
        nums = [_NUMBER.match(p) for p in parts]
        if len(parts) != 3 or not all(nums):
            raise ValueError(f"nvidia-smi printed {line.strip()[:120]!r}, not "
                             "'index, memory.used, memory.total'")
        index, used, total = (int(m.group(1)) for m in nums if m)
        cards.append(GpuMemory(index, used, total))
    if not cards:
        raise ValueError("nvidia-smi listed no GPUs")
    return cards


def vram_free_enough(cards: list[GpuMemory], utilization: float) -> tuple[bool, str]:
    """vLLM's own start condition: every card's free memory >= utilization x total."""
    short = [c for c in cards if c.free_mib < utilization * c.total_mib]
    detail = ", ".join(f"card {c.index}: {c.used_mib} MiB used of {c.total_mib}" for c in cards)
    return not short, detail


@dataclass(frozen=True)
class BootFailure:
    """A known reason a serving container died while booting (from its log).

    + hint: what to change (from the stack file's ``boot.failures``; built-ins have none)
    """

    kind: str
    title: str
    line: str
    hint: str = ""

    def __str__(self) -> str:
        text = f"{self.title}: {self.line}" if self.line else self.title
        return f"{text} (what to do: {self.hint})" if self.hint else text


# Failures any stack can meet, most specific first; a stack file's own ``boot.failures`` (the
# model's and image's, e.g. the Marlin pad-sub-tile-n fix) are looked for before these. The
# first pattern found anywhere in the log wins. The root cause comes before vLLM's wrapper
# ("Engine core initialization failed. See root cause above"), so the wrapper is never what
# we report.
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
    # The validator compiled every stack file pattern; a plan written by hand may not be.
    try:
        return re.compile(pattern)
    except re.error:
        return None


def classify_boot_failure(log: str, known: Sequence[tuple[str, str, str, str]] = ()
                          ) -> BootFailure | None:
    """The known boot failure in a container's log, else its last exception line, else None.

    + log: ``docker logs`` output (stdout and stderr together)
    + known: the stack's ``boot.failures`` as (kind, pattern, title, hint)
      (``StackRef.boot_failures``), looked for first

    ::

        classify_boot_failure(log, ref.boot_failures)   # BootFailure('marlin-min-thread-n', ...)
    """
    for kind, pattern, title, hint in known:
        rx = _compiled(pattern)
        m = rx.search(log) if rx else None
        if m:  # reported as the whole line(s) the match is on
            start = log.rfind("\n", 0, m.start()) + 1
            end = log.find("\n", m.end())
            line = log[start:end if end >= 0 else len(log)]
            return BootFailure(kind, title, _strip_prefix(line), hint)
    for kind, title, builtin in BOOT_FAILURES:
        m = builtin.search(log)
        if m:
            return BootFailure(kind, title, _strip_prefix(m.group(0)))
    last = None
    for line in log.splitlines():
        m = _LAST_EXCEPTION.match(line.strip())
        if m and _WRAPPER not in line:
            last = line.strip()
    return BootFailure("unknown", "the container died while booting", _strip_prefix(last)) \
        if last else None


def missing_boot_lines(log: str, expect: Sequence[tuple[str, str]]) -> list[str]:
    """The titles of the stack file's ``boot.expect`` lines that ``log`` lacks.

    + expect: (pattern, title) pairs (``StackRef.boot_expect``)

    ::

        missing_boot_lines(log, ref.boot_expect)
        # ['Genesis P67 (TurboQuant multi-query verify kernel) applied']
    """
    missing = []
    for pattern, title in expect:
        rx = _compiled(pattern)
        if rx is None or not rx.search(log):
            missing.append(title)
    return missing


def _strip_prefix(line: str) -> str:
    # "ERROR 11-29 10:00:00 [core.py:843] ValueError: ..." -> "ValueError: ..."
    return re.sub(r"^(?:ERROR|WARNING|INFO) \d\d-\d\d \d\d:\d\d:\d\d \[[^\]]*\] ", "",
                  line.strip()).strip()[:400]


# --- running them ------------------------------------------------------------------------------


def run_cmd(argv: list[str], timeout: float = 120.0) -> tuple[int, str]:
    """Run ``argv``; (exit status, stdout+stderr). A missing binary or a timeout is status 127
    or 124 with a message, never an exception."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except FileNotFoundError:
        return 127, f"{argv[0]}: not found"
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
    except (urllib.error.URLError, OSError, ValueError) as e:
        return 0, {}, str(e).encode()


def read_api_key(key_file: Path, env_file: Path | None = None) -> str:
    """The API key: its own file, else ``VLLM_API_KEY=`` from the stacks' env file."""
    try:
        key = key_file.read_text().strip()
        if key:
            return key
    except OSError:
        pass
    if env_file is not None:
        try:
            for line in env_file.read_text().splitlines():
                if line.startswith("VLLM_API_KEY="):
                    return line.partition("=")[2].strip()
        except OSError:
            pass
    return ""


@dataclass
class SystemOps:
    """The real host: docker, nvidia-smi, HTTP on loopback (see ``swap.Ops``)."""

    api_key: str = ""
    run: Callable[[list[str], float], tuple[int, str]] = run_cmd
    http: Callable[..., tuple[int, dict[str, str], bytes]] = http_request

    def image_present(self, ref: str) -> bool:
        return self.run(image_present(ref), 60.0)[0] == 0

    def image_id(self, ref: str) -> str | None:
        rc, out = self.run(image_id(ref), 60.0)
        return out.strip() if rc == 0 and out.strip() else None

    def tag(self, image: str, name: str) -> str | None:
        rc, out = self.run(tag_image(image, name), 60.0)
        return None if rc == 0 else out.strip()[-600:] or f"exit {rc}"

    def remove(self, name: str) -> str | None:
        rc, out = self.run(remove(name), 120.0)
        return None if rc == 0 else out.strip()[-600:] or f"exit {rc}"

    def running(self) -> list[str]:
        return self.run(running_names(), 30.0)[1].split()

    def compose_check(self, file: str, project: str) -> str | None:
        rc, out = self.run(compose_config(file, project), 60.0)
        return None if rc == 0 else out.strip()[-600:] or f"exit {rc}"

    def up(self, file: str, project: str) -> str | None:
        rc, out = self.run(compose_up(file, project), 600.0)
        return None if rc == 0 else out.strip()[-600:] or f"exit {rc}"

    def down(self, file: str, project: str) -> str | None:
        rc, out = self.run(compose_down(file, project), 300.0)
        return None if rc == 0 else out.strip()[-600:] or f"exit {rc}"

    def container(self, name: str) -> ContainerState | None:
        rc, out = self.run(inspect(name), 30.0)
        return parse_inspect(out) if rc == 0 else None

    def logs(self, name: str, tail: int = 300) -> str:
        return self.run(logs(name, tail), 60.0)[1]

    def gpus(self) -> list[GpuMemory]:
        rc, out = self.run(GPU_MEMORY_QUERY, 30.0)
        if rc != 0:
            raise ValueError(f"nvidia-smi failed (exit {rc}): {out.strip()[-200:]}")
        return parse_gpu_memory(out)

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def health(self, port: int, served: str) -> tuple[bool, str]:
        """Ready = ``/health`` 200 and ``/v1/models`` (with the key) lists ``served``."""
        base = f"http://127.0.0.1:{int(port)}"
        status, _, _ = self.http("GET", f"{base}/health", {}, None, 5.0)
        if status != 200:
            return False, f"/health {status or 'no answer'}"
        status, _, body = self.http("GET", f"{base}/v1/models", self._auth(), None, 5.0)
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
        status, _, data = self.http("POST", f"http://127.0.0.1:{int(port)}/v1/chat/completions",
                                    {**self._auth(), "Content-Type": "application/json"},
                                    body.encode(), 60.0)
        if status != 200:
            return False, f"chat completion {status or 'no answer'}: {data[:200]!r}"
        try:
            choices = json.loads(data)["choices"]
        except (ValueError, KeyError, TypeError):
            return False, "chat completion without choices"
        return bool(choices), "answered"

    def metrics(self, port: int) -> str | None:
        """The engine's ``/metrics`` text on loopback (vLLM serves it without the key); None
        when it does not answer 200."""
        status, _, body = self.http("GET", f"http://127.0.0.1:{int(port)}/metrics", {}, None,
                                    5.0)
        return body.decode("utf-8", "replace") if status == 200 else None

    def front_draining(self) -> int | None:
        """nginx workers of an earlier configuration still serving what they accepted."""
        return draining_workers()

    def docker_up(self) -> bool:
        """The Docker daemon answers (a missing container means something only then)."""
        return self.run(server_version(), 30.0)[0] == 0

    def unit(self, unit: str) -> str:
        """How a systemd unit stands (``parse_unit_state``)."""
        rc, out = self.run(unit_state(unit), 30.0)
        return parse_unit_state(out) if rc == 0 else "unknown"

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def monotonic(self) -> float:
        return time.monotonic()
