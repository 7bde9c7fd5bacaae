"""The roles through pyinfra's API on ``@fake`` hosts (no target, no network).

Each test builds an ``Inventory`` + ``State`` with one ``@fake`` host whose commands are
answered by a ``FakeRig`` (tests/unit/fake_rig.py): a small model of the host that also
applies the roles' commands, so "run twice" really sees a converged host. ``fake_delay`` is 0
and nothing sleeps, so the whole file runs in a few seconds.

Runs without xdist on purpose: nothing here imports ``pyinfra_cli`` (which monkey-patches
gevent and breaks xdist workers), but the roles' module-level state (the pins cache) is shared
per process anyway. Run: ``.venv/bin/python -m pytest tests/unit/test_roles_fake.py -q``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pyinfra
import pytest
import yaml
from fake_rig import FakeRig, Gpu, weights_manifest
from images_fakes import FakeHub, image_id_of
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.deploy import add_deploy
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.operations import run_ops
from pyinfra.connectors.fake import FakeConnector
from pyinfra.connectors.util import CommandOutput, OutputLine

import rigfleet.desired
import rigfleet.images.deploy
import roles.follow
import roles.nvidia_driver
import roles.preflight
import roles.swap
from rigfleet.check import Online, online_pass
from rigfleet.images.checks import SourceChecker
from rigfleet.packages import OsInfo
from rigfleet.retention import stale
from roles import converge
from roles import maintenance as roles_maintenance
from roles.docker import (
    changed_keys,
    daemon_settings,
    docker_packages,
    merge_daemon_config,
    restart_keys,
)
from roles.genesis import TREES_KEPT
from roles.preflight import run_deploy

GENESIS_REPO = "http://git.rigfleet.test:8090/genesis-vllm-patches.git"
GENESIS_COMMIT = "c" * 40
DIGEST = "sha256:" + "b" * 64
API_KEY = "k3y-" + "x" * 40
REPO = {
    "url": "http://apt.rigfleet.test/debian",
    "key_url": "http://apt.rigfleet.test/rigfleet-testbed.asc",
    "suite": "stable",
    "components": ["main"],
}
UNIT = "/etc/systemd/system/rigfleet-power-caps.service"
RIGS: dict[str, FakeRig] = {}


def pins_yaml(serial: int = 1, digest: str = DIGEST) -> str:
    image = "vllm/vllm-openai:nightly-01d4d1ad375dc5854779c593eee093bcebb0cada"
    return textwrap.dedent(
        f"""\
        schema: rigfleet-pins/1
        serial: {serial}
        driver: {{branch: "580"}}
        container_toolkit: {{version: 1.17.8-1}}
        huggingface_hub: {{version: 2.4.0}}
        model: {{repo: Lorbus/Qwen3.6-27B-int4-AutoRound, revision: "{"a" * 40}",
                 local_dir: qwen3.6-27b-autoround-int4}}
        stacks:
          int8: {{image: "vllm/vllm-openai:v0.27.1", digest: "{digest}", vllm_version: 0.27.1}}
          tq3-mtp-genesis:
            image: "{image}"
            digest: "{digest}"
            vllm_version: 0.20.2rc1.dev9+g01d4d1ad3
            genesis: {{repo: "{GENESIS_REPO}", commit: "{GENESIS_COMMIT}"}}
        history: []
        """
    )


@dataclass
class Run:
    """What one deploy did on the fake host."""

    rig: FakeRig
    plan: list[str]  # operations that would change (prepare phase)
    commands: list[str]  # every command sent while executing (facts included)
    failed: bool
    log: str
    refused: str | None = None  # the preflight's reason when it refused the host

    def ran(self, fragment: str) -> list[str]:
        return [c for c in self.commands if fragment in c]


def deploy_py() -> None:
    """What deploy.py runs for each host."""
    run_deploy(converge)


@pytest.fixture(autouse=True)
def _fast(monkeypatch):
    """No sleeping, a fresh pins cache, and the fake connector wired to the rig."""
    monkeypatch.setattr(roles.nvidia_driver, "REBOOT_DELAY_S", 0)
    monkeypatch.setattr(roles.nvidia_driver, "REBOOT_INTERVAL_S", 0)
    monkeypatch.setattr(roles.follow, "POLL_S", 0)
    rigfleet.desired._PINS.clear()
    # The pinned digest is on "Docker Hub" (the default image source's preflight check).
    hub = {DIGEST: (image_id_of(DIGEST), 9 * 1024**3)}
    monkeypatch.setattr(rigfleet.images.deploy, "SourceChecker",
                        lambda: SourceChecker(lambda url: FakeHub(url, hub)))

    def run_shell_command(self, command, print_output=False, print_input=False, **arguments):
        text = command if isinstance(command, str) else command.get_raw_value()
        stdin = arguments.get("_stdin")
        ok, lines = RIGS[self.host.data.get("fake_rig")].respond(
            text, stdin if stdin is None else "".join(stdin))
        return ok, CommandOutput([OutputLine("stdout", line) for line in lines])

    def put_file(self, filename_or_io, remote_filename, *args, **kwargs):
        if isinstance(filename_or_io, str):
            data = Path(filename_or_io).read_bytes()
        else:
            filename_or_io.seek(0)  # as pyinfra's get_file_io does
            data = filename_or_io.read()
        if isinstance(data, str):
            data = data.encode()
        RIGS[self.host.data.get("fake_rig")].put(remote_filename, data)
        return True

    monkeypatch.setattr(FakeConnector, "run_shell_command", run_shell_command)
    monkeypatch.setattr(FakeConnector, "put_file", put_file)


@pytest.fixture
def data(tmp_path: Path) -> dict:
    """Host data as the simulated fleet's inventory gives it (plus the fake's own keys)."""
    key = tmp_path / "api-key"
    key.write_text(API_KEY + "\n")
    key.chmod(0o600)
    pins = tmp_path / "pins.yaml"
    pins.write_text(pins_yaml())
    return {
        "fake_delay": 0,
        "fake_delay_jitter": 0,
        "stack": "int8",
        "power_caps_w": [250, 260],
        "gpu_count": 2,
        "model_dir": "/srv/models",
        "front_port": 8000,
        "api_key_file": str(key),
        "pins_file": str(pins),
        "docker_registry_mirror": "http://registry.rigfleet.test:5000",
        "hf_endpoint": "http://hub.rigfleet.test:8080",
        "apt_repos": {"cuda": REPO, "nvidia-container-toolkit": REPO},
    }


def deploy(rig: FakeRig, data: dict, execute: bool = True, fn=deploy_py,
           yes: bool = False) -> Run:
    """Prepare (change detection on; off with ``yes``, as ``pyinfra -y``) and, unless
    ``execute`` is False, run on the fake host."""
    return deploy_many({"@fake/rig": (rig, data)}, execute, fn, yes)["@fake/rig"]


def deploy_many(hosts: dict[str, tuple[FakeRig, dict]], execute: bool = True, fn=deploy_py,
                yes: bool = False, groups: dict[str, list[str]] | None = None) -> dict[str, Run]:
    """One run over several fake hosts (name -> (rig, data)), as pyinfra runs a fleet;
    ``groups``: inventory groups (name -> host names), e.g. ``{"balancers": ["lb1"]}``."""
    # pyinfra copies host data values, so each rig travels as a key into RIGS.
    for rig, _ in hosts.values():
        RIGS[str(id(rig))] = rig
    inventory = Inventory(([(name, {**data, "fake_rig": str(id(rig))})
                            for name, (rig, data) in hosts.items()], {}),
                          **{g: (members, {}) for g, members in (groups or {}).items()})
    state = State(inventory, Config(), check_for_changes=not yes)
    connect_all(state)
    add_deploy(state, fn)
    plans: dict[str, list[str]] = {name: [] for name in hosts}
    for op_hash in state.get_op_order():
        for name in hosts:
            host = inventory.get_host(name)
            if op_hash not in state.ops[host]:
                continue
            op_data = state.get_op_data_for_host(host, op_hash)
            if op_data.operation_meta._maybe_is_change:
                plans[name].append(", ".join(sorted(state.op_meta[op_hash].names)))
    starts = {name: len(rig.commands) for name, (rig, _) in hosts.items()}
    if execute:
        with contextlib.suppress(PyinfraError):
            run_ops(state)
    refused = roles.preflight._REFUSED.get(state) or {}
    return {name: Run(rig, plans[name], rig.commands[starts[name]:],
                      inventory.get_host(name) in state.failed_hosts, "", refused.get(name))
            for name, (rig, _) in hosts.items()}


def converged(os_key: str, data: dict) -> FakeRig:
    rig = FakeRig(os_key)
    first = deploy(rig, data)
    assert not first.failed
    return rig


# --- per-distro package paths ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("os_key", "docker_pkgs", "driver_pkgs", "cuda_repo"),
    [
        (
            "ubuntu2204",
            "docker.io docker-compose-v2",
            "nvidia-driver-580-server-open nvidia-utils-580-server nvidia-compute-utils-580-server",
            False,
        ),
        (
            "ubuntu2404",
            "docker.io docker-compose-v2",
            "nvidia-driver-580-server-open nvidia-utils-580-server nvidia-compute-utils-580-server",
            False,
        ),
        (
            "debian12",
            "docker-ce docker-ce-cli containerd.io docker-compose-plugin",
            "nvidia-kernel-open-dkms nvidia-driver-cuda nvidia-smi nvidia-persistenced",
            True,
        ),
        (
            "debian13",
            "docker.io docker-cli docker-compose",
            "nvidia-kernel-open-dkms nvidia-driver-cuda nvidia-smi nvidia-persistenced",
            True,
        ),
    ],
)
def test_bare_host_installs_the_right_packages_then_converges(
    data, os_key, docker_pkgs, driver_pkgs, cuda_repo
):
    rig = FakeRig(os_key)
    if os_key == "debian12":
        rig.packages["linux-image-6.1.0-40-amd64"] = "6.1.158-1"
    run = deploy(rig, data)
    assert not run.failed, rig.commands[-5:]

    installs = [c.split(" install ", 1)[1] for c in run.ran("apt-get") if " install " in c]
    assert installs[0] == "ca-certificates curl gnupg git python3 python3-venv jq chrony"
    assert docker_pkgs in installs
    assert driver_pkgs in installs
    assert (
        "nvidia-container-toolkit=1.17.8-1 nvidia-container-toolkit-base=1.17.8-1 "
        "libnvidia-container-tools=1.17.8-1 libnvidia-container1=1.17.8-1"
    ) in installs
    assert f"apt-mark hold {driver_pkgs}" in run.commands
    # Each install is preceded by exactly one apt-get update.
    assert len(
        run.ran(
            "apt-get -y -q -o DPkg::Lock::Timeout=120 -o Dpkg::Options::=--force-confdef -o "
            "Dpkg::Options::=--force-confold update"
        )
    ) == len(installs)

    if os_key.startswith("ubuntu"):
        assert "linux-modules-nvidia-580-server-open-generic" in installs
        assert not any(p.startswith("/etc/apt/sources.list.d/rigfleet-cuda") for p in rig.files)
        assert "/etc/apt/preferences.d/rigfleet-nvidia-driver" not in rig.files
    else:
        sources = rig.files["/etc/apt/sources.list.d/rigfleet-cuda.sources"].decode()
        assert sources == (
            "Types: deb\nURIs: http://apt.rigfleet.test/debian\nSuites: stable\n"
            "Components: main\nSigned-By: /etc/apt/keyrings/rigfleet-testbed.gpg\n"
        )
        prefs = rig.files["/etc/apt/preferences.d/rigfleet-nvidia-driver"].decode()
        assert "Pin: version 580.*\nPin-Priority: 1001\n" in prefs
        assert "/etc/apt/keyrings/rigfleet-testbed.gpg" in rig.keyrings
        keyring_cmd = run.ran("curl -fsSL http://apt.rigfleet.test/rigfleet-testbed.asc")
        assert any("gpg --batch --yes --dearmor" in c for c in keyring_cmd)
    if os_key == "debian12":
        # The running kernel's headers, and the flavour's metapackage: the next kernel gets a
        # DKMS build too.
        assert "linux-headers-6.1.0-40-amd64 linux-headers-amd64 mokutil" in installs
        assert "/etc/apt/sources.list.d/rigfleet-docker.sources" in rig.files
    if os_key == "debian13":
        # A kernel that is not a Debian package (a container's) gets no headers.
        assert not any("linux-headers" in i for i in installs)
        assert "mokutil" in installs
    if os_key.startswith("ubuntu"):
        # The prebuilt module is built for one driver version: held with the driver.
        assert "apt-mark hold linux-modules-nvidia-580-server-open-generic" in run.commands
    # nginx's default site is gone: only the front listens.
    assert "/etc/nginx/sites-enabled/default" not in rig.links

    # The host is now converged: --dry plans nothing, and a second run changes nothing.
    again = deploy(rig, data, execute=False)
    assert again.plan == []
    second = deploy(rig, data)
    assert not second.failed
    assert second.ran(" install ") == []
    assert second.ran("systemctl reboot") == []
    assert second.ran("compose") == [] or all(" up " not in c for c in second.ran("compose"))
    assert rig.reboots == 1


def test_docker_package_choice_is_documented_per_os():
    def os(i, v):
        return OsInfo(i, v, "x", "k")

    assert docker_packages(os("debian", "13")) == ("docker.io", "docker-cli", "docker-compose")
    assert docker_packages(os("debian", "12"))[-1] == "docker-compose-plugin"
    assert docker_packages(os("ubuntu", "22.04")) == ("docker.io", "docker-compose-v2")


# --- reboot ---------------------------------------------------------------------------------


def test_no_reboot_when_driver_loaded_and_packages_unchanged(data):
    rig = converged("debian13", data)
    run = deploy(rig, data)
    assert run.ran("systemctl reboot") == [] and rig.reboots == 1
    assert "NVIDIA driver | Reboot to load the NVIDIA driver (only when needed)" not in run.plan


def test_reboot_when_driver_not_loaded_even_if_packages_are_in_place(data):
    rig = converged("ubuntu2404", data)
    rig.driver_loaded = None  # e.g. installed by hand, never rebooted
    run = deploy(rig, data)
    assert not run.failed
    assert run.ran(" install ") == []
    assert len(run.ran("systemctl reboot")) == 1 and rig.reboots == 2
    assert rig.driver_loaded == "580.105.08"


def test_reboot_when_the_packages_are_pinned_but_another_branch_is_still_loaded(data):
    # A driver change whose reboot never happened (the host refused it for Secure Boot, or
    # the run was cut after the install): the packages are right, the loaded module is not.
    rig = converged("debian13", data)
    rig.driver_loaded = "590.44.01"
    run = deploy(rig, data)
    assert not run.failed, run.error
    assert run.ran(" install nvidia-driver-cuda") == []
    assert len(run.ran("systemctl reboot")) == 1 and rig.reboots == 2
    assert rig.driver_loaded == "580.105.08"

def test_reboot_and_downgrade_when_installed_driver_is_on_another_branch(data):
    rig = converged("debian13", data)
    rig.packages["nvidia-driver-cuda"] = "590.44.01-1"
    rig.driver_loaded = "590.44.01"
    run = deploy(rig, data)
    assert not run.failed
    # A serving host: the packages are fetched, the package manager checked, and only then
    # the window opens and they are installed.
    [fetch, install] = run.ran(" install nvidia-driver-cuda")
    assert "--download-only" in fetch and "--download-only" not in install
    assert "--allow-downgrades --allow-change-held-packages" in install
    [ready] = run.ran("maintenance ready --packages")
    [opened] = [c for c in run.ran("maintenance open") if "NVIDIA driver 580" in c]
    assert run.commands.index(ready) < run.commands.index(fetch) < run.commands.index(opened) \
        < run.commands.index(install)
    assert len(run.ran("systemctl reboot")) == 1
    [reboot_step] = run.ran("--step 'reboot to load the NVIDIA driver'")
    assert "--reboot-grace-s 1200" in reboot_step
    assert run.commands.index(run.ran("systemctl reboot")[0]) \
        < run.commands.index(run.ran("maintenance hold")[0])
    assert rig.driver_loaded == "580.105.08"


def test_missing_gpu_refuses_the_host_before_any_change(data):
    rig = converged("debian13", data)
    rig.gpus = rig.gpus[:1]  # a card fell off the bus
    before = dict(rig.files)
    run = deploy(rig, data)
    assert run.failed and run.refused
    assert "power_caps_w: [250, 260] has 2 cap(s) but the host has 1 GPU(s)" in run.refused
    assert "gpu_count: 2 but nvidia-smi lists 1 GPU(s) (indexes: 0)" in run.refused
    assert run.plan == ["Preflight | Refused (the reason is above; nothing runs on this host)"]
    assert run.commands == [] and rig.files == before


def test_driver_verification_fails_a_bare_host_with_another_gpu_count(data):
    rig = FakeRig("debian13")
    rig.gpus.append(Gpu(2))  # seen only once the driver is loaded, after the reboot
    run = deploy(rig, data)
    assert run.failed
    assert rig.reboots == 1
    assert run.ran("nvidia-container-toolkit") == []  # stopped at the driver check


def test_a_driver_branch_the_repository_lacks_stops_the_host_before_the_install(data, caplog):
    """NVIDIA's debian13 repository has no 580 (the fake's pins): apt's preferences pin would
    match nothing and apt would install the newest branch; the host stops first, naming the
    pin, the repository and what it has."""
    rig = FakeRig("debian13")
    rig.cuda_offers = ["595.58.03-1", "620.37.02-1"]
    run = deploy(rig, data)
    assert run.failed
    log = " ".join(caplog.text.split())
    assert "@fake/rig: driver.branch: 580 is not in apt_repos.cuda (" in log, log[-2000:]
    assert "versions there: 595.58.03-1 620.37.02-1" in log
    assert not [c for c in run.ran(" install ") if "nvidia-driver-cuda" in c]
    assert "nvidia-driver-cuda" not in rig.packages and rig.reboots == 0
    rig.cuda_offers = ["580.105.08-1", "595.58.03-1"]
    run = deploy(rig, data)
    assert not run.failed, run.log[-2000:]
    assert rig.packages["nvidia-driver-cuda"].startswith("580.")


# --- power ----------------------------------------------------------------------------------


def test_power_unit_content_and_caps_applied(data):
    rig = converged("debian13", data)
    unit = rig.files[UNIT].decode()
    body = [line for line in unit.splitlines() if line and not line.startswith("#")]
    assert body == [
        "[Unit]",
        "Description=rigfleet: apply GPU power caps",
        "After=nvidia-persistenced.service",
        "Wants=nvidia-persistenced.service",
        "[Service]",
        "Type=oneshot",
        "RemainAfterExit=yes",
        "ExecStart=/usr/bin/nvidia-smi -i 0 -pl 250",
        "ExecStart=/usr/bin/nvidia-smi -i 1 -pl 260",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    assert rig.modes[UNIT] == "0644"
    assert "rigfleet-power-caps.service" in rig.enabled
    assert [g.limit for g in rig.gpus] == [250.0, 260.0]


def test_caps_reapplied_only_when_read_back_differs(data):
    rig = converged("debian13", data)
    run = deploy(rig, data)
    assert run.ran("systemctl restart rigfleet-power-caps.service") == []
    rig.gpus[1].limit = 350.0  # someone ran nvidia-smi -pl by hand
    run = deploy(rig, data)
    assert len(run.ran("systemctl restart rigfleet-power-caps.service")) == 1
    assert [g.limit for g in rig.gpus] == [250.0, 260.0]


@pytest.mark.parametrize("yes", [False, True], ids=["prompt", "-y"])
def test_cap_outside_the_cards_range_changes_nothing_with_or_without_y(data, yes):
    """With -y pyinfra skips change detection, so a check inside an operation would only run
    after the packages and a reboot: the preflight checks the caps in both modes."""
    rig = converged("debian13", data)
    before = (dict(rig.files), dict(rig.packages), rig.reboots)
    run = deploy(rig, {**data, "power_caps_w": [250, 400]}, yes=yes)
    message = run.refused or ""
    assert "@fake/rig: power_caps_w[1]: 400 W is outside card 1 (NVIDIA GeForce RTX 3090)'s " \
           "range; allowed: 100..350 W" in message
    assert run.failed and run.commands == []
    assert (dict(rig.files), dict(rig.packages), rig.reboots) == before


# --- docker and the container toolkit -------------------------------------------------------


def test_daemon_json_is_merged_not_overwritten():
    current = {
        "data-root": "/data/docker",
        "log-opts": {"labels": "x"},
        "runtimes": {"nvidia": {"path": "nvidia-container-runtime"}},
        "exec-opts": ["native.cgroupdriver=systemd", "isolation=default"],
    }
    merged = merge_daemon_config(current, daemon_settings("http://mirror:5000"))
    assert merged == {
        "data-root": "/data/docker",
        "runtimes": {"nvidia": {"path": "nvidia-container-runtime"}},
        "log-driver": "json-file",
        "log-opts": {"labels": "x", "max-size": "100m", "max-file": "5"},
        "registry-mirrors": ["http://mirror:5000"],
        "live-restore": True,
        # A user's other exec-opts stay; the cgroup driver is rigfleet's (#48).
        "exec-opts": ["isolation=default", "native.cgroupdriver=cgroupfs"],
    }
    assert merge_daemon_config(merged, daemon_settings(None)) == merged
    keys = changed_keys(current, merged)
    assert keys == ["exec-opts", "live-restore", "log-driver", "log-opts", "registry-mirrors"]
    assert restart_keys(keys) == ["exec-opts", "log-driver", "log-opts"]
    assert restart_keys(["live-restore", "registry-mirrors", "runtimes"]) == []


def test_nvidia_ctk_runs_only_when_the_runtime_is_missing(data):
    rig = converged("debian13", data)
    daemon = json.loads(rig.files["/etc/docker/daemon.json"])
    assert daemon["registry-mirrors"] == ["http://registry.rigfleet.test:5000"]
    assert "nvidia" in daemon["runtimes"]

    run = deploy(rig, data)
    assert run.ran("nvidia-ctk") == [] and run.ran("systemctl restart docker") == []

    del daemon["runtimes"]
    rig.files["/etc/docker/daemon.json"] = json.dumps(daemon).encode()
    run = deploy(rig, data)
    assert len(run.ran("nvidia-ctk runtime configure --runtime=docker")) == 1
    # "runtimes" is a key dockerd reloads: a reload, the serving stack untouched.
    assert run.ran("systemctl restart docker") == []
    assert len(run.ran("systemctl reload docker")) == 1 and rig.runtimes_registered
    assert run.ran("maintenance open") == [] and rig.containers["rigfleet-int8"][0] == "running"


def test_invalid_daemon_json_fails_the_host_with_a_message(data):
    rig = converged("debian13", data)
    rig.files["/etc/docker/daemon.json"] = b"{not json"
    run = deploy(rig, data)
    assert run.failed
    assert rig.files["/etc/docker/daemon.json"] == b"{not json"


# --- stacks ---------------------------------------------------------------------------------


def test_converged_host_starts_no_transaction(data):
    rig = converged("debian13", data)
    status, label = rig.containers["rigfleet-int8"]
    assert status == "running" and label
    assert rig.route == f"int8/{label}" and len(rig.swaps) == 1
    run = deploy(rig, data)
    assert run.ran("systemd-run") == [] and run.ran("docker compose -p") == []
    assert "Swap | Serve int8/" not in " ".join(run.plan)
    assert len(rig.swaps) == 1

    rig.containers["rigfleet-int8"] = ("exited", label)  # it died: recreated, no gate
    run = deploy(rig, data)
    assert len(run.ran("rigfleet-host.pyz ensure")) == 1 and run.ran("systemd-run") == []
    assert rig.containers["rigfleet-int8"] == ("running", label)


@pytest.mark.parametrize("unit", ["rigfleet-stack", "rigfleet-supervise"])
def test_the_stack_and_supervisor_units_start_only_after_the_swap(data, unit):
    """Both take the host lock: started before the swap (pyinfra's ``running`` default), the
    stack unit's ``ensure`` (a host whose first activation failed) or a supervisor a person
    had stopped (it finds their hand-made container and recreates it) made the swap's probe
    refuse the host as "locked by ..." (tests/e2e/test_08_faults.py and test_06 met them)."""
    rig = FakeRig("debian13")
    run = deploy(rig, data)
    assert not run.failed
    swap = next(i for i, c in enumerate(run.commands) if "systemd-run --unit rigfleet-swap-" in c)
    starts = [i for i, c in enumerate(run.commands)
              if re.search(rf"systemctl (re)?start {unit}", c)]
    assert starts and min(starts) > swap, [run.commands[i] for i in starts]
    assert f"{unit}.service" in rig.enabled


def test_switching_stack_runs_the_gated_transaction_and_records_it(data):
    rig = converged("debian13", data)
    assert len(rig.ledger) == 1
    dry = deploy(rig, {**data, "stack": "tq3-mtp-genesis"}, execute=False)
    assert [n for n in dry.plan if n.startswith(("Swap", "Ledger"))] == [
        next(n for n in dry.plan if n.startswith("Swap | Serve tq3-mtp-genesis/"))]
    run = deploy(rig, {**data, "stack": "tq3-mtp-genesis"})
    assert not run.failed
    [start] = run.ran("systemd-run --unit rigfleet-swap-")
    plan_path = start.rsplit(" ", 1)[1]
    plan = json.loads(rig.files[plan_path])
    assert plan["desired"]["stack"] == "tq3-mtp-genesis" and plan["desired"]["port"] == 8015
    assert plan["desired"]["compose_file"] == "/opt/rigfleet/stacks/tq3-mtp-genesis/compose.yaml"
    assert plan["gate_profile"] == "full" and plan["by"]
    assert plan["why"].startswith("swap int8/")
    assert set(rig.containers) == {"rigfleet-tq3-mtp-genesis"}
    assert rig.genesis_head == GENESIS_COMMIT
    entry = json.loads(rig.ledger[-1])
    assert entry["stack"] == "tq3-mtp-genesis" and entry["genesis_commit"] == GENESIS_COMMIT
    state = json.loads(rig.files["/var/lib/rigfleet/state.json"])
    assert state["stack"] == "tq3-mtp-genesis"
    # The front's server block includes the route the host-side tool switches; its only
    # proxy of its own is the node exporter's (on loopback, behind the key), never a stack.
    conf = rig.files["/etc/nginx/conf.d/rigfleet-front.conf"]
    proxies = [line.strip() for line in conf.splitlines() if b"proxy_pass" in line]
    assert b"include /etc/nginx/rigfleet/route.conf;" in conf
    assert proxies == [b"proxy_pass http://127.0.0.1:9100/metrics;"], proxies
    again = deploy(rig, {**data, "stack": "tq3-mtp-genesis"})
    assert again.ran("systemd-run") == [] and len(rig.ledger) == 2


def test_a_rolled_back_swap_fails_the_host_with_the_reason(data, caplog):
    rig = converged("debian13", data)
    rig.swap_failure = ("gate", "gate failed 2 check(s): needles, needles_deep")
    run = deploy(rig, {**data, "stack": "tq3-mtp-genesis"})
    assert run.failed
    assert "swap to tq3-mtp-genesis rolled back (gate failed): gate failed 2 check(s)" in (
        " ".join(run.commands))
    assert set(rig.containers) == {"rigfleet-int8"}
    # The ledger role does not run after a failed swap: state.json still says int8.
    assert json.loads(rig.files["/var/lib/rigfleet/state.json"])["stack"] == "int8"


def test_a_live_host_lock_refuses_the_host_naming_the_holder(data):
    rig = converged("debian13", data)
    rig.lock = {"who": "bob@laptop", "why": "swap int8 -> tq3-mtp-genesis", "pid": 42,
                "since": "2026-11-29T10:00:00+00:00", "deploy_id": "X", "alive": True}
    run = deploy(rig, {**data, "stack": "tq3-mtp-genesis"})
    assert run.failed and "locked by bob@laptop since 2026-11-29T10:00" in (run.refused or "")
    assert run.ran("systemd-run") == [] and set(rig.containers) == {"rigfleet-int8"}
    rig.lock["alive"] = False  # stale: its process is gone; the run goes ahead
    assert not deploy(rig, {**data, "stack": "tq3-mtp-genesis"}).failed


def test_the_hosts_own_units_holding_the_lock_are_waited_for(data, monkeypatch):
    """Right after a first converge the stack unit's ``ensure`` holds the host lock for a few
    seconds: a deploy then waits for it rather than refusing; one that keeps holding is
    refused after the wait, as any holder is."""
    import roles.preflight

    monkeypatch.setattr(roles.preflight, "OWN_UNITS_WAIT_S", 0.3)
    rig = converged("debian13", data)
    ensure = {"who": "rigfleet-stack.service", "why": "ensure", "pid": 7, "alive": True,
              "since": "2026-11-29T10:00:00+00:00"}
    rig.lock, rig.lock_probes = dict(ensure), 2
    run = deploy(rig, {**data, "stack": "tq3-mtp-genesis"})
    assert not run.failed and set(rig.containers) == {"rigfleet-tq3-mtp-genesis"}
    rig.lock = dict(ensure)  # it never lets go
    run = deploy(rig, {**data, "stack": "int8"})
    assert run.failed and "locked by rigfleet-stack.service" in (run.refused or "")
    assert run.ran("systemd-run") == []


def test_gate_profile_is_checked_before_anything_runs(data):
    run = deploy(FakeRig("debian13"), {**data, "gate_profile": "quick"}, execute=False)
    assert "gate_profile: 'quick' is not allowed; allowed: fast, full" in (run.refused or "")
    run = deploy(FakeRig("debian13"), {**data, "gate_set": ["nope=1"]}, execute=False)
    assert "gate_set: --set nope=1: unknown key 'nope'" in (run.refused or "")
    rig = FakeRig("debian13")
    deploy(rig, {**data, "gate_profile": "fast", "gate_set": ["soak_sessions=2"]})
    [plan] = [json.loads(v) for k, v in rig.files.items() if k.endswith("/plan.json")]
    assert plan["gate_profile"] == "fast" and plan["gate_set"][-1] == "soak_sessions=2"
    assert "throughput_stack=int8" in plan["gate_set"]


def test_genesis_stack_refused_when_vllm_is_not_on_the_allowlist(data, caplog):
    rig = FakeRig("debian13")
    rig.allowlist = ["0.20.1rc1.dev16+g7a1eb8ac2"]
    run = deploy(rig, {**data, "stack": "tq3-mtp-genesis"})
    assert run.failed
    assert ("stack tq3-mtp-genesis: vLLM 0.20.2rc1.dev9+g01d4d1ad3 (image "
            "vllm/vllm-openai:nightly-") in caplog.text
    assert "is not on Genesis cccccccccccc's KNOWN_GOOD_VLLM_PINS" in caplog.text
    assert "vllm/_genesis/guards.py: 0.20.1rc1.dev16+g7a1eb8ac2)" in caplog.text
    assert rig.containers == {}
    assert run.ran("docker compose -p rigfleet-tq3-mtp-genesis") == []


def test_genesis_stack_refused_for_switches_the_pinned_genesis_does_not_know(data, caplog):
    rig = FakeRig("debian13")
    switches = {n: "experimental"
                for n in ("P67_TQ_MULTI_QUERY_KERNEL", "P58_ASYNC_PLACEHOLDER_FIX")}
    rig.genesis_switches = {**switches, "P64_QWEN3CODER_MTP_STREAMING": "retired"}
    rig.genesis_layout = "v7"
    run = deploy(rig, {**data, "stack": "tq3-mtp-genesis"})
    assert run.failed
    # v7 never skips retired patches: only the switches it does not know are refused.
    assert "GENESIS_ENABLE_P64_QWEN3CODER_MTP_STREAMING" not in caplog.text
    assert ("stack tq3-mtp-genesis: GENESIS_ENABLE_P60_GDN_NGRAM_FIX=1: Genesis cccccccccccc has "
            "no such switch") in caplog.text
    assert "remove it from the stack file's genesis.switches.v7.on" in caplog.text
    assert rig.containers == {}
    assert run.ran("docker compose -p rigfleet-tq3-mtp-genesis") == []


def test_genesis_checkout_of_another_layout_than_pinned_is_refused(data, caplog):
    rig = FakeRig("debian13")
    rig.genesis_layout = "v12"  # the pinned commit's files are sndr/, the pins say v7
    run = deploy(rig, {**data, "stack": "tq3-mtp-genesis"})
    assert run.failed
    assert (f"Genesis checkout /opt/rigfleet/genesis at {GENESIS_COMMIT[:12]} has the v12 layout "
            "(sndr/apply/__main__.py), but the pins say layout v7") in caplog.text
    assert rig.containers == {}


def test_genesis_tree_exported_mounted_and_pruned(data):
    rig = converged("debian13", {**data, "stack": "tq3-mtp-genesis"})
    tree = f"/opt/rigfleet/genesis-trees/{GENESIS_COMMIT}"
    assert list(rig.genesis_trees) == [GENESIS_COMMIT]
    compose = rig.files["/opt/rigfleet/stacks/tq3-mtp-genesis/compose.yaml"].decode()
    assert f"{tree}/vllm/_genesis:" in compose and "/opt/rigfleet/genesis/" not in compose
    again = deploy(rig, {**data, "stack": "tq3-mtp-genesis"})
    assert again.ran("archive --format=tar") == []
    assert again.ran("rm -rf /opt/rigfleet/genesis-trees") == []
    # Old trees: the newest few stay, and so does any tree a compose file mounts.
    old = {c * 40: 1600000000 + i for i, c in enumerate("1234")}
    rig.genesis_trees.update(old)
    snapshot = f"- /opt/rigfleet/genesis-trees/{'1' * 40}/vllm/_genesis:/x:ro\n"
    rig.files["/var/lib/rigfleet/active/compose.yaml"] = snapshot.encode()
    dry = deploy(rig, {**data, "stack": "tq3-mtp-genesis"}, execute=False)
    assert "Genesis | Genesis tree " + GENESIS_COMMIT[:12] + " (mounted by the stack)" in dry.plan
    run = deploy(rig, {**data, "stack": "tq3-mtp-genesis"})
    assert run.ran("rm -rf /opt/rigfleet/genesis-trees") == [
        f"rm -rf /opt/rigfleet/genesis-trees/{'2' * 40}"]
    assert set(rig.genesis_trees) == {GENESIS_COMMIT, "1" * 40, "3" * 40, "4" * 40}


def test_stale_genesis_trees_rule():
    trees = {"a": 1, "b": 2, "c": 3, "d": 4}
    assert stale(trees, "e", set(), TREES_KEPT) == ["a", "b"]
    assert stale(trees, "a", set(), TREES_KEPT) == ["b"]
    assert stale(trees, "d", {"a"}, TREES_KEPT) == []
    assert stale({"a": 1}, "a", set(), TREES_KEPT) == []


def test_genesis_version_read_once_per_digest(data):
    rig = converged("debian13", {**data, "stack": "tq3-mtp-genesis"})
    run = deploy(rig, {**data, "stack": "tq3-mtp-genesis"})
    assert run.ran("import vllm") == []
    assert rig.files["/var/lib/rigfleet/vllm-versions/" + "b" * 64] == (
        b"0.20.2rc1.dev9+g01d4d1ad3\n"
    )


# --- weights, genesis, secrets --------------------------------------------------------------


def test_weights_fetched_once_with_endpoint_and_no_token_in_argv(data, tmp_path):
    token = tmp_path / "hf-token"
    token.write_text("hf_secret_token_value\n")
    token.chmod(0o600)
    rig = FakeRig("debian13")
    run = deploy(rig, {**data, "hf_token_file": str(token)})
    [fetch] = run.ran("rigfleet-fetch-weights.py fetch")
    assert fetch.startswith("HF_ENDPOINT=http://hub.rigfleet.test:8080 ")
    assert "--token-file /etc/rigfleet/secrets/hf-token" in fetch
    assert "--revision " + "a" * 40 in fetch
    assert rig.files["/etc/rigfleet/secrets/hf-token"] == b"hf_secret_token_value\n"
    assert rig.modes["/etc/rigfleet/secrets/hf-token"] == "0600"
    assert not any("hf_secret_token_value" in c for c in rig.commands)
    again = deploy(rig, {**data, "hf_token_file": str(token)})
    assert again.ran("rigfleet-fetch-weights.py fetch") == []


LOCAL = "qwen3.6-27b-autoround-int4"
OLD_DIR = f"/srv/models/{LOCAL}"  # where weights lived before per-revision directories
REV_A_DIR = f"/srv/models/{LOCAL}@{'a' * 12}"
REV_E_DIR = f"/srv/models/{LOCAL}@{'e' * 12}"
ACTIVE = "/var/lib/rigfleet/active/compose.yaml"
STAGED = "/opt/rigfleet/stacks/int8/compose.yaml"


def mounts(rig: FakeRig, path: str) -> str:
    """The weights directory a compose file on the fake host mounts."""
    doc = yaml.safe_load(rig.files[path])
    return next(v.split(":")[0] for v in doc["services"]["vllm"]["volumes"]
                if v.endswith(f"/{LOCAL}:ro"))


def repin(data: dict, revision: str) -> None:
    Path(data["pins_file"]).write_text(pins_yaml().replace("a" * 40, revision))
    rigfleet.desired._PINS.clear()


def test_weights_go_to_the_revisions_own_directory_which_every_compose_file_mounts(data):
    rig = converged("debian13", data)
    [fetch] = [c for c in rig.commands if "rigfleet-fetch-weights.py fetch" in c]
    assert f"--local-dir {REV_A_DIR} " in fetch
    assert set(rig.weights) == {REV_A_DIR}
    for path in (STAGED, "/opt/rigfleet/stacks/tq3-mtp-genesis/compose.yaml", ACTIVE):
        assert mounts(rig, path) == REV_A_DIR
    again = deploy(rig, data)
    assert again.ran("rigfleet-fetch-weights.py fetch") == [] and again.ran("rm -rf --") == []


def test_a_new_revision_is_fetched_beside_the_old_one_which_a_rollback_still_mounts(data):
    rig = converged("debian13", data)
    repin(data, "e" * 40)
    rig.swap_failure = ("gate", "gate failed 1 check(s): needles")
    run = deploy(rig, data)
    assert run.failed  # the swap rolled back
    assert run.ran(f"--local-dir {REV_E_DIR} ") and set(rig.weights) == {REV_A_DIR, REV_E_DIR}
    assert mounts(rig, STAGED) == REV_E_DIR
    assert mounts(rig, ACTIVE) == REV_A_DIR  # what serves again, on its own files
    # Kept: the pinned revision, and the one the active snapshot (the rollback) names.
    assert deploy(rig, data).ran("rm -rf --") == []
    rig.swap_failure = None
    dry = deploy(rig, data, execute=False)  # --dry: what the promotion releases
    assert any("Prune weights only the replaced stack mounted" in op for op in dry.plan), dry.plan
    promoted = deploy(rig, data)
    assert not promoted.failed  # promoted: the snapshot now names the new revision
    assert mounts(rig, ACTIVE) == REV_E_DIR
    # The old revision goes in the same run, once the swap has replaced what mounted it.
    [rm] = promoted.ran("rm -rf --")
    assert rm == f"rm -rf -- {REV_A_DIR}"
    assert promoted.commands.index(rm) > promoted.commands.index(promoted.ran(" swap --plan ")[0])
    assert set(rig.weights) == {REV_E_DIR}
    assert deploy(rig, data).ran("rm -rf --") == []


def test_weights_of_a_model_no_staged_stack_serves_go_before_the_fetch(data):
    """A model the host served before (its revision, a partial download, its old-name link) goes
    once no staged stack serves it and no compose file mounts it; foreign names stay."""
    rig = converged("debian13", data)
    model_dir = REV_A_DIR.rsplit("/", 1)[0]
    old = f"{model_dir}/qwen3.5-27b-int4@{'9' * 12}"
    partial = f"{model_dir}/.qwen3.5-27b-int4@{'8' * 12}.partial"
    rig.weights.update({old: weights_manifest("Qwen/Qwen3.5-27B", "9" * 40), partial: {},
                        f"{model_dir}/qwen3.5-27b-int4": old.rsplit("/", 1)[1],
                        f"{model_dir}/notes@home": {}})
    repin(data, "e" * 40)
    run = deploy(rig, data)
    [rm, released] = run.ran("rm -rf --")
    assert rm == (f"rm -rf -- {model_dir}/.qwen3.5-27b-int4@{'8' * 12}.partial "
                  f"{model_dir}/qwen3.5-27b-int4 {old}")
    assert run.commands.index(rm) < run.commands.index(run.ran("fetch-weights.py fetch")[0])
    # Today's old revision stayed while the active snapshot mounted it: it goes after the swap.
    assert released == f"rm -rf -- {REV_A_DIR}"
    assert set(rig.weights) == {REV_E_DIR, f"{model_dir}/notes@home"}


def legacy_host(data: dict) -> FakeRig:
    """A host converged before per-revision directories: the weights in ``<model_dir>/
    <local_dir>``, every compose file (staged, the active snapshot) mounting that; its running
    container's config hash is the one those files carry."""
    rig = converged("debian13", data)
    rig.weights = {OLD_DIR: rig.weights.pop(REV_A_DIR)}
    for path, body in list(rig.files.items()):
        if path.endswith("compose.yaml"):
            rig.files[path] = body.replace(f"{REV_A_DIR}:".encode(), f"{OLD_DIR}:".encode())
    assert mounts(rig, ACTIVE) == OLD_DIR
    return rig


def test_the_old_directory_is_adopted_without_a_download_or_a_swap(data):
    rig = legacy_host(data)
    snapshot = rig.files[ACTIVE]
    plan = deploy(rig, data, execute=False).plan
    assert f"Model weights | Adopt {OLD_DIR} as its revision's directory (no download)" in plan
    assert not any(name.startswith(("Model weights | Fetch", "Swap | Serve")) for name in plan)
    run = deploy(rig, data)
    assert not run.failed
    [adopt] = run.ran("rigfleet-fetch-weights.py adopt")
    assert f"--revision {'a' * 40} --from {OLD_DIR} --to {REV_A_DIR} " in adopt
    assert run.ran("rigfleet-fetch-weights.py fetch") == []  # verified where it now is
    assert run.ran("systemd-run --unit rigfleet-swap") == []  # the move alone swaps nothing
    assert rig.weights[OLD_DIR] == f"{LOCAL}@{'a' * 12}"  # the snapshot's mount still resolves
    assert rig.files[ACTIVE] == snapshot and mounts(rig, STAGED) == REV_A_DIR
    # The link stays while a compose file names it, and goes once none does.
    again = deploy(rig, data)
    assert again.ran("rm -rf --") == [] and again.ran("fetch-weights.py adopt") == []
    rig.files[ACTIVE] = rig.files[STAGED]  # a later swap snapshots the new file
    assert deploy(rig, data).ran("rm -rf --") == [f"rm -rf -- {OLD_DIR}"]
    assert set(rig.weights) == {REV_A_DIR}


def test_old_directory_of_another_revision_is_adopted_as_that_revision(data):
    """Upgrading and repinning in one go: the old directory is adopted as the revision it
    holds (a rollback mounts it through the old name), the new revision fetched beside it."""
    rig = legacy_host(data)
    repin(data, "e" * 40)
    rig.swap_failure = ("gate", "gate failed 1 check(s): needles")
    run = deploy(rig, data)
    assert run.ran(f"--from {OLD_DIR} --to {REV_A_DIR} ") and run.ran(f"--local-dir {REV_E_DIR} ")
    assert set(rig.weights) == {OLD_DIR, REV_A_DIR, REV_E_DIR}
    assert mounts(rig, ACTIVE) == OLD_DIR and rig.weights[OLD_DIR] == f"{LOCAL}@{'a' * 12}"


def test_secrets_are_root_only_and_never_in_commands_or_plans(data):
    rig = FakeRig("debian13")
    run = deploy(rig, data)
    for path in (
        "/etc/rigfleet/secrets/vllm.env",
        "/etc/rigfleet/secrets/api-auth-header",
        "/etc/rigfleet/secrets/api-key",
        "/etc/nginx/rigfleet-keys.conf",
    ):
        assert rig.modes[path] == "0600", path
        assert API_KEY.encode() in rig.files[path]
    assert rig.files["/etc/rigfleet/secrets/vllm.env"] == f"VLLM_API_KEY={API_KEY}\n".encode()
    assert not any(API_KEY in c for c in rig.commands)
    assert not any(API_KEY in name for name in run.plan)
    keys = rig.files["/etc/nginx/rigfleet-keys.conf"].decode()
    assert f'"~^Bearer {API_KEY}$" 1;' in keys and "default 0;" in keys


def test_compose_files_rendered_for_both_stacks(data):
    rig = converged("debian13", data)
    for stack in ("int8", "tq3-mtp-genesis"):
        path = f"/opt/rigfleet/stacks/{stack}/compose.yaml"
        assert rig.modes[path] == "0644"
        assert f"name: rigfleet-{stack}" in rig.files[path].decode()


# --- preflight ------------------------------------------------------------------------------


def test_unsupported_os_is_refused_naming_host_and_allowed(data):
    rig = FakeRig("rocky9")
    run = deploy(rig, data)
    assert run.failed
    assert "@fake/rig: os: 'rocky 9.4' is not supported" in (run.refused or "")
    assert all(c.startswith("cat /etc/os-release") for c in rig.commands)


def test_bad_host_data_is_refused_before_any_command(data):
    rig = FakeRig("debian13")
    run = deploy(rig, {**data, "stack": "fp8"})
    assert run.failed and "@fake/rig: stack: 'fp8' is not a stack" in (run.refused or "")
    assert rig.commands == []


def test_unreadable_pins_are_refused(data, tmp_path):
    bad = tmp_path / "bad-pins.yaml"
    bad.write_text(pins_yaml(digest="sha256:nothex"))
    run = deploy(FakeRig("debian13"), {**data, "pins_file": str(bad)}, execute=False)
    assert re.search(r"@fake/rig: pins_file: .*bad-pins.yaml: stacks.int8.digest: "
                     r"'sha256:nothex'", run.refused or "")


def test_api_key_with_nginx_unsafe_characters_is_refused(data, tmp_path):
    key = tmp_path / "bad-key"
    key.write_text('abc"def;' + "x" * 20 + "\n")
    os.chmod(key, 0o600)
    run = deploy(FakeRig("debian13"), {**data, "api_key_file": str(key)}, execute=False)
    # Host data's check refuses it first, by the deploy's own rule (validate.TOKEN_CHARS).
    assert "api_key_file" in (run.refused or "")
    assert "holds characters outside the allowed set" in (run.refused or "")
    assert "abc" not in (run.refused or "")


def test_plan_of_a_bare_host_lists_changes(data):
    run = deploy(FakeRig("debian13"), data, execute=False)
    assert "Base | Install base packages" in run.plan
    assert "NVIDIA driver | Reboot to load the NVIDIA driver (only when needed)" in run.plan
    assert any(name.startswith("Swap | Serve int8/") for name in run.plan)


# --- fact commands in a real shell ----------------------------------------------------------


def _fact_cases(tmp: Path):
    from rigfleet import facts

    missing = str(tmp / "missing")
    return [
        (facts.OsRelease, {}),
        (facts.DpkgState, {}),
        (facts.AptKeyring, {"key_url": "file:///nonexistent.asc", "dest": missing}),
        (facts.TextFile, {"path": missing}),
        (facts.GpuQuery, {}),
        (facts.DockerDaemonJson, {}),
        (facts.DockerRuntimes, {}),
        (facts.WeightsManifest, {"local_dir": missing}),
        (facts.GenesisHead, {"path": missing}),
        (facts.VenvPackageVersion, {"venv": missing, "dist": "huggingface_hub"}),
        (facts.FileDigest, {"path": missing}),
    ]


def test_fact_commands_are_valid_sh_and_tolerate_absence(tmp_path):
    """Every fact command runs under /bin/sh, exits 0 when what it asks about is absent (a
    failing fact would fail the host), and parses to its 'absent' value."""
    import subprocess

    for cls, kwargs in _fact_cases(tmp_path):
        fact = cls()
        command = fact.command(**kwargs)
        run = subprocess.run(["sh", "-c", str(command)], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, (cls.__name__, run.stderr)
        lines = run.stdout.splitlines()
        value = fact.process(lines) if lines else fact.default()
        if cls.__name__ in ("OsRelease", "DpkgState"):
            assert value, cls.__name__
        elif cls.__name__ == "GpuQuery":
            assert not value.loaded
        elif cls.__name__ == "AptKeyring":
            assert value == "missing"
        elif cls.__name__ == "WeightsManifest":
            assert not value.intact and value.revision is None
        elif cls.__name__ == "GenesisHead":
            assert value.head is None and value.layout is None
        elif cls.__name__ in ("DockerDaemonJson", "DockerRuntimes"):
            pass  # this machine may run a Docker engine
        else:
            assert not value, (cls.__name__, value)


def test_weights_manifest_fact_matches_the_script_on_real_files(tmp_path):
    import subprocess

    from rigfleet import facts

    local = tmp_path / "model"
    local.mkdir()
    (local / "a.safetensors").write_bytes(b"x" * 10)
    st = (local / "a.safetensors").stat()
    (local / ".rigfleet-manifest.json").write_text(
        json.dumps(
            {
                "repo": "o/r",
                "revision": "a" * 40,
                "files": {"a.safetensors": {"size": 10, "sha256": "0" * 64, "mtime": st.st_mtime}},
            },
            indent=2,
        )
    )
    fact = facts.WeightsManifest()
    command = fact.command(local_dir=str(local))

    def read():
        out = subprocess.run(["sh", "-c", command], capture_output=True, text=True).stdout
        return fact.process(out.splitlines())

    assert read() == facts.WeightsState("o/r", "a" * 40, True, "matches manifest")
    os.utime(local / "a.safetensors", (st.st_atime, st.st_mtime + 5))
    assert not read().intact


@pytest.mark.parametrize("files", [{}, [], "x", {"a.safetensors": {"size": 10}},
                                   {"a.safetensors": {"size": 9, "mtime": 0}},
                                   {"b.safetensors": {"size": 10, "mtime": 0}},
                                   {"a.safetensors": {"size": 10, "mtime": "x"}}])
def test_the_weights_fact_and_the_host_probe_judge_a_manifest_alike(tmp_path, files):
    """The deploy's fact (one ``find`` listing) and ``rigfleet-host.pyz probe`` (its own stat)
    apply one rule: a manifest listing no files is not intact for either."""
    import subprocess

    from rigfleet import facts
    from rigfleet.hostside import probe

    (tmp_path / "a.safetensors").write_bytes(b"x" * 10)
    manifest = {"repo": "o/r", "revision": "a" * 40, "files": files}
    (tmp_path / ".rigfleet-manifest.json").write_text(json.dumps(manifest))
    fact = facts.WeightsManifest()
    out = subprocess.run(["sh", "-c", fact.command(local_dir=str(tmp_path))],
                         capture_output=True, text=True).stdout
    seen = fact.process(out.splitlines())
    probed = probe.manifest(tmp_path)
    assert (seen.intact, seen.reason) == (probed["intact"], probed["reason"])
    assert not seen.intact


def test_every_command_sent_is_valid_sh(data):
    """Quoting mistakes show up as syntax errors: check every command of a bare-host run (and
    a stack switch) with ``sh -n``, which parses without running."""
    import subprocess

    rig = FakeRig("debian12")
    deploy(rig, data)
    deploy(rig, {**data, "stack": "tq3-mtp-genesis"})
    for command in sorted(set(rig.commands)):
        run = subprocess.run(["sh", "-n", "-c", command], capture_output=True, text=True)
        assert run.returncode == 0, (command, run.stderr)


def test_pins_that_change_without_a_swap_are_recorded_by_the_host_tool(data, tmp_path):
    rig = converged("debian13", data)
    pins = tmp_path / "pins-2.yaml"
    pins.write_text(pins_yaml(serial=2))
    run = deploy(rig, {**data, "pins_file": str(pins)})
    assert run.ran("systemd-run") == []  # the serving stack's config did not change
    [record] = run.ran("rigfleet-host.pyz record --json ")
    assert '"pins_serial": 2' in record and "--config-hash " in record
    assert json.loads(rig.ledger[-1])["event"] == "pins"
    assert deploy(rig, {**data, "pins_file": str(pins)}).ran("rigfleet-host.pyz record") == []


# --- per-host preflight failure ---------------------------------------------------------------


def test_a_refused_host_does_not_stop_the_others(data, caplog):
    locked = converged("debian13", data)
    locked.lock = {"who": "bob@laptop", "why": "swap", "pid": 42, "alive": True,
                   "since": "2026-11-29T10:00:00+00:00", "deploy_id": "X"}
    before = dict(locked.files)
    bare = FakeRig("debian13")
    runs = deploy_many({"@fake/locked": (locked, data), "@fake/bare": (bare, data)})
    assert runs["@fake/locked"].failed and not runs["@fake/bare"].failed
    assert "locked by bob@laptop" in (runs["@fake/locked"].refused or "")
    assert runs["@fake/locked"].commands == [] and locked.files == before
    assert bare.containers and bare.reboots == 1  # the other host converged
    # The run ends listing the refused hosts and why.
    summary = caplog.text[caplog.text.index("1 host(s) failed preflight"):]
    assert "@fake/locked: locked by bob@laptop" in summary


@pytest.mark.parametrize("how", ["data", "env"])
def test_stop_on_preflight_stops_every_host_before_any_change(data, monkeypatch, how):
    locked = converged("debian13", data)
    locked.lock = {"who": "bob@laptop", "why": "swap", "pid": 42, "alive": True,
                   "since": "2026-11-29T10:00:00+00:00", "deploy_id": "X"}
    bare = FakeRig("debian13")
    flagged = dict(data)
    if how == "data":
        flagged["rigfleet_stop_on_preflight"] = 1  # what --data rigfleet_stop_on_preflight=1 gives
    else:
        monkeypatch.setenv("RIGFLEET_STOP_ON_PREFLIGHT", "1")
    with pytest.raises(PyinfraError, match=r"(?s)rigfleet refused the run:\n.*locked by "
                                           r"bob@laptop.*rigfleet_stop_on_preflight"):
        deploy_many({"@fake/locked": (locked, flagged), "@fake/bare": (bare, flagged)})
    assert not bare.packages and bare.reboots == 0


def test_the_online_pass_is_made_once_a_run_and_a_bad_reach_stops_the_run(data, monkeypatch):
    """Every GPU host called SOURCES() (keeping only the first Online): a bad RIGFLEET_REACH
    was parsed again per host and escaped the deploy as a ValueError (pyinfra: "An exception
    occurred in: deploy.py" and a traceback); now one Online a run, one message naming it."""
    made: list[Online] = []

    class Quiet(Online):
        def host(self, *_: object) -> None:  # no source asked
            return None

    monkeypatch.setattr(roles.preflight, "SOURCES", lambda: made.append(Quiet()) or made[-1])
    runs = deploy_many({"@fake/a": (FakeRig("debian13"), data),
                        "@fake/b": (FakeRig("debian13"), data)}, execute=False)
    assert len(made) == 1 and not any(r.refused for r in runs.values())
    monkeypatch.setattr(roles.preflight, "SOURCES", online_pass)
    monkeypatch.setenv("RIGFLEET_REACH", "http://hub.test=http://127.0.0.1:1 hub.test")
    with pytest.raises(PyinfraError, match=r"^rigfleet refused the run:\nRIGFLEET_REACH: "
                       r"'http://hub.test=http://127.0.0.1:1 hub.test': 'hub.test' is not "
                       r"FROM=TO; allowed: FROM=TO URL prefixes \(RIGFLEET_REACH: several, "
                       r"space-separated\), e.g. http://"):
        deploy_many({"@fake/a": (FakeRig("debian13"), data),
                     "@fake/b": (FakeRig("debian13"), data)}, execute=False)


def test_a_bare_host_says_which_checks_wait_for_the_driver(data, caplog):
    caplog.set_level("INFO", logger="pyinfra")
    run = deploy(FakeRig("debian13"), data, execute=False)
    assert run.refused is None
    line = next(r.getMessage() for r in caplog.records if "not loaded yet" in r.getMessage())
    assert "power caps against each card's range" in line
    assert "the GPU count (gpu_count 2)" in line


def test_pid1_must_be_systemd(data):
    rig = FakeRig("debian13")
    rig.pid1 = "bash"
    run = deploy(rig, data)
    assert run.failed and rig.packages == {}
    assert "@fake/rig: os: PID 1 is 'bash'" in (run.refused or "")
    assert "allowed: a host booted with systemd as init" in (run.refused or "")


# --- Secure Boot -------------------------------------------------------------------------------


def test_secure_boot_without_an_enrolled_key_stops_with_the_steps_and_never_reboots(
        data, caplog):
    rig = FakeRig("debian13")
    rig.secure_boot = True
    first = deploy(rig, data)
    # Packages went in (DKMS built and signed the module), then the reboot was refused with
    # the steps (the key did not exist while preparing: DKMS makes it on its first build).
    assert first.failed and first.refused is None and "nvidia-kernel-open-dkms" in rig.packages
    assert rig.reboots == 0 and first.ran("systemctl reboot") == []
    assert "Secure Boot is on and /var/lib/dkms/mok.pub" in caplog.text
    assert "sudo mokutil --import /var/lib/dkms/mok.pub" in caplog.text
    assert first.ran("nvidia-container-toolkit") == []  # stopped there
    # The next converge refuses the host in its preflight: still no reboot, nothing changes.
    second = deploy(rig, data)
    message = second.refused or ""
    assert second.failed and rig.reboots == 0 and second.commands == []
    assert "Secure Boot is on and /var/lib/dkms/mok.pub" in message
    assert "sudo mokutil --import /var/lib/dkms/mok.pub" in message
    assert "Enroll MOK, Continue, Yes, type the one-time password" in message
    # The import was run, but nobody confirmed at the console yet.
    rig.mok_pending = True
    pending = deploy(rig, data)
    assert "requested but not confirmed yet" in (pending.refused or "") and rig.reboots == 0
    # Enrolled: the next converge reboots once and serves.
    rig.mok_pending, rig.mok_enrolled = False, True
    third = deploy(rig, data)
    assert not third.failed and rig.reboots == 1 and rig.driver_loaded


def test_a_module_refused_this_boot_is_not_rebooted_for(data):
    """Someone rebooted by hand: the kernel refused the module; no key state to read (no
    certificate where DKMS keeps it), but the log says why."""
    rig = FakeRig("debian13")
    deploy(rig, data)  # Secure Boot off: converged
    rig.secure_boot = True
    del rig.files[rig.MOK_CERT]
    rig._reboot()
    assert rig.driver_loaded is None and rig.journal
    run = deploy(rig, data)
    assert run.failed and rig.reboots == 2 and run.commands == []  # no reboot of ours
    assert "the kernel refused a module this boot (this boot's log: kernel: Loading of module " \
           "with unavailable key is rejected)" in (run.refused or "")
    assert "sudo mokutil --import /var/lib/dkms/mok.pub" in (run.refused or "")


def test_secure_boot_on_ubuntu_is_no_obstacle(data):
    rig = FakeRig("ubuntu2404")
    rig.secure_boot = True  # Canonical signs the prebuilt modules
    assert not deploy(rig, data).failed and rig.reboots == 1


# --- a driver from NVIDIA's .run installer --------------------------------------------------


def test_a_run_installed_driver_is_refused_with_the_way_out(data):
    rig = FakeRig("debian13")
    rig.run_installer, rig.driver_loaded = True, "580.105.08"
    run = deploy(rig, data)
    message = run.refused or ""
    assert run.failed and rig.packages == {}
    assert "NVIDIA's .run installer put driver 580.105.08 on this host " \
           "(/usr/bin/nvidia-uninstall exists)" in message
    assert "sudo /usr/bin/nvidia-uninstall, then reboot" in message
    assert "adopt_foreign_driver: True" in message


def test_a_run_installed_driver_on_the_pinned_branch_can_be_adopted(data):
    rig = FakeRig("debian13")
    rig.run_installer, rig.driver_loaded = True, "580.105.08"
    run = deploy(rig, {**data, "adopt_foreign_driver": True})
    assert not run.failed, run.refused
    assert rig.reboots == 0
    assert not any(n.startswith("nvidia-driver") or "dkms" in n for n in rig.packages)
    assert "nvidia-container-toolkit" in rig.packages and rig.containers
    # Another branch is not adopted.
    rig.driver_loaded = "590.44.01"
    again = deploy(rig, {**data, "adopt_foreign_driver": True})
    assert "is not the pinned branch 580" in (again.refused or "")


# --- front: default site, TLS ---------------------------------------------------------------


def test_default_nginx_site_is_disabled_once(data):
    rig = FakeRig("debian13")
    run = deploy(rig, data)
    assert run.ran("rm -f /etc/nginx/sites-enabled/default") == [
        "rm -f /etc/nginx/sites-enabled/default"]
    assert "/etc/nginx/sites-enabled/default" not in rig.links
    again = deploy(rig, data)
    assert again.ran("rm -f /etc/nginx/sites-enabled/default") == []
    assert again.ran("systemctl reload nginx") == []


@pytest.fixture
def tls_files(tmp_path: Path) -> dict[str, Path]:
    """A self-signed certificate and its key, as `openssl req -x509` makes them."""
    import shutil
    import subprocess

    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed here")
    cert, key = tmp_path / "front.crt", tmp_path / "front.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30",
                    "-subj", "/CN=rig", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    key.chmod(0o600)
    return {"cert": cert, "key": key}


def test_front_serves_tls_with_the_inventory_certificate(data, tls_files):
    rig = FakeRig("debian13")
    tls = {"front_tls_cert_file": str(tls_files["cert"]),
           "front_tls_key_file": str(tls_files["key"])}
    run = deploy(rig, {**data, **tls})
    assert not run.failed
    conf = rig.files["/etc/nginx/conf.d/rigfleet-front.conf"].decode()
    assert "    listen 127.0.0.1:8000;\n    listen 8000 ssl;\n" in conf
    assert "ssl_certificate /etc/nginx/rigfleet-tls/front.crt;" in conf
    assert "ssl_certificate_key /etc/nginx/rigfleet-tls/front.key;" in conf
    key_text = tls_files["key"].read_bytes()
    assert rig.files["/etc/nginx/rigfleet-tls/front.key"] == key_text
    assert rig.modes["/etc/nginx/rigfleet-tls/front.key"] == "0600"
    assert rig.dirs.get("/etc/nginx/rigfleet-tls") == "0700"
    assert rig.files["/etc/nginx/rigfleet-tls/front.crt"] == tls_files["cert"].read_bytes()
    # The key never travels as an upload, nor in a command line.
    assert "/etc/nginx/rigfleet-tls/front.key" not in rig.uploads
    body = key_text.decode().splitlines()[1]
    assert not any(body in c for c in rig.commands)
    assert deploy(rig, {**data, **tls}, execute=False).plan == []
    # Without TLS the front is plain HTTP again.
    deploy(rig, data)
    assert "ssl" not in rig.files["/etc/nginx/conf.d/rigfleet-front.conf"].decode()


def test_secrets_go_through_stdin_never_an_upload(data):
    import base64

    rig = FakeRig("debian13")
    deploy(rig, data)
    secrets = ["/etc/rigfleet/secrets/vllm.env", "/etc/rigfleet/secrets/api-auth-header",
               "/etc/rigfleet/secrets/api-key", "/etc/nginx/rigfleet-keys.conf"]
    assert not set(secrets) & set(rig.uploads)
    decoded = [base64.b64decode(s) for s in rig.stdin_seen]
    assert f"VLLM_API_KEY={API_KEY}\n".encode() in decoded
    assert not any(API_KEY in s for s in rig.stdin_seen)  # encoded on the wire, too


# --- maintenance windows: the steps that disturb a serving host ------------------------------


def fleet(rigs: list[FakeRig], data: dict) -> dict[str, Run]:
    """One pyinfra run over several fake hosts (``@fake/rig0`` ... in this order)."""
    return deploy_many({f"@fake/rig{i}": (rig, data) for i, rig in enumerate(rigs)})


def older_docker(rig: FakeRig) -> None:
    """The host as an older rigfleet left it: no live-restore, no cgroupfs driver (#48)."""
    daemon = json.loads(rig.files["/etc/docker/daemon.json"])
    daemon.pop("live-restore")
    daemon.pop("exec-opts")
    rig.files["/etc/docker/daemon.json"] = json.dumps(daemon).encode()
    rig.live_restore, rig.exec_opts = False, []


def order(run: Run, *fragments: str) -> list[int]:
    """Where each fragment's first command is in the run (to assert the order of steps)."""
    return [next(i for i, c in enumerate(run.commands) if f in c) for f in fragments]


def test_a_converged_serving_host_opens_no_window_and_restarts_nothing(data):
    rig = converged("debian13", data)
    events = list(rig.events)
    run = deploy(rig, data)
    assert not run.failed
    for what in ("maintenance", "systemctl restart docker", "systemctl reload docker",
                 "daemon-reload", "systemctl reboot"):
        assert run.ran(what) == [], what
    assert rig.events == events and rig.lock is None
    assert deploy(rig, data, execute=False).plan == []


def test_a_bare_host_converges_without_a_window(data):
    rig = FakeRig("debian13")
    run = deploy(rig, data)
    assert not run.failed
    assert run.ran("maintenance") == []  # nothing served: nothing to protect
    # As a first converge always did: after daemon.json, after the nvidia runtime.
    assert len(run.ran("systemctl restart docker")) == 2 and rig.reboots == 1
    daemon = json.loads(rig.files["/etc/docker/daemon.json"])
    assert daemon["live-restore"] is True
    assert daemon["exec-opts"] == ["native.cgroupdriver=cgroupfs"]
    assert rig.live_restore and rig.exec_opts == ["native.cgroupdriver=cgroupfs"]


def test_a_docker_restart_on_a_serving_host_runs_in_its_window_and_ends_gated(data):
    rig = converged("debian13", data)
    route = rig.route
    older_docker(rig)
    dry = deploy(rig, data, execute=False)
    assert "Docker | Restart Docker (daemon.json changed keys it reads only at start)" in dry.plan
    assert any(n.startswith("Maintenance window | Close the maintenance window") for n in dry.plan)
    run = deploy(rig, data)
    assert not run.failed, run.commands[-3:]
    # The window opens before the restart; its close (recreate + gate) comes after.
    opened, restart, close = order(run, "maintenance open", "systemctl restart docker",
                                   "systemd-run --unit rigfleet-maint-")
    assert opened < restart < close
    assert "--step 'Docker restart (daemon.json: exec-opts)'" in run.commands[opened]
    # Its plan went up first, atomically (upload beside it, fsync, rename).
    plan_path = run.commands[opened].split("--plan ")[1].split()[0]
    assert plan_path.startswith("/var/lib/rigfleet/maintenance/plan-maint-")
    assert any(" && sync -- " in c and c.endswith(f"{plan_path} && sync -- "
                                                  "/var/lib/rigfleet/maintenance")
               for c in run.commands[:opened])
    plan = json.loads(rig.files[plan_path])
    assert plan["gate_profile"] == "full" and plan["id"].startswith("maint-")
    assert rig.events[-4:] == [f"window open {plan['id']}",
                               "step Docker restart (daemon.json: exec-opts)", "docker restart",
                               f"window close close-{plan['id'].removeprefix('maint-')}-1"]
    # Without live-restore the restart stopped the stack; the close brought it back, gated.
    assert rig.route == route and rig.containers["rigfleet-int8"][0] == "running"
    last = json.loads(rig.ledger[-1])
    assert (last["event"], last["result"], last["gate"]) == ("maintenance", "closed",
                                                             {"result": "pass"})
    assert rig.window["state"] == "closed" and rig.lock is None
    assert rig.live_restore and rig.exec_opts == ["native.cgroupdriver=cgroupfs"]
    # Converged now: the next run touches nothing.
    again = deploy(rig, data)
    assert again.ran("maintenance") == [] and again.ran("systemctl restart docker") == []


def test_a_change_docker_reloads_needs_no_window(data):
    rig = converged("debian13", data)
    run = deploy(rig, {**data, "docker_registry_mirror": "http://mirror.lan:5000"})
    assert not run.failed
    assert len(run.ran("systemctl reload docker")) == 1
    assert run.ran("systemctl restart docker") == [] and run.ran("maintenance") == []
    assert rig.containers["rigfleet-int8"][0] == "running"


def test_a_driver_change_installs_and_reboots_a_serving_host_inside_its_window(data):
    rig = converged("debian13", data)
    rig.packages["nvidia-driver-cuda"] = "590.44.01-1"
    rig.driver_loaded = "590.44.01"
    run = deploy(rig, data)
    assert not run.failed, run.commands[-3:]
    install_step, install, reboot_step, reboot, close = order(
        run, "--step 'NVIDIA driver 580 install'",
        "--allow-change-held-packages install nvidia-driver-cuda",
        "--step 'reboot to load the NVIDIA driver'", "systemctl reboot",
        "systemd-run --unit rigfleet-maint-")
    assert install_step < install < reboot_step < reboot < close
    # One window: the plan is shipped once, the reboot step extends the same window.
    assert len(run.ran(" && sync -- ")) == 1 and len(run.ran("maintenance open")) == 2
    assert "--reboot-grace-s 1200" in run.commands[reboot_step]
    # After the reboot the stack did not come back by itself (the window held the host);
    # the close recreated it through the gate.
    assert rig.events.index("reboot") < max(i for i, e in enumerate(rig.events)
                                            if e.startswith("window close"))
    assert rig.containers["rigfleet-int8"][0] == "running" and rig.route.startswith("int8/")
    assert rig.driver_loaded == "580.105.08"


def test_a_busy_package_manager_opens_no_window_and_keeps_the_host_serving(data):
    rig = converged("debian13", data)
    rig.packages["nvidia-driver-cuda"] = "590.44.01-1"
    rig.driver_loaded = "590.44.01"
    rig.pkg_busy = ("the package manager is busy: /var/lib/dpkg/lock-frontend is held by pid "
                    "4242 (/usr/bin/python3 /usr/bin/unattended-upgrade), still after 120 s")
    route = rig.route
    run = deploy(rig, data)
    # (The host tool's own words are tests/unit/test_pkg_ready.py's.)
    assert run.failed and rig.events[-1] == "window ready (packages)"
    assert run.ran("maintenance ready --packages") and run.ran("maintenance open") == []
    assert run.ran("apt-get") == [] and run.ran("systemctl reboot") == []
    assert rig.route == route and rig.containers["rigfleet-int8"][0] == "running"
    assert rig.window is None and rig.packages["nvidia-driver-cuda"] == "590.44.01-1"


def test_a_deploy_failing_inside_its_window_closes_it_at_once(data):
    rig = converged("debian13", data)
    rig.packages["nvidia-driver-cuda"] = "590.44.01-1"
    rig.driver_loaded = "590.44.01"
    rig.apt_failure = "E: Sub-process /usr/bin/dpkg returned an error code (1)"
    run = deploy(rig, data)
    assert run.failed and run.ran("systemctl reboot") == []
    # The window opened, the install failed in it, and the deploy closed it right there
    # (recreate + gate), naming the step that failed; nothing ran after it.
    [close] = run.ran("systemd-run --unit rigfleet-maint-")
    assert "--own --cause 'the deploy failed inside it at: NVIDIA driver | Install NVIDIA " \
        "driver 580" in close
    opened, failed_install = order(run, "--step 'NVIDIA driver 580 install'",
                                   "--allow-change-held-packages install nvidia-driver-cuda")
    assert opened < failed_install < run.commands.index(close) == len(run.commands) - 2
    assert rig.window["state"] == "closed" and rig.route.startswith("int8/")
    assert rig.containers["rigfleet-int8"][0] == "running"


def test_a_close_that_fails_the_gate_fails_the_host_with_the_reason(data):
    rig = converged("debian13", data)
    older_docker(rig)
    rig.close_failure = ("gate", "gate failed 1 check(s): needles")
    run = deploy(rig, data)
    assert run.failed
    message = " ".join(run.ran("printf '%s\\n' "))
    assert "after maintenance the host is not serving: maintenance failed (gate): gate " \
           "failed 1 check(s): needles" in message
    assert "The front answers 503" in message and "maintenance close" in message
    assert rig.route == "maintenance" and rig.window["state"] == "failed"
    assert run.ran("systemd-run --unit rigfleet-swap-") == []  # nothing after it ran
    # The next run closes the failed window again (recreate + gate) before anything else.
    rig.close_failure = None
    again = deploy(rig, data)
    assert not again.failed and len(again.ran("systemd-run --unit rigfleet-maint-")) == 1
    assert again.ran("systemctl restart docker") == []
    assert rig.route.startswith("int8/") and rig.window["state"] == "closed"


def test_a_plain_run_over_serving_hosts_disturbs_one_and_names_the_rolling_command(
        data, monkeypatch):
    rigs = [converged("debian13", data) for _ in range(3)]
    for rig in rigs:
        older_docker(rig)
    runs = fleet(rigs, data)
    first, *others = runs.values()
    assert not first.failed and len(first.ran("systemctl restart docker")) == 1
    assert first.rig.route.startswith("int8/")
    for run in others:
        assert run.failed
        assert run.ran("systemctl restart docker") == [] and run.ran("maintenance open") == []
        [refusal] = run.ran("printf '%s\\n' ")
        assert "this run already disturbs @fake/rig0 (at most 1 serving host(s) at a time; " \
               "RIGFLEET_MAINTENANCE_BATCH=1)" in refusal
        assert "rigfleet roll --inventory" in refusal and "Nothing was disturbed" in refusal
        assert run.rig.containers["rigfleet-int8"][0] == "running"  # untouched, serving
    # A batch of two: the first two in inventory order go ahead, the third is refused.
    monkeypatch.setenv("RIGFLEET_MAINTENANCE_BATCH", "2")
    runs = fleet(rigs[1:] + [FakeRig("debian13")], data)
    a, b, bare = runs.values()
    assert not a.failed and not b.failed and not bare.failed
    assert bare.ran("maintenance") == []  # a bare host never counts


def test_three_serving_hosts_refuse_in_inventory_order(data, monkeypatch):
    rigs = [converged("debian13", data) for _ in range(3)]
    for rig in rigs:
        older_docker(rig)
    monkeypatch.setenv("RIGFLEET_MAINTENANCE_BATCH", "2")
    runs = fleet(rigs, data)
    assert [r.failed for r in runs.values()] == [False, False, True]
    monkeypatch.setenv("RIGFLEET_MAINTENANCE_BATCH", "0")
    with pytest.raises(Exception, match="RIGFLEET_MAINTENANCE_BATCH: '0' is not a number"):
        roles_maintenance.batch_limit()


def test_an_older_host_tool_is_replaced_by_a_rename_before_its_window_opens(data):
    import subprocess

    rig = converged("debian13", data)
    older_docker(rig)
    pyz = "/usr/local/lib/rigfleet/rigfleet-host.pyz"
    rig.files[pyz] = b"an older rigfleet-host.pyz"
    run = deploy(rig, data)
    assert not run.failed
    upload, restart, opened = order(run, f"mv -f -- {pyz}.upload.tmp {pyz}",
                                    "systemctl try-restart rigfleet-supervise.service",
                                    "maintenance open")
    assert upload < restart < opened and rig.modes[pyz] == "0755"
    assert rig.files[pyz] != b"an older rigfleet-host.pyz"
    for command in sorted(set(run.commands)):
        checked = subprocess.run(["sh", "-n", "-c", command], capture_output=True, text=True)
        assert checked.returncode == 0, (command, checked.stderr)


def test_a_stack_the_pinned_vllm_refuses_stops_the_host_before_its_file_or_a_swap(data, caplog):
    """rigfleet.vllmargs at staging: asked only for a compose file that would change; a refusal
    fails the host before the file is written or any window opens; int8 keeps serving."""
    rig = converged("debian13", data)
    compose = "/opt/rigfleet/stacks/int8/compose.yaml"
    before, serving, swaps = rig.files[compose], dict(rig.containers), len(rig.swaps)
    again = deploy(rig, data)
    assert again.ran("docker run --rm --pull never") == []  # nothing staged changes: no check
    rig.vllm_args_error = "vllm serve: error: unrecognized arguments: --x"
    changed = {**data, "extra_env": {"int8": {"VLLM_LOGGING_LEVEL": "DEBUG"}}}
    run = deploy(rig, changed)
    assert run.failed and len(run.ran("docker run --rm --pull never")) == 1
    assert "int8.yaml: vllm.args: unrecognized arguments: --x (refused by the parser of " \
           "vLLM 0.27.1" in caplog.text
    assert run.ran("systemd-run") == [] and run.ran("maintenance open") == []
    assert rig.files[compose] == before and rig.containers == serving and len(rig.swaps) == swaps


def test_a_peer_fetches_a_model_only_after_its_seed_whatever_else_each_serves(
        data, tmp_path, monkeypatch):
    """Peers, several models: the seed stages one more stack, whose model sorts before the
    shared one and whose image before the other stacks' images; the peer still takes the shared
    model and image from the seed only after the seed has them."""
    import roles.peers
    from rigfleet.catalog import BUILTIN_DIR

    stacks = tmp_path / "stacks"
    stacks.mkdir()
    doc = yaml.safe_load((BUILTIN_DIR / "int8.yaml").read_text())
    doc.update(name="int8-first", port=8027, served_model_name="first", model="Aaa/First-Model")
    (stacks / "int8-first.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    pins = yaml.safe_load(pins_yaml())
    other = "sha256:" + "c" * 64
    pins["stacks"]["int8-first"] = {**pins["stacks"]["int8"], "image": "vllm/vllm-openai:v0.27.2",
                                    "digest": other, "vllm_version": "0.27.2"}
    hub = {d: (image_id_of(d), 9 * 1024**3) for d in (DIGEST, other)}
    monkeypatch.setattr(rigfleet.images.deploy, "SourceChecker",
                        lambda: SourceChecker(lambda url: FakeHub(url, hub)))
    pins["models"] = {"Aaa/First-Model": {"revision": "f" * 40, "local_dir": "first-model"}}
    (tmp_path / "pins-first.yaml").write_text(yaml.safe_dump(pins, sort_keys=False))
    seed_data = {**data, "stacks_dir": str(stacks), "pins_file": str(tmp_path / "pins-first.yaml")}
    peer_data = {**seed_data, "stacks": ["int8", "tq3-mtp-genesis"]}
    monkeypatch.setattr(roles.peers, "REMOTE",
                        lambda: SimpleNamespace(run=lambda *a, **k: (0, "")))
    seed, peer = FakeRig("debian13"), FakeRig("debian13")
    names = {id(seed): "seed", id(peer): "peer"}
    timeline: list[tuple[str, str]] = []
    respond = FakeRig.respond

    def logged(rig, text, stdin=None):
        timeline.append((names[id(rig)], text))
        return respond(rig, text, stdin)

    monkeypatch.setattr(FakeRig, "respond", logged)

    def as_the_cli_orders() -> None:
        """Operations ordered as ``pyinfra`` on the command line orders them (call-site lines,
        then loop positions), not by each host's operation count as the API does."""
        from pyinfra.api.state import StateStage
        from pyinfra.context import ctx_state

        with monkeypatch.context() as cli:
            cli.setattr(pyinfra, "is_cli", True)
            cli.setattr(ctx_state.get(), "current_stage", StateStage.Prepare)
            deploy_py()

    runs = deploy_many({"@fake/seed": (seed, seed_data), "@fake/peer": (peer, peer_data)},
                       fn=as_the_cli_orders)
    assert not runs["@fake/seed"].failed and not runs["@fake/peer"].failed
    shared = "--repo Lorbus/Qwen3.6-27B-int4-AutoRound "
    fetches = [(who, "--mirror" in c) for who, c in timeline
               if "fetch-weights.py fetch" in c and shared in c]
    assert fetches == [("seed", False), ("peer", True)], fetches
    nightly = "vllm/vllm-openai:nightly-"
    pulls = [(who, "peer" in c) for who, c in timeline
             if nightly in c and ("docker pull" in c or "docker load" in c)]
    assert pulls == [("seed", False), ("peer", True)], pulls
