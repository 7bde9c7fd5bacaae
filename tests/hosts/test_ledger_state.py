"""The ledger: ``state.json`` records what the inventory + pins say, agrees with what actually
runs, and the ledger's last line is that same state.

    pytest tests/hosts/test_ledger_state.py --inventory inventory/home.py
"""

from __future__ import annotations

import json
import shlex

import pytest

from rigfleet.catalog import CatalogError
from rigfleet.hostside.layout import HOST, MANIFEST_NAME, ROUTE_MARK, STACK_LABEL
from rigfleet.hostside.records import TRACKED_KEYS

STATE_FILE = str(HOST.state_file)
LEDGER_FILE = str(HOST.ledger_file)
ACTIVE_FILE = str(HOST.active_json)
ROUTE_FILE = str(HOST.front_route)
CHECKOUT = str(HOST.genesis_checkout)


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
    tracked = rig.want.current.tracked
    problems = [
        f"{key} is {state.get(key)!r}, inventory + pins say {tracked[key]!r}"
        for key in TRACKED_KEYS
        if state.get(key) != tracked[key]
    ]
    fail_if(f"{STATE_FILE} differs from inventory + pins", problems)


def running_problems(rig, state: dict, docker) -> list[str]:
    """What differs between the stack state.json records and its container."""
    stack = state.get("stack")
    try:
        name = rig.want.settings.catalog.get(str(stack)).container_name
    except CatalogError as e:
        return [f"state.json says stack {stack!r}, which this host cannot run: {e}"]
    c = docker.container(name)
    if c is None or (c.get("State") or {}).get("Status") != "running":
        return [f"state.json says stack {stack}, but {name} is not running"]
    problems = []
    labels = (c.get("Config") or {}).get("Labels") or {}
    if labels.get(STACK_LABEL) != stack:
        problems.append(
            f"{name} carries stack label {labels.get(STACK_LABEL)!r}, state.json says {stack!r}"
        )
    # The repository of the image state.json records (``vllm/vllm-openai:<tag>``).
    repository = str(state.get("image", "")).rsplit(":", 1)[0]
    _, running = docker.image_digests(c.get("Image", ""), repository)
    # A loaded archive has no repo digest: then the image id stands for the pinned digest.
    pinned = rig.want.stacks.get(str(stack))
    if (pinned is not None and pinned.pins.image_id and c.get("Image") == pinned.pins.image_id
            and state.get("digest") == pinned.pins.digest):
        running = [*running, pinned.pins.digest]
    if state.get("digest") not in running:
        problems.append(
            f"{name} runs digest {', '.join(running) or None} (of {repository}), state.json "
            f"says {state.get('digest')}"
        )
    return problems


def test_state_matches_what_runs(host, rig, state, docker, fail_if):
    problems = running_problems(rig, state, docker)
    manifest = host.file(f"{rig.want.model_path}/{MANIFEST_NAME}")
    try:
        revision = json.loads(manifest.content_string).get("revision") if manifest.exists else None
    except (ValueError, AttributeError):
        revision = None
    if revision != state.get("model_revision"):
        problems.append(
            f"weights manifest is at revision {revision}, state.json says "
            f"{state.get('model_revision')}"
        )
    if state.get("genesis_commit"):
        head = host.run(f"git -c safe.directory='*' -C {shlex.quote(CHECKOUT)} rev-parse HEAD")
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
    current = rig.want.current
    route_id = current.ref.route_id
    problems = []
    f = host.file(ACTIVE_FILE)
    try:
        ref = (json.loads(f.content_string).get("ref") or {}) if f.exists else None
    except (ValueError, AttributeError):
        ref = {}
    if ref is None:
        problems.append(f"{ACTIVE_FILE} is missing: no verified stack is recorded")
    else:
        if (ref.get("stack"), ref.get("config_hash")) != (current.name, current.config_hash):
            problems.append(
                f"{ACTIVE_FILE} records {ref.get('stack')}/{ref.get('config_hash')}, inventory "
                f"+ pins render {route_id}"
            )
        record = ref.get("record") or {}
        problems += [
            f"{ACTIVE_FILE} record {key} is {record.get(key)!r}, pins say {current.tracked[key]!r}"
            for key in TRACKED_KEYS
            if record.get(key) != current.tracked[key]
        ]
    route = host.file(ROUTE_FILE)
    first = (route.content_string.splitlines() or [""])[0] if route.exists else ""
    # The route include's first line (rigfleet.hostside.records.route reads it the same way).
    routed = first[len(ROUTE_MARK) :].strip() if first.startswith(ROUTE_MARK) else None
    if routed != route_id:
        problems.append(f"{ROUTE_FILE} routes to {routed or 'nothing'}, expected {route_id}")
    fail_if("active stack record", problems)
