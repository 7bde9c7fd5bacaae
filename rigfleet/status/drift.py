"""Drift: everything on a host (its ``--full`` probe) that differs from its ``DesiredHost``::

    find_drift(want, probe)
    # ['card 0 power limit 200 W, inventory 290 W']
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from rigfleet import gpu as gpu_parse
from rigfleet.desired import DesiredHost
from rigfleet.hostprobe import HostProbe
from rigfleet.hostside.layout import CONFIG_HASH_LABEL
from rigfleet.hostside.probe import GPU_FIELDS

# nvidia-smi prints limits with two decimals; a set limit reads back within a watt.
CAP_TOLERANCE_W = 0.5

_HEXLIKE = re.compile(r"(?:sha256:)?[0-9a-f]{40,64}")


def short(value: str | None, n: int = 12) -> str:
    """Digests and commits shortened for a message (``sha256:`` kept)."""
    if not value:
        return "-"
    if not _HEXLIKE.fullmatch(value):
        return value
    return value[: 7 + n] if value.startswith("sha256:") else value[:n]


def cap_drift(caps: Sequence[int], gpu: Mapping[str, Any]) -> list[str]:
    """The cards' power limits against the inventory's caps, or why nvidia-smi cannot say."""
    if gpu.get("rc") != 0:
        why = (gpu.get("stderr") or gpu.get("stdout") or "").strip().splitlines()
        return [f"nvidia-smi fails ({why[-1] if why else 'exit ' + str(gpu.get('rc'))})"]
    try:
        gpus = gpu_parse.parse_query_gpu(str(gpu.get("stdout", "")), GPU_FIELDS)
    except gpu_parse.GpuParseError as e:
        return [str(e)]
    by_index = {g.index: g for g in gpus}
    out = []
    for i, want in enumerate(caps):
        g = by_index.get(i)
        have = getattr(g, "power_limit_w", None)
        if g is None:
            out.append(f"card {i} missing (inventory cap {want} W)")
        elif have is None:
            out.append(f"card {i} power limit unknown, inventory {want} W")
        elif abs(float(have) - want) > CAP_TOLERANCE_W:
            out.append(f"card {i} power limit {have:g} W, inventory {want} W")
    return out


def supervisor_drift(sup: Mapping[str, Any] | None) -> list[str]:
    """The supervisor recreating a dead engine, given up, or not running."""
    if sup is None:
        return []
    if sup.get("error"):
        return [f"supervisor record {sup['error']}"]
    state, reason = str(sup.get("state") or ""), str(sup.get("reason") or "")
    tries = sup.get("recreations") or len(sup.get("attempts") or ())
    if state == "gave-up":
        return [f"supervisor gave up: {reason or 'crash loop'} (the front answers 503; fix "
                "the cause, then `rigfleet-host.pyz supervise --reset` or converge)"]
    if state in ("backoff", "recreating"):
        return [f"engine died ({sup.get('death') or reason or 'unknown'}); the supervisor is "
                f"recreating it (attempt {tries})"]
    if sup.get("alive") is False and state not in ("idle", "paused"):
        return ["the engine supervisor (rigfleet-supervise.service) is not running"]
    return []


def find_drift(want: DesiredHost, probe: HostProbe) -> list[str]:
    """Everything on the host that differs from ``want``, one short line each."""
    drift = cap_drift(want.settings.power_caps_w, probe.section("gpu"))
    drift += _stack_drift(want, probe)
    drift += supervisor_drift(probe.supervisor)
    if want.genesis is not None:
        head = probe.section("genesis").get("head")
        if head != want.genesis.commit:
            drift.append(f"Genesis HEAD {short(head)}, pin {short(want.genesis.commit)}")
    drift += _weights_drift(want, probe.section("manifest"))
    if (route := probe.route) is not None and route != want.current.ref.route_id:
        drift.append(f"front routes to {route}, expected {want.current.ref.route_id}")
    drift += _front_drift(want, probe.section("front"))
    state = probe.raw.get("state")
    if not isinstance(state, dict):
        drift.append(f"state.json {probe.state_error or 'unreadable'}")
    else:
        for key in ("stack", "digest", "genesis_commit", "model_revision"):
            expected = want.current.tracked.get(key)
            if state.get(key) != expected:
                drift.append(f"state.json {key} {short(str(state.get(key)))}, "
                             f"expected {short(str(expected))}")
    return drift


def _stack_drift(want: DesiredHost, probe: HostProbe) -> list[str]:
    out: list[str] = []
    current = want.current
    container = current.spec.container_name
    c = probe.containers.get(container)
    if c is None:
        out.append(f"container {container} does not exist")
    else:
        if c.get("status") != "running":
            out.append(f"container {container} is {c.get('status')}, not running")
        digests = [str(d) for d in c.get("digests") or []]
        # A loaded archive has no repo digest; its image id is the pinned one then.
        same_id = bool(current.pins.image_id) and c.get("image_id") == current.pins.image_id
        if current.pins.digest not in digests and not same_id:
            have = digests[0] if digests else None
            out.append(f"{container} runs {c.get('image') or c.get('image_id')} "
                       f"(digest {short(have)}), pin is {short(current.pins.digest)}")
        have_hash = c.get("hash") or (c.get("labels") or {}).get(CONFIG_HASH_LABEL)
        if have_hash != current.config_hash:
            out.append(f"{container} was started from another config (config-hash {have_hash},"
                       f" inventory + pins render {current.config_hash})")
    for other in want.other_containers:
        if (probe.containers.get(other) or {}).get("status") == "running":
            out.append(f"container {other} is running too (only {container} should)")
    return out


def _weights_drift(want: DesiredHost, m: Mapping[str, Any]) -> list[str]:
    if m.get("error"):
        return [f"weights manifest {m['error']}"]
    out = []
    model = want.model
    if m.get("repo") != model.repo:
        out.append(f"manifest repo {m.get('repo') or '-'}, pin {model.repo}")
    elif m.get("revision") != model.revision:
        out.append(f"manifest revision {short(m.get('revision'))}, pin {short(model.revision)}")
    if not m.get("intact"):
        out.append(f"weights: {m.get('reason')}")
    return out


def _front_drift(want: DesiredHost, front: Mapping[str, Any]) -> list[str]:
    out = []
    port = want.settings.front_port
    if front.get("with_key") != 200:
        out.append(f"front :{port} answers {front.get('with_key')} with the key"
                   + (f" ({front['error']})" if front.get("error") else ""))
    elif want.spec.served_model_name not in (front.get("models") or []):
        out.append(f"front lists {front.get('models')}, not {want.spec.served_model_name}")
    if front.get("no_key") != 401:
        out.append(f"front :{port} answers {front.get('no_key')} without the key")
    return out
