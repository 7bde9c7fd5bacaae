"""The host-fact checks the preflight makes while preparing (pure decisions), the platform
fact as real tools print it, and the kernel packages the driver role picks."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from rigfleet.facts import DebPackage, GpuState, ModuleRejections, Platform, PlatformState
from rigfleet.hostdata import validate_host
from rigfleet.packages import OsInfo
from roles.nvidia_driver import debian_kernel_flavour, kernel_packages
from roles.preflight import check_facts, secure_boot_block

DEBIAN = OsInfo("debian", "12", "bookworm", "6.1.0-40-amd64")
UBUNTU = OsInfo("ubuntu", "24.04", "noble", "6.8.0-88-generic")
SYSTEMD = PlatformState(pid1="systemd", systemd=True, arch="amd64", secure_boot="disabled")


@dataclass(frozen=True)
class Card:
    index: int
    power_min_limit_w: float = 100.0
    power_max_limit_w: float = 350.0
    memory_total_mib: int = 24576
    name: str = "NVIDIA GeForce RTX 3090"


def loaded(*cards: Card, version: str = "580.105.08") -> GpuState:
    return GpuState(loaded=True, driver_version=version, gpus=cards)


NOT_LOADED = GpuState(loaded=False, error="NVIDIA-SMI has failed")


@pytest.fixture
def settings(tmp_path):
    key = tmp_path / "api-key"
    key.write_text("k" * 40)
    key.chmod(0o600)
    repo = {"url": "http://apt/x", "key_url": "http://apt/k.asc", "suite": "/", "components": []}
    return validate_host("rig-a", {
        "stack": "int8", "power_caps_w": [250, 260], "model_dir": "/srv/models",
        "front_port": 8000, "api_key_file": str(key),
        "apt_repos": {"cuda": repo, "nvidia-container-toolkit": repo}})


def facts(settings, platform=SYSTEMD, gpu=NOT_LOADED, os=DEBIAN, rejections=(), **change):
    s = settings if not change else type(settings)(**{**settings.__dict__, **change})
    return check_facts("rig-a", s, s.spec, os, "580", None, platform, gpu, list(rejections))


def test_a_healthy_loaded_host_passes(settings) -> None:
    result = facts(settings, gpu=loaded(Card(0), Card(1)))
    assert result.problems == [] and result.waiting == [] and not result.adopt


def test_a_bare_host_lists_what_waits_for_the_driver(settings) -> None:
    result = facts(settings)
    assert result.problems == []
    assert result.waiting == ["power caps against each card's range",
                              "the GPU count (gpu_count 2)",
                              "each card's memory (>= 24576 MiB for stack int8)"]


def test_card_memory_is_checked_once_the_driver_answers(settings) -> None:
    [problem] = facts(settings, gpu=loaded(Card(0), Card(1, memory_total_mib=20480))).problems
    assert problem.startswith("rig-a: stack: 'int8' needs 24576 MiB per card (gpus.memory_mib in ")
    assert "but card 1 (NVIDIA GeForce RTX 3090) has 20480 MiB" in problem


def test_caps_count_and_range_need_the_driver(settings) -> None:
    result = facts(settings, gpu=loaded(Card(0, power_max_limit_w=255.0)))
    assert "rig-a: power_caps_w: [250, 260] has 2 cap(s) but the host has 1 GPU(s)" in \
        result.problems[0]
    assert result.problems[1].startswith("rig-a: gpu_count: 2 but nvidia-smi lists 1 GPU(s)")


@pytest.mark.parametrize(("platform", "pid1"), [
    (PlatformState(pid1="bash", systemd=False), "'bash'"),
    (PlatformState(pid1="tini", systemd=True), "'tini'"),
    (PlatformState(), "'unknown'"),
])
def test_systemd_must_be_pid_1(settings, platform, pid1) -> None:
    [problem] = facts(settings, platform=platform).problems
    assert problem.startswith(f"rig-a: os: PID 1 is {pid1}")


def test_a_run_installed_driver_is_refused_unless_adopted_on_the_pinned_branch(settings) -> None:
    run = PlatformState(pid1="systemd", systemd=True, run_uninstaller=True,
                        smi="/usr/bin/nvidia-smi")
    [problem] = facts(settings, platform=run, gpu=loaded(Card(0), Card(1))).problems
    assert "NVIDIA's .run installer put driver 580.105.08 on this host" in problem
    adopted = facts(settings, platform=run, gpu=loaded(Card(0), Card(1)),
                    adopt_foreign_driver=True)
    assert adopted.problems == [] and adopted.adopt
    other = facts(settings, platform=run, gpu=loaded(Card(0), Card(1), version="550.163.01"),
                  adopt_foreign_driver=True)
    assert "adopt_foreign_driver: True, but the .run-installed driver 550.163.01 is not the " \
           "pinned branch 580" in other.problems[0]
    # nvidia-smi that no package owns, and no .run uninstaller (seen on a real GPU host with
    # its driver at /usr/local/nvidia): refused without blaming the .run installer or offering
    # its uninstaller.
    unowned = PlatformState(pid1="systemd", systemd=True, smi="/usr/local/nvidia/bin/nvidia-smi")
    [problem] = facts(settings, platform=unowned, gpu=loaded(Card(0), Card(1))).problems
    assert "driver 580.105.08 on this host came from no package (no dpkg package owns " \
           "/usr/local/nvidia/bin/nvidia-smi)" in problem
    assert ".run" not in problem and "nvidia-uninstall" not in problem
    assert "remove it (the way it was installed, then reboot)" in problem


SB_ON = PlatformState(pid1="systemd", systemd=True, secure_boot="enabled",
                      mok_cert="/var/lib/dkms/mok.pub", mok="not-enrolled")


def test_secure_boot_with_dkms_key_not_enrolled(settings) -> None:
    [problem] = facts(settings, platform=SB_ON).problems
    assert "Secure Boot is on and /var/lib/dkms/mok.pub" in problem
    assert "1. on the host: sudo mokutil --import /var/lib/dkms/mok.pub" in problem
    # Loaded (enrolled after all), Ubuntu (signed modules), or enrolled: no problem.
    assert facts(settings, platform=SB_ON, gpu=loaded(Card(0), Card(1))).problems == []
    assert facts(settings, platform=SB_ON, os=UBUNTU).problems == []
    enrolled = PlatformState(**{**SB_ON.__dict__, "mok": "enrolled"})
    assert facts(settings, platform=enrolled).problems == []


def test_secure_boot_block_decisions() -> None:
    pending = PlatformState(**{**SB_ON.__dict__, "mok": "pending"})
    assert "requested but not confirmed yet" in secure_boot_block("h", DEBIAN, pending, [])
    no_key = PlatformState(**{**SB_ON.__dict__, "mok": "unknown", "mok_cert": ""})
    assert secure_boot_block("h", DEBIAN, no_key, []) is None  # a reboot may help
    refused = secure_boot_block("h", DEBIAN, no_key, ["kernel: Loading of unsigned module is "
                                                      "rejected"])
    assert refused and "this boot's log: kernel: Loading of unsigned module is rejected" in refused
    off = PlatformState(**{**SB_ON.__dict__, "secure_boot": "disabled"})
    assert secure_boot_block("h", DEBIAN, off, ["Key was rejected by service"]) is None


# --- the platform fact, from what the tools print --------------------------------------------


@pytest.mark.parametrize(("lines", "sb", "mok"), [
    (["sb=SecureBoot enabled", "mok_cert=/var/lib/dkms/mok.pub",
      "mok=/var/lib/dkms/mok.pub is not enrolled"], "enabled", "not-enrolled"),
    (["sb=SecureBoot enabled", "sb=SecureBoot validation is disabled in shim",
      "mok_cert=/var/lib/dkms/mok.pub", "mok=/var/lib/dkms/mok.pub is already enrolled"],
     "enabled", "enrolled"),
    (["sb=SecureBoot disabled", "sb=Platform is in Setup Mode", "mok_cert=/var/lib/dkms/mok.pub",
      "mok=/var/lib/dkms/mok.pub is already in the enrollment request"], "disabled", "pending"),
    (["sb=EFI variables are not supported on this system"], "unsupported", "unknown"),
    (["sb=This system doesn't support Secure Boot"], "unsupported", "unknown"),
    (["mokutil=missing"], "unknown", "unknown"),
])
def test_platform_reads_mokutil(lines, sb, mok) -> None:
    state = Platform().process(["pid1=systemd", "systemd=yes", "arch=amd64", *lines])
    assert (state.secure_boot, state.mok) == (sb, mok)
    assert state.systemd and state.pid1 == "systemd" and state.arch == "amd64"


def test_platform_knows_where_the_driver_came_from() -> None:
    assert not Platform().process(["smi=/usr/bin/nvidia-smi",
                                   "smi_owner=nvidia-utils-580-server"]).foreign_driver
    assert Platform().process(["smi=/usr/bin/nvidia-smi", "smi_owner="]).foreign_driver
    assert Platform().process(["run_uninstaller=yes"]).foreign_driver
    assert not Platform().process([]).foreign_driver


def test_platform_and_rejection_commands_run_in_sh_and_tolerate_absence() -> None:
    for fact in (Platform(), ModuleRejections()):
        run = subprocess.run(["sh", "-c", fact.command()], capture_output=True, text=True,
                             timeout=60)
        assert run.returncode == 0, run.stderr
        fact.process(run.stdout.splitlines())  # parses whatever this machine has
    out = subprocess.run(["sh", "-c", Platform().command()], capture_output=True,
                         text=True).stdout
    assert out.startswith("pid1=") and "\nsystemd=" in out and "\narch=" in out


@pytest.mark.parametrize(("pid1_after_s", "since"), [(3, ""), (7200, "1796150000")])
def test_this_boot_of_a_container_host_starts_with_its_pid_1(tmp_path, pid1_after_s, since):
    # A machine: PID 1 starts seconds after the kernel, `journalctl -b` is this boot. A
    # container host restarted two hours after the kernel booted: its boot starts then.
    from rigfleet.commands.nvidia import SYSTEM_START

    hz = int(subprocess.run(["getconf", "CLK_TCK"], capture_output=True, text=True).stdout)
    (tmp_path / "stat").write_text("cpu  1 2 3\nbtime 1796142800\nprocesses 9\n")
    fields = ["1", "(systemd)", "S"] + ["0"] * 18 + [str(pid1_after_s * hz), "0"]
    (tmp_path / "pid1").write_text(" ".join(fields) + "\n")
    cmd = SYSTEM_START.replace("/proc/stat", str(tmp_path / "stat")).replace(
        "/proc/1/stat", str(tmp_path / "pid1"))
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=30)
    assert (out.returncode, out.stdout) == (0, since), out.stderr
    assert "${since:+--since @$since}" in ModuleRejections().command()

# --- kernel packages ---------------------------------------------------------------------------


@pytest.mark.parametrize(("kernel", "flavour"), [
    ("6.1.0-40-amd64", "amd64"),
    ("6.12.48+deb13-amd64", "amd64"),
    ("6.12.48+deb13-cloud-amd64", "cloud-amd64"),
    ("6.12.12+bpo-rt-amd64", "rt-amd64"),
    ("6.1.0-40-arm64", "arm64"),
])
def test_debian_kernel_flavour(kernel: str, flavour: str) -> None:
    assert debian_kernel_flavour(kernel) == flavour


def test_debian_kernel_packages() -> None:
    dpkg = {"linux-image-6.1.0-40-amd64": DebPackage("6.1.158-1", True, False)}
    assert kernel_packages(DEBIAN, "580", dpkg, "amd64") == (
        "linux-headers-6.1.0-40-amd64", "linux-headers-amd64", "mokutil")
    # A kernel that is no Debian package (a container's): nothing to build against.
    assert kernel_packages(DEBIAN, "580", {}, "amd64") == ("mokutil",)


def test_ubuntu_kernel_packages_follow_the_flavour_and_the_running_kernel() -> None:
    dpkg = {"linux-image-generic-hwe-24.04": DebPackage("6.11.0.29", True, False),
            "linux-image-6.8.0-88-generic": DebPackage("6.8.0-88.89", True, False)}
    assert kernel_packages(UBUNTU, "580", dpkg) == (
        "linux-modules-nvidia-580-server-open-generic-hwe-24.04",
        "linux-modules-nvidia-580-server-open-6.8.0-88-generic")
    assert kernel_packages(SimpleNamespace(id="ubuntu", kernel=""), "580", {}) == (
        "linux-modules-nvidia-580-server-open-generic",)
