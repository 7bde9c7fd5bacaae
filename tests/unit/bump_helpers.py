"""Shared data for the ``rigfleet bump`` unit tests: pins, hosts, the testbed's nightlies."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from rigfleet.bump.plan import PlanHost
from rigfleet.hostprobe import HostProbe
from rigfleet.hostside.records import ReportSummary
from rigfleet.pins import GenesisPin, Pins, StackPins, load_pins

GOOD = "01d4d1ad375dc5854779c593eee093bcebb0cada"
MTP_DIES = "1acd67a795ebccdf9b9db7697ae9082058301657"
NEWER = "3f9c2a7e5b1d4c8a9e0f6b2d7c1a5e8f9b3d6c02"
REGRESSED = "b7e4d1c9a2f5e8b3d6c0a9f2e5b8d1c4a7f0e3b6"
VERSIONS = {
    GOOD: "0.20.2rc1.dev9+g01d4d1ad3",
    MTP_DIES: "0.20.2rc1.dev129+g1acd67a79",
    NEWER: "0.20.2rc1.dev212+g3f9c2a7e5",
    REGRESSED: "0.20.2rc1.dev240+gb7e4d1c9a",
}
DIGESTS = {sha: "sha256:" + sha[:8] * 8 for sha in VERSIONS}
GENESIS_REPO = "http://git.rigfleet.test:8090/genesis-vllm-patches.git"
GENESIS_OLD = "0c501e6147bd853ff35c579f986a3dd73d5f48b1"  # fixture v7.72.2 (branch dev)
GENESIS_NEW = "3d54a4435928ec2249bd544f9906a233862719ee"  # fixture v7.73.0 (branch dev)


def stack(name: str, sha: str, genesis: str | None = None) -> StackPins:
    g = GenesisPin(GENESIS_REPO, genesis) if genesis else None
    return StackPins(name, f"vllm/vllm-openai:nightly-{sha}", DIGESTS[sha], VERSIONS[sha], g)


def pins_data(sha: str = GOOD, genesis: str = GENESIS_OLD) -> dict[str, Any]:
    image = f"vllm/vllm-openai:nightly-{sha}"
    return {
        "schema": "rigfleet-pins/1",
        "serial": 4,
        "driver": {"branch": "580"},
        "container_toolkit": {"version": "1.17.8-1"},
        "huggingface_hub": {"version": "2.4.0"},
        "model": {
            "repo": "Lorbus/Qwen3.6-27B-int4-AutoRound",
            "revision": "74647d5994d2218fd73cc88c4603cf486c18b464",
            "local_dir": "qwen3.6-27b-autoround-int4",
        },
        "stacks": {
            "int8": {"image": image, "digest": DIGESTS[sha], "vllm_version": VERSIONS[sha]},
            "tq3-mtp-genesis": {
                "image": image,
                "digest": DIGESTS[sha],
                "vllm_version": VERSIONS[sha],
                "genesis": {"repo": GENESIS_REPO, "commit": genesis},
            },
        },
        "history": [],
    }


def write_pins(tmp_path: Path, data: dict[str, Any] | None = None) -> Pins:
    path = tmp_path / "pins.yaml"
    path.write_text(yaml.safe_dump(data or pins_data(), sort_keys=False))
    return load_pins(path)


def hosts(*stacks: str, canary: str | None = "host1") -> list[PlanHost]:
    """host1..N serving ``stacks`` in order; ``canary`` in group canary."""
    out = []
    for i, s in enumerate(stacks, start=1):
        name = f"host{i}"
        groups = ("gpu_hosts", "canary") if name == canary else ("gpu_hosts",)
        out.append(PlanHost(name, s, groups))
    return out


def bumped(pins: Pins, sha: str, names: tuple[str, ...] = ("int8", "tq3-mtp-genesis"),
           genesis: str | None = None) -> dict[str, StackPins]:  # fmt: skip
    """The bumped stacks' new pins (image ``sha``; Genesis commit changed when given)."""
    out = {}
    for n in names:
        p = pins.stacks[n]
        p = replace(p, image=f"vllm/vllm-openai:nightly-{sha}", digest=DIGESTS[sha],
                    vllm_version=VERSIONS[sha])  # fmt: skip
        if genesis and p.genesis is not None:
            p = replace(p, genesis=GenesisPin(p.genesis.repo, genesis))
        out[n] = p
    return out


def probe_of(state: dict[str, Any] | None = None, *, ledger_count: int = 0,
             ledger: tuple[dict[str, Any], ...] = (), reports: tuple[str, ...] = (),
             report: ReportSummary | None = None, busy: str | None = None) -> HostProbe:
    """A host probe's answer with these parts (what the rollout reads of it); ``busy``: who
    holds the host lock (a live holder)."""
    lock = {"who": busy, "alive": True} if busy else None
    return HostProbe({"state": state or {}, "lock": lock,
                      "ledger": {"count": ledger_count, "tail": list(ledger)},
                      "reports": {"files": list(reports),
                                  "newest": report.to_dict() if report else None}})
