"""The converge's swap slots behind a balancer (``roles.swap.start_and_follow``): at most
``batch.size`` hosts swap at once, and a slot comes back however a swap ended."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import roles.swap as swap_role
from rigfleet.balancer.plan import SwapBatch
from rigfleet.hostside.plan import Plan, StackRef

PLAN = Plan("a", "alice@ctl", "swap", "rig", StackRef(
    "int8", "rigfleet-int8", "rigfleet-int8", 8001, "/x/compose.yaml", "1111aaaa", "img:1",
    "m", 0.9))


def test_at_most_the_batch_swaps_at_once_and_a_failed_start_gives_its_slot_back(monkeypatch):
    class Run:  # one pyinfra State: the run's slots
        pass

    state = Run()
    now, peak, started = [0], [0], []
    lock = threading.Lock()
    logs: list[str] = []

    class FakeHost:
        name = "rig"

        def __init__(self) -> None:
            self.state = state

        def log(self, text: str) -> None:
            logs.append(text)

    def run_on_host(command: str):
        with lock:
            started.append(command)
        ok = "bad" not in command
        return ok, [], ([] if ok else ["Failed to start transient service unit"])

    def follow(swap_id, timeout_s, reports, box):
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        time.sleep(0.2)
        with lock:
            now[0] -= 1

    monkeypatch.setattr(swap_role, "host", FakeHost())
    monkeypatch.setattr(swap_role, "run_on_host", run_on_host)
    monkeypatch.setattr(swap_role, "follow", follow)
    monkeypatch.setattr(swap_role, "SLOT_NOTE_S", 0.05)
    batch = SwapBatch(2, "2 host(s) at a time, so that one int8 host keeps serving behind lb1")
    boxes = [{} for _ in range(5)]
    ids = ["bad", "a", "b", "c", "d"]
    threads = [threading.Thread(target=swap_role.start_and_follow,
                                args=(replace(PLAN, id=i), 60.0, "/tmp", box, batch))
               for i, box in zip(ids, boxes, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert peak[0] == 2  # never three at once, and the failed start did not keep a slot
    assert len(started) == 5
    assert boxes[0]["error"].startswith("rig: the swap transaction did not start: Failed")
    assert all("error" not in b for b in boxes[1:])
    assert any(line.startswith("swap waits for a slot: 2 host(s) at a time") for line in logs)
    # Without a cap (no balancer, or an activation): no slot at all.
    swap_role.start_and_follow(replace(PLAN, id="e"), 60.0, "/tmp", {}, None)
    assert len(started) == 6
