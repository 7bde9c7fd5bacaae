"""Issue 13 item 1 on one host: a swap drains before it stops the old stack.

While the host's stack holds as many streams as its max-num-seqs plus one waiting (clients
that send the next stream as soon as one ends), a swap re-rolls the same stack (one harmless
container variable more, ``extra_env``): new requests get 503 with a Retry-After near the
window this host measured, every accepted stream ends with ``[DONE]``, and the ledger has the
drain. A second converge (the inventory's own settings) puts the host back as it was; its
Retry-After comes from the window just measured.

    RIGFLEET_TESTBED_INSTANCE=4 RIGFLEET_KEEP_TESTBED=1 RIGFLEET_TESTBED_HOSTS=1 \
        RIGFLEET_TESTBED_EXTRAS=0 .venv/bin/python -m pytest tests/e2e/test_11_drain.py -x
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import pytest
from e2e_fleet import INVENTORY, ledger, run

from rigfleet.catalog import builtin_catalog
from rigfleet.hostside.drain import parse_load
from rigfleet.hostside.front import ROUTE_HEADER

PYINFRA = "pyinfra"
# Long enough that a stream outlasts the front's switch by a few seconds at the testbed's
# clock (sim_speedup 40: about 4,000 tokens/s per stream), short enough for CI.
COUNT_TO = 6000
MARK_ENV = {"RIGFLEET_E2E_DRAIN": "1"}  # read by nothing: a new config hash, the same stack
# The fast gate, its throughput figures reported but not judged (no stack, no reference:
# rigfleet.hostside.verify.checks.throughput) and not recorded as the host's baseline: on the shared
# 2-core CI machine the load of everything else makes their spread, and this module tests the
# drain, not the decode speed (test_09 does).
GATE = ("--data", "gate_profile=fast", "--data", "gate_set=" + json.dumps(
    ["throughput_stack=", "throughput_reference_narrative=0", "throughput_reference_code=0"]))


def deploy(host, *args: str):
    from e2e_fleet import BIN

    return run([str(BIN / PYINFRA), str(INVENTORY), "deploy.py", "-y", *GATE, "--limit",
                host.name, *args], timeout=900)


def _open(host, req: urllib.request.Request | str, timeout: float = 30):
    return host.urlopen(req, timeout=timeout)


def front(host, key: str) -> tuple[int, dict[str, str]]:
    req = urllib.request.Request(f"{host.front_url}/v1/models",
                                 headers={"Authorization": f"Bearer {key}"})
    try:
        with _open(host, req, timeout=10) as resp:
            return resp.status, dict(resp.headers.items())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers.items())


@dataclass
class Stream:
    client: int
    started: float
    status: int | str = 0
    done: bool = False  # "data: [DONE]" came
    ended: float = 0.0
    retry_after: str | None = None


@dataclass
class Clients:
    """``n`` clients, each sending the next stream as soon as its last ended, until one is
    refused (503: the window opened) or ``stop`` is set."""

    host: object
    key: str
    served: str
    n: int
    streams: list[Stream] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._client, args=(i,), daemon=True)
                   for i in range(self.n)]
        for t in threads:
            t.start()
        return threads

    def _client(self, i: int) -> None:
        while not self.stop.is_set():
            s = Stream(i, time.monotonic())
            with self.lock:
                self.streams.append(s)
            self._one(s)
            s.ended = time.monotonic()
            if s.status != 200:
                return

    def in_flight_at_the_window(self) -> list[Stream]:
        """Each client's stream that the front accepted and that ended into the window: the
        next one that client sent was refused. Judged per client, not against a clock: the
        probe can see the first 503 late when the machine is loaded."""
        found = []
        for i in range(self.n):
            mine = [s for s in self.streams if s.client == i]
            if len(mine) >= 2 and mine[-1].status == 503 and mine[-2].status == 200:
                found.append(mine[-2])
        return found

    def first_refusal(self) -> tuple[float, int] | None:
        """(when it was sent, its Retry-After) of the first request a client had refused."""
        refused = sorted((s.started, int(s.retry_after or 0)) for s in self.streams
                         if s.status == 503)
        return refused[0] if refused else None

    def _one(self, s: Stream) -> None:
        # Each client its own length: streams of one length end in pairs, and a front that
        # switched in that instant found a slot free (one running at the drain's first reading).
        count = COUNT_TO * (4 + s.client) // 4
        body = json.dumps({"model": self.served, "stream": True, "max_tokens": 4 * count,
                           "messages": [{"role": "user",
                                         "content": f"Count from 1 to {count}."}]})
        req = urllib.request.Request(f"{self.host.front_url}/v1/chat/completions",  # type: ignore[attr-defined]
                                     data=body.encode(), headers={
                                         "Authorization": f"Bearer {self.key}",
                                         "Content-Type": "application/json"})
        try:
            with _open(self.host, req, timeout=300) as resp:
                s.status = resp.status
                for line in resp:
                    if line.strip() == b"data: [DONE]":
                        s.done = True
        except urllib.error.HTTPError as e:
            s.status, s.retry_after = e.code, e.headers.get("Retry-After")
        except Exception as e:  # a reset or a cut stream: what the drain must prevent
            s.status = s.status or f"{type(e).__name__}: {e}"
            s.done = False


class Probe(threading.Thread):
    """``GET /v1/models`` every 0.25 s: when the 503 window opened and closed, and what its
    Retry-After said."""

    def __init__(self, host, key: str) -> None:
        super().__init__(daemon=True)
        self.host, self.key = host, key
        self.seen: list[tuple[float, int, str | None]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            t = time.monotonic()
            try:
                code, headers = front(self.host, self.key)
                self.seen.append((t, code, headers.get("Retry-After")))
            except OSError:
                self.seen.append((t, -1, None))
            time.sleep(0.25)

    def window(self, also: tuple[float, int] | None = None) -> tuple[float, float, int]:
        """(first 503, first 200 after it, the first Retry-After) of the window; ``also``, a
        refusal the clients saw (when sent, Retry-After), counts when it came first."""
        refused = [(t, int(ra or 0)) for t, code, ra in self.seen if code == 503]
        assert refused, f"the front never answered 503: {self.seen[-5:]}"
        t0, ra = min(refused[0], also) if also else refused[0]
        back = next(t for t, code, _ in self.seen if t > t0 and code == 200)
        return t0, back, ra

    def retry_after_at(self, since: float) -> tuple[float, int]:
        """The first 503 at or after ``since``: (when, its Retry-After)."""
        return next((t, int(ra or 0)) for t, code, ra in self.seen if t >= since and code == 503)


def ledger_tail(host, n: int = 5) -> list[dict]:
    return ledger(host)[-n:]


def near(retry_after: int, window: float) -> bool:
    """Retry-After is an estimate from the last window measured here: within a factor 2.5
    of this one (boot and gate times vary with the machine's load), 2 s either side."""
    return window / 2.5 - 2 <= retry_after <= window * 2.5 + 2


@pytest.fixture
def host(testbed, converged):
    h = testbed.fleet[0]
    code, headers = front(h, testbed.api_key)
    assert code == 200, f"{h.name} does not serve before the test: {code}"
    route = headers.get(ROUTE_HEADER)
    yield h
    # As found: the inventory's settings, the same route (config hash) as before.
    if front(h, testbed.api_key)[1].get(ROUTE_HEADER) != route:
        deploy(h)
    assert front(h, testbed.api_key)[1].get(ROUTE_HEADER) == route


def test_a_swap_drains_streams_then_refuses_with_the_measured_window(testbed, host):
    spec = builtin_catalog().stacks[host.stack]
    clients = Clients(host, testbed.api_key, spec.served_model_name, spec.max_num_seqs + 1)
    probe = Probe(host, testbed.api_key)
    clients.start()
    probe.start()
    # All clients busy: max-num-seqs streams running, one waiting (the engine's gauges).
    deadline, load = time.monotonic() + 90, None
    while time.monotonic() < deadline:
        _, out = host.sh(f"curl -fsS http://127.0.0.1:{spec.port}/metrics")
        load = parse_load(out)
        if load is not None and load.running == spec.max_num_seqs and load.waiting >= 1:
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"the engine never held {spec.max_num_seqs} + 1 requests: {load}")
    started = time.monotonic()
    proc = deploy(host, "--data", "extra_env=" + json.dumps({host.stack: MARK_ENV}))
    took = time.monotonic() - started
    clients.stop.set()
    time.sleep(0.5)
    probe.halt.set()
    probe.join(5)
    t0, back, retry_after = probe.window(clients.first_refusal())
    window = back - t0

    # Every stream the front accepted ended properly; those sent in the window got 503.
    cut = [s for s in clients.streams if s.status not in (200, 503) or
           (s.status == 200 and not s.done)]
    assert not cut, f"streams cut or failed: {cut}"
    during = clients.in_flight_at_the_window()
    assert len(during) >= spec.max_num_seqs, (
        f"only {len(during)} stream(s) were still running when the window opened: "
        f"{clients.streams[-2 * clients.n:]}; the probe around it: "
        f"{[x for x in probe.seen if abs(x[0] - t0) < 15]}")
    refused = [s for s in clients.streams if s.status == 503]
    assert refused and all(s.retry_after for s in refused)

    # The ledger says how the drain went, and what Retry-After the front said.
    line = next(x for x in reversed(ledger_tail(host)) if x.get("result") == "promoted")
    drain = line["drain"]
    assert drain["result"] == "drained" and drain["cut"] == 0, drain
    # What the engine held at the drain's first reading: every slot busy, and mostly the one
    # waiting too (its client may have been between two streams: one that ended while the
    # front switched got a 503, so it did not queue again).
    assert drain["running"] == spec.max_num_seqs, drain
    assert len(during) >= drain["running"] + drain["waiting"], (during, drain)
    assert 0 < drain["seconds"] < window
    assert line["retry_after_s"] == retry_after  # what the first 503 said
    # Once the drain is over the 503 says the rest: boot + gate + the swap's own, as measured.
    t, rest = probe.retry_after_at(t0 + drain["seconds"] + 1.0)
    assert near(rest, back - t), (rest, back - t)
    assert "none cut" in proc.stdout + proc.stderr  # the deploy's log says the drain
    print(f"swap deploy {took:.1f}s; 503 window {window:.1f}s; drain {drain['seconds']}s; "
          f"Retry-After {retry_after}s at the start, {rest}s after the drain; in flight "
          f"{drain['running']} running + {drain['waiting']} waiting")

    # Back to the inventory's settings: no load now, Retry-After from the window just measured.
    probe = Probe(host, testbed.api_key)
    probe.start()
    deploy(host)
    probe.halt.set()
    probe.join(5)
    t0, back, retry_after = probe.window()
    line = next(x for x in reversed(ledger_tail(host)) if x.get("result") == "promoted")
    assert line["drain"]["result"] in ("idle", "drained") and line["drain"]["cut"] == 0
    assert near(retry_after, back - t0), (retry_after, back - t0)
    print(f"restore: 503 window {back - t0:.1f}s; Retry-After {retry_after}s")
