"""The ledger: ``state.json`` records what the inventory + pins say, agrees with what actually
runs, and the ledger's last line is that same state.

    pytest tests/hosts/test_ledger_state.py --inventory inventory/home.py
"""

from __future__ import annotations

import json
import shlex

import pytest

from rigfleet.compose import GENESIS_HOST_DIR, LABEL_PREFIX
from rigfleet.status import (
    ACTIVE_FILE,
    LEDGER_FILE,
    MANIFEST_NAME,
    ROUTE_FILE,
    ROUTE_MARK,
    STATE_FILE,
    TRACKED_KEYS,
    running_digest,
)


@pytest.fixture(scope="module")
def state(host, rig) -> dict:
    f = host.file(STATE_FILE)
    if not f.exists:
        pytest.fail(
            f"{rig.name}: {STATE_FILE} is missing: the deploy never recorded this host",
            pytrace=False,
        )
    try:
        data = json.loads(f.content_string)
    except ValueError as e:
        pytest.fail(f"{rig.name}: {STATE_FILE} is not JSON ({e})", pytrace=False)
    if not isinstance(data, dict):
        pytest.fail(f"{rig.name}: {STATE_FILE} is not a JSON object", pytrace=False)
    return data


def test_state_records_inventory_and_pins(rig, state, fail_if):
    problems = [
        f"{key} is {state.get(key)!r}, inventory + pins say {rig.exp.tracked[key]!r}"
        for key in TRACKED_KEYS
        if state.get(key) != rig.exp.tracked[key]
    ]
    fail_if(f"{STATE_FILE} differs from inventory + pins", problems)


def test_state_matches_what_runs(host, rig, state, fail_if):
    problems = []
    name = f"rigfleet-{state.get('stack')}"
    out = host.run(f"docker inspect --type container {shlex.quote(name)}")
    c = json.loads(out.stdout)[0] if out.rc == 0 and out.stdout.strip() else None
    if c is None or (c.get("State") or {}).get("Status") != "running":
        problems.append(f"state.json says stack {state.get('stack')}, but {name} is not running")
    else:
        labels = (c.get("Config") or {}).get("Labels") or {}
        if labels.get(f"{LABEL_PREFIX}.stack") != state.get("stack"):
            problems.append(
                f"{name} carries stack label {labels.get(f'{LABEL_PREFIX}.stack')!r}, "
                f"state.json says {state.get('stack')!r}"
            )
        img = host.run(f"docker image inspect --format '{{{{json .RepoDigests}}}}' {c['Image']}")
        digests = json.loads(img.stdout) if img.rc == 0 and img.stdout.strip() else []
        repository = str(state.get("image", "")).rsplit(":", 1)[0]
        running = running_digest({"repo_digests": digests}, repository)
        if running != state.get("digest"):
            problems.append(f"{name} runs digest {running}, state.json says {state.get('digest')}")
    manifest = host.file(f"{rig.exp.model_path}/{MANIFEST_NAME}")
    try:
        revision = json.loads(manifest.content_string).get("revision") if manifest.exists else None
    except ValueError:
        revision = None
    if revision != state.get("model_revision"):
        problems.append(
            f"weights manifest is at revision {revision}, state.json says "
            f"{state.get('model_revision')}"
        )
    if state.get("genesis_commit"):
        head = host.run(f"git -c safe.directory='*' -C {GENESIS_HOST_DIR} rev-parse HEAD")
        if head.stdout.strip() != state["genesis_commit"]:
            problems.append(
                f"Genesis HEAD is {head.stdout.strip() or 'missing'}, state.json "
                f"says {state['genesis_commit']}"
            )
    fail_if(f"{STATE_FILE} differs from what runs", problems)


def test_ledger_ends_with_current_state(host, rig, state, fail_if):
    f = host.file(LEDGER_FILE)
    if not f.exists:
        pytest.fail(f"{rig.name}: {LEDGER_FILE} is missing", pytrace=False)
    lines = [line for line in f.content_string.splitlines() if line.strip()]
    problems = []
    entries = []
    for number, line in enumerate(lines, 1):
        try:
            entries.append(json.loads(line))
        except ValueError:
            problems.append(f"line {number} is not JSON: {line[:80]!r}")
    if not entries:
        problems.append("the ledger has no entries")
    else:
        last = entries[-1]
        problems += [
            f"last entry {key} is {last.get(key)!r}, state.json says {state.get(key)!r}"
            for key in TRACKED_KEYS
            if last.get(key) != state.get(key)
        ]
    fail_if(f"{LEDGER_FILE} inconsistent with {STATE_FILE}", problems)


def test_active_stack_record_and_front_route(host, rig, fail_if):
    # The swap transaction records what it verified (active.json) and points the front at it
    # (route.conf): both must name the inventory's stack as rendered from the pins.
    exp = rig.exp
    problems = []
    f = host.file(ACTIVE_FILE)
    try:
        ref = (json.loads(f.content_string).get("ref") or {}) if f.exists else None
    except (ValueError, AttributeError):
        ref = {}
    if ref is None:
        problems.append(f"{ACTIVE_FILE} is missing: no verified stack is recorded")
    else:
        if (ref.get("stack"), ref.get("config_hash")) != (exp.stack, exp.config_hash):
            problems.append(
                f"{ACTIVE_FILE} records {ref.get('stack')}/{ref.get('config_hash')}, inventory "
                f"+ pins render {exp.route_id}"
            )
        record = ref.get("record") or {}
        problems += [
            f"{ACTIVE_FILE} record {key} is {record.get(key)!r}, pins say {exp.tracked[key]!r}"
            for key in TRACKED_KEYS
            if record.get(key) != exp.tracked[key]
        ]
    route = host.file(ROUTE_FILE)
    first = route.content_string.splitlines()[0] if route.exists else ""
    routed = first[len(ROUTE_MARK) :].strip() if first.startswith(ROUTE_MARK) else None
    if routed != exp.route_id:
        problems.append(f"{ROUTE_FILE} routes to {routed or 'nothing'}, expected {exp.route_id}")
    fail_if("active stack record", problems)
