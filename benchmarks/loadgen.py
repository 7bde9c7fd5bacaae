"""A bounded load generator for the fleet endpoint: chat requests at a set rate, then figures.

    python benchmarks/loadgen.py --url http://127.0.0.1:18450 --api-key-file \\
        .testbed-4/secrets/api-key --rate 1 --duration 60 [--requests 60] [--json]

It sends chat completions (streaming and not, short and long prompts, in turn) at ``--rate``
per second until ``--duration`` seconds or ``--requests`` requests, whichever comes first
(hard caps: ``MAX_DURATION_S``, ``MAX_REQUESTS``; at most ``--max-inflight`` at once), waits
for the answers (at most ``--timeout`` each), and prints::

    sent 60  completed 59  failed 1 (503: 1)  cut 0
    first byte  p50 0.041 s  p90 0.080 s  p99 0.120 s  max 0.130 s
    total       p50 0.300 s  p90 0.610 s  p99 0.900 s  max 0.950 s

A stream is *cut* when it ended (or broke) after its first byte without a ``finish_reason``
and the final ``data: [DONE]``; an answer that never started is *failed*, by its HTTP status
or, without one, by what went wrong (``conn: refused``, ``timeout``). Only loopback
(127.0.0.0/8, ::1) and the testbed's own hosts (its networks 10.213.7.0/24..10.213.16.0/24,
names that resolve there) are accepted as targets; the key comes from a file, never from the
command line. The core (``classify``, ``scan_sse``, ``Tally``, ``check_target``) is pure and
importable: ``tests/unit/test_loadgen.py`` and the balancer's e2e test use it::

    report = run(LoadConfig(url, key, rate=1.0, duration_s=20))
    report.failed, report.cut           # {}, 0
"""

from __future__ import annotations

import argparse
import http.client
import ipaddress
import json
import math
import socket
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

MAX_DURATION_S = 900.0
MAX_REQUESTS = 5000
MAX_RATE = 50.0
MAX_INFLIGHT = 64
# The testbed's networks: instance n uses 10.213.(7+n).0/24, n = 0..9
# (testbed/rigfleet_testbed/layout.py).
TESTBED_NETWORKS = tuple(ipaddress.ip_network(f"10.213.{7 + n}.0/24") for n in range(10))
MODEL = "qwen3.6-27b-autoround"


class TargetRefused(ValueError):
    """The URL is not loopback or a testbed host; the message says what is allowed."""


def allowed_address(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or any(ip in net for net in TESTBED_NETWORKS)


def check_target(url: str, resolve: Callable[[str], Sequence[str]] | None = None) -> str:
    """The URL without a trailing ``/`` when its host is loopback or a testbed host (every
    address its name resolves to must be); raises ``TargetRefused``."""
    parts = urlsplit(url)
    allowed = ("http(s)://HOST[:PORT] with HOST on loopback (127.0.0.0/8, ::1, localhost) or "
               "a testbed host (10.213.7.0/24 .. 10.213.16.0/24)")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetRefused(f"--url {url!r} is not valid; allowed: {allowed}")
    host = parts.hostname
    try:
        addresses = [str(ipaddress.ip_address(host))]
    except ValueError:
        try:
            addresses = list((resolve or _resolve)(host))
        except OSError as e:
            raise TargetRefused(f"--url {url!r}: {host!r} does not resolve ({e}); allowed: "
                                f"{allowed}") from None
    bad = [a for a in addresses if not allowed_address(a)]
    if bad or not addresses:
        raise TargetRefused(f"--url {url!r}: {host!r} is {', '.join(bad) or 'nowhere'}, not "
                            f"loopback or a testbed host; allowed: {allowed}")
    return url.rstrip("/")


def _resolve(host: str) -> list[str]:
    return sorted({str(info[4][0]) for info in socket.getaddrinfo(host, None)})


# --- what one answer was ---------------------------------------------------------------------


@dataclass(frozen=True)
class StreamScan:
    """What an SSE answer held: events, whether ``[DONE]`` came, the last finish_reason."""

    events: int = 0
    done: bool = False
    finish_reason: str | None = None


def scan_sse(lines: Iterable[bytes]) -> StreamScan:
    """Read ``data:`` lines of a chat-completion stream (blank lines and comments skipped)."""
    events, done, finish = 0, False, None
    for raw in lines:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            done = True
            continue
        events += 1
        try:
            chunk = json.loads(payload)
        except ValueError:
            continue
        for choice in chunk.get("choices") or []:
            if choice.get("finish_reason"):
                finish = str(choice["finish_reason"])
    return StreamScan(events, done, finish)


@dataclass(frozen=True)
class Outcome:
    """One request: ``completed``, ``failed`` (``reason``: status or error) or ``cut``."""

    kind: str                       # e.g. "stream-long"
    result: str                     # completed | failed | cut
    reason: str = ""                # "503", "conn: refused", "no [DONE]", ...
    first_byte_s: float | None = None
    total_s: float | None = None


def classify(kind: str, status: int | None, error: str | None, stream: bool,
             body: bytes | StreamScan, first_byte_s: float | None,
             total_s: float | None) -> Outcome:
    """Decide what one answer was (pure).

    + status: the HTTP status, None when no answer came
    + error: what broke, if anything (before or after the first byte)
    + body: the whole body (not streaming) or its ``scan_sse`` (streaming)
    + first_byte_s: seconds to the first byte of the body (None: none came)
    """
    if status is None:
        return Outcome(kind, "failed", error or "no answer", None, total_s)
    if status != 200:
        return Outcome(kind, "failed", str(status), first_byte_s, total_s)
    if stream:
        assert isinstance(body, StreamScan)
        if body.done and body.finish_reason and not error:
            return Outcome(kind, "completed", "", first_byte_s, total_s)
        if first_byte_s is None:  # 200 and headers, then nothing
            return Outcome(kind, "failed", error or "empty stream", None, total_s)
        missing = "no finish_reason" if not body.finish_reason else "no [DONE]"
        return Outcome(kind, "cut", error or missing, first_byte_s, total_s)
    assert isinstance(body, bytes)
    try:
        reply = json.loads(body)
        finish = reply["choices"][0].get("finish_reason")
    except (ValueError, KeyError, IndexError, TypeError):
        return Outcome(kind, "failed", error or "truncated or not JSON", first_byte_s, total_s)
    if error or not finish:
        return Outcome(kind, "failed", error or "no finish_reason", first_byte_s, total_s)
    return Outcome(kind, "completed", "", first_byte_s, total_s)


# --- the tally -------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class Tally:
    """Every outcome, and the figures the report prints (thread-safe ``add``)."""

    sent: int = 0
    outcomes: list[Outcome] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, outcome: Outcome) -> None:
        with self.lock:
            self.outcomes.append(outcome)

    def report(self, seconds: float) -> Report:
        done = [o for o in self.outcomes if o.result == "completed"]
        failed = Counter(o.reason for o in self.outcomes if o.result == "failed")
        cut = Counter(o.reason for o in self.outcomes if o.result == "cut")
        fb = [o.first_byte_s for o in done if o.first_byte_s is not None]
        total = [o.total_s for o in done if o.total_s is not None]
        pct = {name: {f"p{q}": percentile(vals, q) for q in (50, 90, 99)} | {
            "max": max(vals) if vals else None} for name, vals in (("first_byte", fb),
                                                                    ("total", total))}
        return Report(sent=self.sent, completed=len(done), failed=dict(sorted(failed.items())),
                      cut=sum(cut.values()), cut_reasons=dict(cut), answered=len(self.outcomes),
                      seconds=round(seconds, 2), latency_s=pct)


@dataclass(frozen=True)
class Report:
    sent: int
    completed: int
    failed: dict[str, int]
    cut: int
    cut_reasons: dict[str, int]
    answered: int
    seconds: float
    latency_s: dict[str, dict[str, float | None]]

    @property
    def failed_total(self) -> int:
        return sum(self.failed.values())

    def lines(self) -> list[str]:
        by = ", ".join(f"{k}: {v}" for k, v in self.failed.items())
        out = [f"sent {self.sent}  completed {self.completed}  failed {self.failed_total}"
               + (f" ({by})" if by else "") + f"  cut {self.cut}"
               + (f" ({', '.join(f'{k}: {v}' for k, v in self.cut_reasons.items())})"
                  if self.cut else "") + f"  in {self.seconds:g} s"]
        for name, label in (("first_byte", "first byte"), ("total", "total     ")):
            p = self.latency_s[name]
            out.append(f"{label}  " + "  ".join(
                f"{k} {'-' if v is None else f'{v:.3f} s'}" for k, v in p.items()))
        return out


# --- the client ------------------------------------------------------------------------------

KINDS = ("stream-short", "plain-short", "stream-long", "plain-long")


def request_body(kind: str, i: int, long_chars: int, max_tokens: int) -> dict:
    """The chat request for the ``i``-th request of ``kind`` (a long one repeats a passage
    to ``long_chars`` characters)."""
    question = f"Request {i}: in one sentence, what does a load balancer do?"
    if kind.endswith("long"):
        passage = ("A fleet of GPU hosts serves one model behind a balancer; each host swaps "
                   "its stack in turn while the others keep answering. ")
        question = passage * max(1, long_chars // len(passage)) + question
    return {"model": MODEL, "messages": [{"role": "user", "content": question}],
            "max_tokens": max_tokens * (4 if kind.endswith("long") else 1),
            "temperature": 0, "stream": kind.startswith("stream")}


@dataclass(frozen=True)
class LoadConfig:
    """What to send: ``rate`` requests/s for ``duration_s`` (or ``requests``), to ``url``."""

    url: str
    api_key: str
    rate: float = 1.0
    duration_s: float = 30.0
    requests: int | None = None
    timeout_s: float = 120.0
    max_inflight: int = 16
    kinds: tuple[str, ...] = KINDS
    long_chars: int = 40_000
    max_tokens: int = 48
    path: str = "/v1/chat/completions"
    session_prefix: str | None = None   # X-Session-Id: <prefix>-<i % 4> (conversations)
    context: ssl.SSLContext | None = None

    def checked(self) -> LoadConfig:
        """Refuse what the caps do not allow (``ValueError`` naming the option)."""
        if not 0 < self.rate <= MAX_RATE:
            raise ValueError(f"--rate {self.rate:g}: allowed 0 < rate <= {MAX_RATE:g}")
        if not 0 < self.duration_s <= MAX_DURATION_S:
            raise ValueError(f"--duration {self.duration_s:g}: allowed 0 < s <= "
                             f"{MAX_DURATION_S:g}")
        if self.requests is not None and not 0 < self.requests <= MAX_REQUESTS:
            raise ValueError(f"--requests {self.requests}: allowed 1..{MAX_REQUESTS}")
        if not 0 < self.max_inflight <= MAX_INFLIGHT:
            raise ValueError(f"--max-inflight {self.max_inflight}: allowed 1..{MAX_INFLIGHT}")
        if not 0 < self.timeout_s <= MAX_DURATION_S:
            raise ValueError(f"--timeout {self.timeout_s:g}: allowed 0 < s <= "
                             f"{MAX_DURATION_S:g}")
        unknown = [k for k in self.kinds if k not in KINDS]
        if unknown or not self.kinds:
            raise ValueError(f"kinds {unknown or '(none)'}: allowed {', '.join(KINDS)}")
        check_target(self.url)
        return self

    @property
    def count(self) -> int:
        by_time = max(1, int(self.rate * self.duration_s))
        return min(by_time, self.requests or by_time, MAX_REQUESTS)


def send_one(cfg: LoadConfig, i: int) -> Outcome:
    """Send request ``i`` and classify its answer (never raises)."""
    kind = cfg.kinds[i % len(cfg.kinds)]
    body = json.dumps(request_body(kind, i, cfg.long_chars, cfg.max_tokens)).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {cfg.api_key}"}
    if cfg.session_prefix:
        headers["X-Session-Id"] = f"{cfg.session_prefix}-{i % 4}"
    req = urllib.request.Request(cfg.url + cfg.path, data=body, headers=headers, method="POST")
    stream = kind.startswith("stream")
    started = time.monotonic()
    first: float | None = None
    try:
        resp = urllib.request.urlopen(req, timeout=cfg.timeout_s, context=cfg.context)
    except urllib.error.HTTPError as e:
        e.read()
        return classify(kind, e.code, None, stream, b"", None, time.monotonic() - started)
    except (OSError, ValueError) as e:
        return classify(kind, None, _why(e), stream, b"", None, time.monotonic() - started)
    error = None
    lines: list[bytes] = []
    data = b""
    with resp:
        try:
            if stream:
                for line in resp:
                    if first is None:
                        first = time.monotonic() - started
                    lines.append(line)
            else:
                chunk = resp.read(1)
                first = time.monotonic() - started if chunk else None
                data = chunk + resp.read()
        except (OSError, ValueError, http.client.HTTPException) as e:
            error = _why(e)
    got: bytes | StreamScan = scan_sse(lines) if stream else data
    return classify(kind, resp.status, error, stream, got, first, time.monotonic() - started)


def _why(e: BaseException) -> str:
    reason = getattr(e, "reason", None) or e
    text = str(reason).lower()
    if "timed out" in text or isinstance(reason, TimeoutError):
        return "timeout"
    for word in ("refused", "reset", "unreachable", "closed", "incomplete"):
        if word in text:
            return f"conn: {word}"
    return f"error: {type(reason).__name__}"


# How late the last scheduled request may still go out (the count bounds the run anyway).
LATE_GRACE_S = 2.0


def run(cfg: LoadConfig, stop: threading.Event | None = None,
        send: Callable[[LoadConfig, int], Outcome] = send_one) -> Report:
    """Send ``cfg.count`` requests on schedule (request ``i`` at ``i / rate`` s), stop early
    when ``stop`` is set, wait for the answers; the report of all of them."""
    cfg = cfg.checked()
    tally = Tally()
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=cfg.max_inflight, thread_name_prefix="loadgen") as pool:
        for i in range(cfg.count):
            due = started + i / cfg.rate
            while (wait := due - time.monotonic()) > 0:
                if stop is not None and stop.wait(min(wait, 0.2)):
                    break
                if stop is None:
                    time.sleep(wait)
            if stop is not None and stop.is_set():
                break
            if time.monotonic() - started > cfg.duration_s + LATE_GRACE_S:
                break  # far behind schedule (a starved machine): the run still ends
            tally.sent += 1
            pool.submit(lambda n=i: tally.add(send(cfg, n)))
    return tally.report(time.monotonic() - started)


def during(cfg: LoadConfig, action: Callable[[], object], settle_s: float = 3.0) -> Report:
    """The load on while ``action()`` runs (``settle_s`` before and after), then stopped; its
    report::

        report = during(LoadConfig(url, key, duration_s=600), lambda: deploy())
    """
    stop, box = threading.Event(), {}
    load = threading.Thread(target=lambda: box.setdefault("r", run(cfg, stop)))
    load.start()
    try:
        time.sleep(settle_s)
        action()
        time.sleep(settle_s)
    finally:
        stop.set()
        load.join(timeout=cfg.timeout_s + 30)
    return box["r"]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="loadgen", description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="the endpoint, e.g. http://127.0.0.1:18450 "
                   "(loopback or a testbed host only)")
    p.add_argument("--api-key-file", required=True, type=Path,
                   help="a file holding the key (never the key itself on the command line)")
    p.add_argument("--path", default="/v1/chat/completions",
                   help="e.g. /stacks/int8/v1/chat/completions")
    p.add_argument("--rate", type=float, default=1.0, help="requests per second")
    p.add_argument("--duration", type=float, default=30.0, help=f"seconds (<= {MAX_DURATION_S:g})")
    p.add_argument("--requests", type=int, default=None, help=f"at most (<= {MAX_REQUESTS})")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    p.add_argument("--max-inflight", type=int, default=16)
    p.add_argument("--kinds", default=",".join(KINDS), help="which requests, in turn")
    p.add_argument("--long-chars", type=int, default=40_000, help="a long prompt's length")
    p.add_argument("--session", default=None, help="send X-Session-Id <SESSION>-<i %% 4>")
    p.add_argument("--ca-file", default=None, help="trust this CA for https:// URLs")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    try:
        key = args.api_key_file.read_text().strip()
        context = ssl.create_default_context(cafile=args.ca_file) if args.ca_file else None
        cfg = LoadConfig(args.url, key, args.rate, args.duration, args.requests, args.timeout,
                         args.max_inflight, tuple(k for k in args.kinds.split(",") if k),
                         args.long_chars, path=args.path, session_prefix=args.session,
                         context=context)
        report = run(cfg)
    except (OSError, ValueError) as e:
        print(f"loadgen: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(asdict(report), indent=2))
    else:
        print("\n".join(report.lines()))
    return 0 if report.failed_total == 0 and report.cut == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
