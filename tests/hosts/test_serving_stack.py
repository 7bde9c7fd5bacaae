"""The serving stack: the inventory's stack runs, from the pinned image digest, started from
the compose file the deploy renders, alone, and reachable only on loopback.

    pytest tests/hosts/test_serving_stack.py --inventory inventory/home.py
"""

from __future__ import annotations

import difflib
import json
import shlex

import pytest

from rigfleet.catalog import STACKS, get_stack
from rigfleet.compose import (
    CONFIG_HASH_LABEL,
    LABEL_PREFIX,
    SERVICE,
    compose_document,
    compose_path,
    render_compose,
)
from rigfleet.status import running_digest


def inspect(host, name: str) -> dict | None:
    out = host.run(f"docker inspect --type container {shlex.quote(name)}")
    if out.rc != 0:
        return None
    data = json.loads(out.stdout)
    return data[0] if data else None


@pytest.fixture(scope="module")
def container(host, rig) -> dict:
    name = rig.exp.container
    data = inspect(host, name)
    if data is None:
        pytest.fail(
            f"{rig.name}: container {name} (stack {rig.exp.stack}) does not exist", pytrace=False
        )
    return data


def test_active_stack_container_running(rig, container, require):
    state = container.get("State") or {}
    require(
        state.get("Status") == "running",
        f"{rig.name}: container {rig.exp.container} is {state.get('Status')} "
        f"(exit code {state.get('ExitCode')}), expected running (stack {rig.exp.stack})",
    )


def test_container_runs_the_pinned_digest(host, rig, container, require):
    exp = rig.exp
    image_id = container.get("Image", "")
    out = host.run(f"docker image inspect --format '{{{{json .RepoDigests}}}}' {image_id}")
    digests = json.loads(out.stdout) if out.rc == 0 and out.stdout.strip() else []
    digest = running_digest({"repo_digests": digests}, exp.repository)
    require(
        digest == exp.digest,
        f"{rig.name}: container {exp.container} runs image "
        f"{(container.get('Config') or {}).get('Image')} ({image_id[:19]}, RepoDigests "
        f"{digests or 'none'}), pins stacks.{exp.stack} is {exp.image}@{exp.digest}",
    )


def test_container_labels_match_pins(rig, container, fail_if):
    exp = rig.exp
    labels = (container.get("Config") or {}).get("Labels") or {}
    doc = compose_document(get_stack(exp.stack), rig.pins, rig.settings)
    want = doc["services"][SERVICE]["labels"]
    problems = [
        f"label {key} is {labels.get(key)!r}, expected {value!r}"
        for key, value in want.items()
        if key.startswith(LABEL_PREFIX) and labels.get(key) != value
    ]
    if labels.get(CONFIG_HASH_LABEL) != want[CONFIG_HASH_LABEL]:
        problems.append("the container was not started from the compose file the deploy renders")
    fail_if(f"container {exp.container} labels", problems)


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_compose_file_as_rendered(host, rig, stack, require):
    if stack not in rig.pins.stacks:
        pytest.skip(f"stack {stack} is not pinned")
    path = compose_path(stack)
    f = host.file(path)
    require(f.exists, f"{rig.name}: {path} is missing")
    want = render_compose(get_stack(stack), rig.pins, rig.settings)
    have = f.content_string
    diff = list(
        difflib.unified_diff(
            want.splitlines(),
            have.splitlines(),
            "deploy renders",
            f"{rig.name}:{path}",
            lineterm="",
            n=0,
        )
    )
    require(
        have == want,
        f"{rig.name}: {path} differs from what the deploy renders:\n" + "\n".join(diff[:40]),
    )


def test_only_the_active_stack_runs(host, rig, require):
    running = [
        name for name in rig.exp.other_containers
        if (inspect(host, name) or {}).get("State", {}).get("Status") == "running"
    ]  # fmt: skip
    require(
        not running,
        f"{rig.name}: {running} running next to {rig.exp.container}; inventory stack is "
        f"{rig.exp.stack} and two stacks do not fit on the cards",
    )


def test_stack_port_on_loopback_only(rig, container, require):
    ports = (container.get("NetworkSettings") or {}).get("Ports") or {}
    bound = [
        f"{b.get('HostIp') or '0.0.0.0'}:{b.get('HostPort')}->{port}"
        for port, bindings in ports.items()
        for b in bindings or []
    ]
    open_ = [b for b in bound if not b.startswith(("127.0.0.1:", "[::1]:", "::1:"))]
    require(
        bound and not open_,
        f"{rig.name}: {rig.exp.container} publishes {bound or 'nothing'}; expected only "
        f"127.0.0.1:{rig.exp.stack_port} (the front is the only way in)",
    )
