"""A card moved to a slot wired x4 gen3: the doctor names the PCIe link, with the figures.

The last module of the session (it leaves the host slower than its history until the next
reboot). The slot is a physical fact of the host, outside it: the testbed keeps it in
``.testbed/hosts/<host>/hardware.json`` (mounted read-only as ``/etc/nvidia-sim/hardware.json``),
which the simulated driver loads at boot, as a real card's link is trained at power-on. So the
test does what a person does when moving a card: change the slot, reboot. The stack comes back
at boot (recreated from its verified snapshot); the serving simulator then decodes at the pace
the link allows (TP=2's all-reduce crosses it),
and ``rigfleet doctor`` reads the link under load.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from e2e_fleet import BIN, INVENTORY, STATE, run, wait_for
from test_04_swap import front_answers

SLOW_CARD = 1


def rewrite(path: Path, text: str) -> None:
    """In place (the same inode: the host's bind mount of the file follows it)."""
    with path.open("r+") as f:
        f.seek(0)
        f.write(text)
        f.truncate()


def test_a_card_in_an_x4_gen3_slot_is_named_by_the_doctor_as_the_link(testbed, converged):
    host = testbed.fleet[-1]
    hardware = STATE / "hosts" / host.name / "hardware.json"
    before = hardware.read_text()
    moved = json.loads(before)
    moved["gpus"][SLOW_CARD].update(pcie_gen_max=3, pcie_width_max=4)
    try:
        rewrite(hardware, json.dumps(moved, indent=2))
        host.reboot()
        wait_for(lambda: front_answers(host, testbed.api_key), 240,
                 f"{host.name}: its stack back at boot")
        rc, out = host.sh("nvidia-smi --query-gpu=index,pcie.link.width.max "
                          "--format=csv,noheader")
        assert rc == 0 and out.split("\n")[SLOW_CARD].strip() == f"{SLOW_CARD}, 4", out
        proc = run([str(BIN / "rigfleet"), "doctor", "--inventory", str(INVENTORY), "--limit",
                    host.name, "--load-s", "10", "--json"], check=False, timeout=600,
                   env={**os.environ, "COLUMNS": "200"})
    finally:
        # The slot as it was, for the next boot (the session's testbed is torn down after this).
        rewrite(hardware, before)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    (d,) = json.loads(proc.stdout)["hosts"]
    assert d["error"] is None, d
    v = d["verdict"]
    assert v["slow"] and v["now"] < 0.85 * v["baseline"], v  # the slowdown the link makes
    ranked = [c for c in d["causes"] if c["kind"] == "cause"]
    top = ranked[0]
    assert top["id"] == "pcie-link", ranked
    assert top["title"].startswith("PCIe link at ") and "TP=2 all-reduce" in top["title"], top
    assert any(e.startswith(f"gpu{SLOW_CARD}: gen3 x4 under load") for e in top["evidence"]), top
    assert "x16 gen4" in top["fix"], top
    # The power cap is not blamed: two cards decode flat across caps (bandwidth-bound).
    assert all(c["id"] != "power-cap" for c in ranked), ranked
