"""The serving stack: the inventory's stack runs, from the pinned image digest, started from
the compose file the deploy renders, alone, and reachable only on loopback; every staged
stack's compose file is exactly what the deploy writes (``DesiredStack.text``).

    pytest tests/hosts/test_serving_stack.py --inventory inventory/home.py
"""

from __future__ import annotations

import difflib

import pytest

from rigfleet.compose import LABEL_PREFIX, SERVICE
from rigfleet.hostside.layout import CONFIG_HASH_LABEL


@pytest.fixture(scope="module")
def current(rig):
    """The desired stack as the deploy stages it (``rigfleet.desired.DesiredStack``)."""
    return rig.want.current


@pytest.fixture(scope="module")
def container(rig, current, docker) -> dict:
    name = current.spec.container_name
    data = docker.container(name)
    if data is None:
        pytest.fail(
            f"{rig.name}: container {name} (stack {current.name}) does not exist", pytrace=False
        )
    return data


def test_active_stack_container_running(rig, current, container, require):
    state = container.get("State") or {}
    require(
        state.get("Status") == "running",
        f"{rig.name}: container {current.spec.container_name} is {state.get('Status')} "
        f"(exit code {state.get('ExitCode')}), expected running (stack {current.name})",
    )


def test_container_runs_the_pinned_digest(rig, current, container, docker, require):
    pins = current.pins
    image_id = container.get("Image", "")
    digests, of_repository = docker.image_digests(image_id, pins.repository)
    require(
        pins.digest in of_repository or (bool(pins.image_id) and image_id == pins.image_id),
        f"{rig.name}: container {current.spec.container_name} runs image "
        f"{(container.get('Config') or {}).get('Image')} ({image_id[:19]}, RepoDigests "
        f"{digests or 'none'}), pins stacks.{current.name} is {pins.image_ref}",
    )


def test_container_labels_match_pins(rig, current, container, fail_if):
    labels = (container.get("Config") or {}).get("Labels") or {}
    want = current.document["services"][SERVICE]["labels"]
    problems = [
        f"label {key} is {labels.get(key)!r}, expected {value!r}"
        for key, value in want.items()
        if key.startswith(LABEL_PREFIX) and labels.get(key) != value
    ]
    if labels.get(CONFIG_HASH_LABEL) != current.config_hash:
        problems.append("the container was not started from the compose file the deploy renders")
    fail_if(f"container {current.spec.container_name} labels", problems)


def test_compose_files_as_rendered(host, rig, require):
    # Every stack the host stages (each pinned stack of its catalog), not only the desired one:
    # a switch starts from these files.
    problems = []
    for name, stack in sorted(rig.want.stacks.items()):
        path = stack.ref.compose_file
        f = host.file(path)
        if not f.exists:
            problems.append(f"{rig.name}: {path} is missing (stack {name})")
            continue
        have = f.content_string
        if have == stack.text:
            continue
        diff = difflib.unified_diff(
            stack.text.splitlines(),
            have.splitlines(),
            "deploy renders",
            f"{rig.name}:{path}",
            lineterm="",
            n=0,
        )
        problems.append(
            f"{rig.name}: {path} differs from what the deploy renders:\n"
            + "\n".join(list(diff)[:40])
        )
    require(not problems, "\n".join(problems))


def test_only_the_active_stack_runs(rig, current, docker, require):
    running = [
        name for name in rig.want.other_containers
        if ((docker.container(name) or {}).get("State") or {}).get("Status") == "running"
    ]  # fmt: skip
    require(
        not running,
        f"{rig.name}: {running} running next to {current.spec.container_name}; inventory stack "
        f"is {current.name} and two stacks do not fit on the cards",
    )


def test_stack_port_on_loopback_only(rig, current, container, require):
    ports = (container.get("NetworkSettings") or {}).get("Ports") or {}
    bound = [
        f"{b.get('HostIp') or '0.0.0.0'}:{b.get('HostPort')}->{port}"
        for port, bindings in ports.items()
        for b in bindings or []
    ]
    open_ = [b for b in bound if not b.startswith(("127.0.0.1:", "[::1]:", "::1:"))]
    require(
        bound and not open_,
        f"{rig.name}: {current.spec.container_name} publishes {bound or 'nothing'}; expected "
        f"only 127.0.0.1:{current.spec.port} (the front is the only way in)",
    )
