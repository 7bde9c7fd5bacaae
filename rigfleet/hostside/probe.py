"""The host probe: the host in one JSON object, each part catching its own failure (schema
``rigfleet-probe/1``; the keys: docs/architecture.md "The host probe")::

    python3 rigfleet-host.pyz probe --full --model-path /srv/models/qwen --front-port 8000
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .active import load_active, parse_active
from .layout import BASE_DIGEST_LABEL, CONFIG_HASH_LABEL, MANIFEST_NAME, STACK_LABEL, Layout
from .maintenance import window_status
from .plan import PlanError
from .records import (
    ThroughputRecord,
    ledger_tail,
    loaded_images,
    read_holder,
    read_json,
    read_supervisor,
    read_throughput_history,
    reports,
    route,
    weights_mismatch,
)
from .stackctl import read_api_key, run, smi_command

SCHEMA = "rigfleet-probe/1"
# What rigfleet status compares (power caps, driver, persistence).
GPU_FIELDS = ("index", "driver_version", "power.limit", "persistence_mode")
POWER_CAPS_UNIT = "rigfleet-power-caps.service"


def containers(lay: Layout) -> dict[str, dict[str, Any]]:
    """Every container with the stack label or a ``rigfleet-`` name, by name, with the image
    it runs and the digests that image stands for (its repo digests, a checked load's)."""
    fmt = (f'{{{{.Names}}}}\t{{{{.State}}}}\t{{{{.Label "{STACK_LABEL}"}}}}\t'
           f'{{{{.Label "{CONFIG_HASH_LABEL}"}}}}\t{{{{.CreatedAt}}}}')
    found: dict[str, dict[str, Any]] = {}
    for line in run(["docker", "ps", "-a", "--format", fmt])[1].splitlines():
        parts = line.split("\t")
        if len(parts) == 5 and (parts[2] or parts[0].startswith("rigfleet-")):
            found[parts[0]] = {"status": parts[1], "stack": parts[2], "hash": parts[3],
                               "created": parts[4]}
    if not found:
        return found
    fmt = "{{.Name}}\t{{.Config.Image}}\t{{.Image}}\t{{.State.StartedAt}}\t{{.RestartCount}}"
    for line in run(["docker", "inspect", "--type", "container", "--format", fmt,
                      *found])[1].splitlines():
        parts = line.split("\t")
        name = parts[0].lstrip("/")
        if len(parts) == 5 and name in found:
            found[name].update(image=parts[1], image_id=parts[2], started_at=parts[3],
                               restarts=int(parts[4]) if parts[4].isdigit() else None)
    inspected = [c for c in found.values() if "image_id" in c]
    digests: dict[str, list[str]] = {}
    loaded = loaded_images(lay)
    fmt = "{{.Id}}\t{{json .RepoDigests}}\t{{json .Config.Labels}}"
    for line in run(["docker", "image", "inspect", "--format", fmt,
                      *sorted({c["image_id"] for c in inspected})])[1].splitlines():
        image_id, _, rest = line.partition("\t")
        repo_digests, _, labels = rest.partition("\t")
        try:
            found_digests = [str(d).rpartition("@")[2] for d in json.loads(repo_digests) or []]
            image_labels = json.loads(labels) if labels.strip() else {}
        except ValueError:
            continue
        # A derived image carries the pinned image it was built from as a label.
        base = (image_labels or {}).get(BASE_DIGEST_LABEL)
        digests[image_id] = (found_digests + loaded.get(image_id, [])
                             + ([str(base)] if base else []))
    for c in inspected:
        c["digests"] = digests.get(c["image_id"], [])
    return found


def manifest(model_path: Path) -> dict[str, Any]:
    """The weights against the fetcher's manifest: sizes and mtimes (no hashing)."""
    m, err = read_json(model_path / MANIFEST_NAME)
    if not isinstance(m, dict):
        return {"error": err or "not an object"}
    reason = weights_mismatch(m.get("files"), lambda name: _stat(model_path / name))
    return {"repo": m.get("repo"), "revision": m.get("revision"),
            "intact": reason == "", "reason": reason or "matches manifest"}


def _stat(path: Path) -> tuple[int, float] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime


def _get(url: str, header: str | None = None) -> tuple[int | None, str]:
    req = urllib.request.Request(url)
    if header:
        k, _, v = header.partition(":")
        req.add_header(k.strip(), v.strip())
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read(65536).decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
    except Exception as e:  # any failure to answer is the answer
        return None, f"{type(e).__name__}: {e}"


def front(lay: Layout, port: int) -> dict[str, Any]:
    """The front's ``/v1/models`` answer without and with the API key."""
    base = f"http://127.0.0.1:{port}/v1/models"
    out: dict[str, Any] = {"no_key": _get(base)[0]}
    try:
        header = lay.auth_header_file.read_text().strip()
    except OSError as e:
        out["error"] = f"cannot read {lay.auth_header_file} ({e.strerror})"
        return out
    out["with_key"], body = _get(base, header)
    try:
        out["models"] = [str(x.get("id")) for x in json.loads(body).get("data", [])]
    except (ValueError, AttributeError):
        out["models"] = []
        if out["with_key"] is None:
            out["error"] = body
    return out


def genesis(lay: Layout) -> dict[str, Any] | None:
    """The Genesis checkout's HEAD and origin (None: no checkout)."""
    g = lay.genesis_checkout
    if not g.is_dir():
        return None
    git = ["git", "-c", "safe.directory=*", "-C", str(g)]
    rc, head, err = run([*git, "rev-parse", "--verify", "-q", "HEAD"])
    _, origin, _ = run([*git, "remote", "get-url", "origin"])
    return {"head": head.strip() or None, "origin": origin.strip() or None,
            "error": err.strip()[-300:] if rc else None}


def throughput(lay: Layout) -> dict[str, Any]:
    """The last gate's throughput record and the newest 20 verified ones (all stacks)."""
    history = read_throughput_history(lay.throughput_history)
    last = ThroughputRecord.from_dict(read_json(lay.throughput_last)[0])
    return {"last": last.to_dict() if last else None, "count": len(history),
            "history": [r.to_dict() for r in history[-20:]]}


def doctor(lay: Layout, load_s: float) -> dict[str, Any]:
    """The cards sampled idle and under load of the active stack."""
    from .bench.evidence import gather

    try:
        active = load_active(lay)
    except PlanError as e:
        return {"error": str(e)}
    if active is None:
        return {"error": "nothing verified is active on this host: no stack to load"}
    key = read_api_key(lay.api_key_file, lay.vllm_env_file) or None
    out = gather(active.ref.container, active.ref.port, key, load_s)
    out["stack"] = active.ref.stack
    return out


def probe(lay: Layout, full: bool = False, model_path: str | None = None,
          front_port: int | None = None, doctor_load_s: float | None = None) -> dict[str, Any]:
    """Everything above, as one dict (``full``: what status and the bump read)."""
    state, state_error = read_json(lay.state_file)
    active, _ = read_json(lay.active_json)
    _, active_error = parse_active(lay)
    window, window_state, window_why = window_status(lay)
    try:
        bundle: str | None = hashlib.sha256(lay.bundle.read_bytes()).hexdigest()
    except OSError:
        bundle = None
    out: dict[str, Any] = {
        "schema": SCHEMA,
        "active": active,
        "state": state if isinstance(state, dict) else None,
        "state_error": state_error or (None if isinstance(state, dict) else "not an object"),
        "lock": read_holder(lay.lock_dir),
        "containers": containers(lay),
        "route": route(lay.front_route),
        "bundle": bundle,
        "supervisor": read_supervisor(lay.supervise_state),
        "active_error": active_error or None,
        "maintenance": {"status": window_state, "why": window_why,
                        "window": window.to_dict() if window else None},
    }
    if not full:
        return out
    tail, count, problem = ledger_tail(lay.ledger_file)
    out["ledger"] = {"tail": tail, "count": count, "error": problem}
    files, newest = reports(lay.reports_dir)
    out["reports"] = {"files": files, "newest": newest.to_dict() if newest else None}
    rc, so, se = run(smi_command(",".join(GPU_FIELDS)))
    out["gpu"] = {"rc": rc, "stdout": so, "stderr": se.strip()[-500:]}
    rc, so, se = run(["systemctl", "is-enabled", POWER_CAPS_UNIT])
    out["caps_unit_enabled"] = so.strip() or se.strip()[-200:]
    out["genesis"] = genesis(lay)
    out["manifest"] = manifest(Path(model_path)) if model_path else None
    out["front"] = front(lay, front_port) if front_port else None
    out["throughput"] = throughput(lay)
    if doctor_load_s is not None:
        out["doctor"] = doctor(lay, doctor_load_s)
    return out
