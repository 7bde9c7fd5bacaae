"""Docker: engine running, Compose v2, the nvidia runtime, the container toolkit at its pin.

pytest tests/hosts/test_docker_runtime.py --inventory inventory/home.py
"""

from __future__ import annotations

import json


def test_docker_running_and_enabled(host, rig, fail_if):
    docker = host.service("docker")
    problems = []
    if not docker.is_running:
        problems.append("docker.service is not running")
    if not docker.is_enabled:
        problems.append("docker.service is not enabled at boot")
    fail_if("Docker", problems)


def test_compose_v2(host, rig, sh, require):
    version = sh("docker compose version --short", "Compose v2 (`docker compose`)").strip()
    require(
        version.lstrip("v").startswith("2."),
        f"{rig.name}: `docker compose` is version {version!r}, expected Compose v2 (2.x)",
    )


def test_nvidia_runtime_registered(host, rig, sh, require):
    out = sh("docker info --format '{{json .Runtimes}}'", "docker info")
    try:
        runtimes = sorted(json.loads(out))
    except ValueError:
        runtimes = []
    require(
        "nvidia" in runtimes,
        f"{rig.name}: docker info lists runtimes {runtimes}, the nvidia runtime is missing",
    )


# What roles/container_toolkit.py installs and holds (a unit test keeps the two equal; the
# roles are not imported here, so a role being edited cannot break the host checks).
TOOLKIT_PACKAGES = (
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
)


def test_toolkit_at_pinned_version_and_held(host, rig, fail_if):
    pin = rig.want.pins.toolkit_version
    problems = []
    for name in TOOLKIT_PACKAGES:
        pkg = host.run(f"dpkg-query -W -f '${{Version}}\\t${{Status}}' {name}")
        version, _, status = pkg.stdout.partition("\t")
        if pkg.rc != 0 or not status.endswith(" installed"):
            problems.append(f"{name} is not installed (pin {pin})")
            continue
        if version != pin:
            problems.append(f"{name} is {version}, pins container_toolkit.version is {pin}")
        if not status.startswith("hold "):
            problems.append(f"{name} is not held (dpkg status '{status}')")
    fail_if("NVIDIA Container Toolkit", problems)
