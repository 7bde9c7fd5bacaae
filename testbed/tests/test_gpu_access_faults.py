"""GPU access through device nodes and the device cgroup, and its loss at daemon-reload (#48).

The kernel parts are stood in by directories: a fake ``/proc`` (pid, cgroup, cmdline, stat), a
fake cgroup tree (``devices.allow``/``devices.deny`` files) and a fake ``/dev``; device opens
are answered by a patched ``os.open`` with the errno the kernel gives (EPERM denied, ENXIO
allowed with no driver behind the node).
"""

from __future__ import annotations

import errno
import importlib
import io
import json
import os
import time
from pathlib import Path

import pytest
from rigfleet_testbed.nvidia import ctk, devnodes, reload_generator, runtime_hook, smi
from rigfleet_testbed.nvidia import simstate as sim

VERSION = "580.105.08"


def fake_open(monkeypatch: pytest.MonkeyPatch, denied: set[str]) -> None:
    """Opens of device nodes: EPERM for the names in ``denied``, ENXIO (no driver) otherwise."""
    real = os.open

    def _open(path, flags, *args, **kw):
        p = Path(path)
        if p.name.startswith("nvidia") and p.parent.name == "dev":
            if not p.exists():
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(p))
            code = errno.EPERM if p.name in denied else errno.ENXIO
            raise OSError(code, os.strerror(code), str(p))
        return real(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", _open)


def _hw(cgroup: int = 2) -> sim.Hardware:
    gpus = tuple(sim.Gpu(index=i, name="NVIDIA GeForce RTX 3090", uuid=f"GPU-{i}",
                         pci_bus_id=f"00000000:{1 + i * 32:02X}:00.0", memory_total_mib=24576,
                         power_default_w=350, power_min_w=100, power_max_w=350,
                         vbios="94.02.42.40.2A", compute_cap="8.6") for i in range(2))
    return sim.Hardware(gpus=gpus, cgroup_version=cgroup)


# --- the "module" makes nodes like nvidia-modprobe ----------------------------------------------


def test_module_load_creates_nodes_and_dev_char_links(paths: sim.SimPaths) -> None:
    assert paths.dev == paths.root / "dev"  # a moved root never touches the real /dev
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    nodes = {p.name: os.stat(p).st_rdev for p in paths.dev.glob("nvidia*")}
    assert {n: (os.major(r), os.minor(r)) for n, r in nodes.items()} == {
        "nvidiactl": (195, 255), "nvidia-uvm": (509, 0), "nvidia-uvm-tools": (509, 1),
        "nvidia0": (195, 0), "nvidia1": (195, 1)}
    assert oct(os.stat(paths.dev / "nvidia0").st_mode & 0o777) == "0o666"
    assert os.readlink(paths.dev / "char/195:255") == "../nvidiactl"
    assert os.readlink(paths.dev / "char/509:1") == "../nvidia-uvm-tools"


def test_access_reports_the_kernels_answer(tmp_path: Path, monkeypatch) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    assert devnodes.access(dev) == "absent"
    (dev / "nvidiactl").write_text("")  # exists: the patched open decides
    fake_open(monkeypatch, denied=set())
    assert devnodes.access(dev) == "ok"  # ENXIO: allowed, no driver behind it
    fake_open(monkeypatch, denied={"nvidiactl"})
    assert devnodes.access(dev) == "denied"


# --- who manages the container's cgroup -----------------------------------------------------------


def fake_dockerd(tmp_path: Path, cmdline: list[str], config: dict | None,
                 config_after_start: float | None = None, pid: int = 4242,
                 ) -> tuple[Path, list[str]]:
    """A /proc with one dockerd that started 500.37 s after boot, 1000.5 s ago; its config
    file written ``config_after_start`` seconds after it started (default: 400 s before)."""
    proc = tmp_path / "proc"
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "cmdline").write_bytes("\0".join(cmdline).encode() + b"\0")
    tck = os.sysconf("SC_CLK_TCK")
    start_ticks = 50037 * tck // 100  # started 500.37 s after boot
    fields = ["S"] + ["0"] * 18 + [str(start_ticks)] + ["0"] * 10
    (proc / str(pid) / "stat").write_text(f"{pid} (dockerd) {' '.join(fields)}\n")
    now = time.time()
    boot = int(now) - 1501 + 0.87  # not a whole second: btime says int(boot), 0.87 s early
    (proc / "uptime").write_text(f"{now - boot:.2f} 1234.56\n")
    (proc / "stat").write_text(f"cpu 0 0 0 0\nbtime {int(boot)}\n")
    pid_file = tmp_path / "docker.pid"
    pid_file.write_text(f"{pid}\n")
    cfg = tmp_path / "daemon.json"
    if config is not None:
        cfg.write_text(json.dumps(config))
        when = boot + start_ticks / tck + (-400 if config_after_start is None
                                           else config_after_start)
        os.utime(cfg, (when, when))
    return proc, [str(pid_file)]


def test_cgroup_driver_from_daemon_json_flags_and_start_time(tmp_path: Path) -> None:
    cfg = str(tmp_path / "daemon.json")
    cmd = ["/usr/bin/dockerd", "-H", "fd://", f"--config-file={cfg}"]
    proc, pids = fake_dockerd(tmp_path, cmd, {"exec-opts": ["native.cgroupdriver=cgroupfs"]})
    assert devnodes.dockerd_cgroup_driver(proc, pids) == "cgroupfs"
    # Written after dockerd started: exec-opts are read only at start, not in effect yet.
    proc, pids = fake_dockerd(tmp_path, cmd, {"exec-opts": ["native.cgroupdriver=cgroupfs"]},
                              config_after_start=0.3)
    assert devnodes.dockerd_cgroup_driver(proc, pids) is None
    proc, pids = fake_dockerd(tmp_path, cmd + ["--exec-opt", "native.cgroupdriver=systemd"],
                              {"exec-opts": []})
    assert devnodes.dockerd_cgroup_driver(proc, pids) == "systemd"
    proc, pids = fake_dockerd(tmp_path, cmd, {"registry-mirrors": []})
    assert devnodes.dockerd_cgroup_driver(proc, pids) is None
    assert devnodes.dockerd_cgroup_driver(proc, [str(tmp_path / "missing.pid")]) is None


def test_a_config_written_in_the_second_dockerd_started_is_in_effect(tmp_path: Path) -> None:
    """pmaint's finding: with btime (whole seconds) dockerd seemed to start up to a second
    early, so a daemon.json written 50 ms before the restart looked newer than dockerd."""
    cfg = str(tmp_path / "daemon.json")
    cmd = ["/usr/bin/dockerd", f"--config-file={cfg}"]
    proc, pids = fake_dockerd(tmp_path, cmd, {"exec-opts": ["native.cgroupdriver=cgroupfs"]},
                              config_after_start=-0.05)
    assert devnodes.dockerd_cgroup_driver(proc, pids) == "cgroupfs"


def test_dockerd_keeps_the_exec_opts_it_started_with(tmp_path: Path) -> None:
    """The first look records what dockerd read; a file changed afterwards (a reload, the
    toolkit's runtime configure, a person) does not change the running dockerd's driver."""
    cfg = tmp_path / "daemon.json"
    cmd = ["/usr/bin/dockerd", f"--config-file={cfg}"]
    proc, pids = fake_dockerd(tmp_path, cmd, {"exec-opts": ["native.cgroupdriver=cgroupfs"]})
    snapshots = tmp_path / "run" / "dockerd"
    (tmp_path / "run").mkdir()
    assert devnodes.dockerd_cgroup_driver(proc, pids, snapshots) == "cgroupfs"
    record = json.loads(next(snapshots.glob("4242-*.json")).read_text())
    assert record["exec-opts"] == ["native.cgroupdriver=cgroupfs"]
    cfg.write_text(json.dumps({"exec-opts": []}))  # now, long after dockerd started
    assert devnodes.dockerd_cgroup_driver(proc, pids) is None  # no record: not in effect
    assert devnodes.dockerd_cgroup_driver(proc, pids, snapshots) == "cgroupfs"
    # Another dockerd (a restart: another pid or start time) reads the file anew.
    proc, pids = fake_dockerd(tmp_path, cmd, {"exec-opts": []}, pid=4343)
    assert devnodes.dockerd_cgroup_driver(proc, pids, snapshots) is None


def test_ctk_runtime_configure_records_the_running_dockerds_config_first(
        paths: sim.SimPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "daemon.json"
    proc, pids = fake_dockerd(tmp_path, ["/usr/bin/dockerd", f"--config-file={cfg}"],
                              {"exec-opts": ["native.cgroupdriver=cgroupfs"]})
    real = devnodes.dockerd_cgroup_driver
    monkeypatch.setattr(devnodes, "dockerd_cgroup_driver",
                        lambda *a, snapshots=None, **k: real(proc, pids, snapshots))
    assert ctk.main(["runtime", "configure", "--runtime=docker", f"--config={cfg}"],
                    out=io.StringIO(), err=io.StringIO()) == 0
    assert "nvidia" in json.loads(cfg.read_text())["runtimes"]  # written after dockerd started
    assert devnodes.dockerd_cgroup_driver(snapshots=paths.dockerd) == "cgroupfs"


def test_systemd_manages_by_default_on_cgroup_v2_only() -> None:
    assert devnodes.systemd_managed(_hw(2), None) is True  # Docker's default on cgroup v2
    assert devnodes.systemd_managed(_hw(1), None) is False  # cgroupfs on v1
    assert devnodes.systemd_managed(_hw(2), "cgroupfs") is False  # NVIDIA's first workaround
    assert devnodes.systemd_managed(_hw(1), "systemd") is True


def test_spec_rules_and_runc_dev_char_rule(tmp_path: Path) -> None:
    config = {"linux": {"resources": {"devices": [
        {"allow": False, "access": "rwm"},
        {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"},
        {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rwm"},
        {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rwm"},
        {"allow": True, "type": "c", "major": -1, "minor": -1, "access": "m"},
        {"allow": True, "type": "b", "major": 8, "minor": 0, "access": "rw"},
    ]}}}
    assert devnodes.spec_rules(config) == ["c 1:3 rw", "c 195:0 rw"]
    dev = tmp_path / "dev"
    (dev / "char").mkdir(parents=True)
    (dev / "null").touch()
    (dev / "char" / "1:3").symlink_to("../null")  # runc stats it: the link must lead somewhere
    assert devnodes.spec_rules(config, dev, tmp_path / "sys", skip_missing=True) == ["c 1:3 rw"]
    assert devnodes.skips_missing_char_paths((1, 1, 5))  # Debian 12's runc
    assert not devnodes.skips_missing_char_paths((1, 1, 15))  # Debian 13's
    assert not devnodes.skips_missing_char_paths((1, 1, 2)) and \
        not devnodes.skips_missing_char_paths(None)
    assert devnodes.runc_version(lambda _cmd: "runc version 1.1.5+ds1\ncommit: ...\n") == (1, 1, 5)


# --- the hook's grant and what daemon-reload does to it -------------------------------------------


def hook_env(tmp_path: Path, pid: int = 777) -> tuple[Path, Path, Path]:
    """A fake /proc entry for the container process and its v1 devices cgroup."""
    proc, cg_root = tmp_path / "proc", tmp_path / "cgroup"
    cgroup = cg_root / "devices" / "docker" / "abc123"
    cgroup.mkdir(parents=True)
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text(
        "9:name=systemd:/docker/abc123\n5:devices:/docker/abc123\n0::/docker/abc123\n")
    return proc, cg_root, cgroup


class Cgroup:
    """Records what is written to devices.allow/deny (the files are not real cgroup files)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self, name: str) -> list[str]:
        return (self.path / name).read_text().splitlines() if (self.path / name).exists() else []


@pytest.fixture
def appending(monkeypatch: pytest.MonkeyPatch):
    """Writes to devices.allow/deny append (each write is one rule, as with the kernel)."""
    real = Path.write_text

    def write_text(self, data, *a, **kw):
        if self.name in ("devices.allow", "devices.deny"):
            with open(self, "a") as f:
                return f.write(data)
        return real(self, data, *a, **kw)

    monkeypatch.setattr(Path, "write_text", write_text)


def request(tmp_path: Path, pid: int, devices: list[dict] | None = None) -> runtime_hook.Request:
    config = {"linux": {"resources": {"devices": devices or []}}}
    return runtime_hook.Request(pid=pid, rootfs=tmp_path / "rootfs", devices="all",
                                capabilities=("utility", "compute"), container="abc123",
                                config=config)


def test_hook_creates_nodes_allows_them_and_records_the_grant(
        paths: sim.SimPaths, tmp_path: Path, monkeypatch, appending) -> None:
    for n in devnodes.nodes_for(_hw()):  # the host's nodes (kmod made them if root)
        (paths.dev / n.name).touch(exist_ok=True)
    proc, cg_root, cgroup = hook_env(tmp_path)
    monkeypatch.setattr(devnodes, "dockerd_cgroup_driver", lambda *_a, **_k: None)
    ran: list[list[str]] = []
    grant = runtime_hook.grant_devices(request(tmp_path, 777), _hw(), [1], paths, ran.append,
                                       proc, cg_root)
    assert grant is not None and grant.systemd  # cgroup v2 host, Docker's default driver
    assert Cgroup(cgroup).lines("devices.allow") == [
        "c 195:255 rw", "c 509:0 rw", "c 509:1 rw", "c 195:1 rw"]
    mknods = [c[-1] for c in ran]
    assert all(c[:5] == ["nsenter", "--target", "777", "--mount", "--"] for c in ran)
    assert any("mknod -m 666" in m and "/dev/nvidia1 c 195 1" in m for m in mknods)
    assert not any("nvidia0" in m for m in mknods)  # only the requested GPU
    saved = json.loads(devnodes.grant_path(paths, "abc123").read_text())
    assert saved["rules"] == grant.rules and saved["kept"] == [] and saved["pid"] == 777


def test_daemon_reload_drops_hook_rules_of_systemd_scopes_only(
        paths: sim.SimPaths, tmp_path: Path, appending) -> None:
    proc, _, cgroup = hook_env(tmp_path)
    rules = ["c 195:255 rw", "c 195:0 rw"]
    devnodes.write_grant(paths, devnodes.Grant("abc123", 777, str(cgroup), True, rules))
    other = tmp_path / "cg2"
    other.mkdir()
    (proc / "778").mkdir()
    devnodes.write_grant(paths, devnodes.Grant("def456", 778, str(other), False, rules))
    cdi = tmp_path / "cg3"
    cdi.mkdir()
    (proc / "779").mkdir()
    devnodes.write_grant(paths, devnodes.Grant("ghi789", 779, str(cdi), True, rules,
                                               kept=rules))
    devnodes.write_grant(paths, devnodes.Grant("gone", 999, str(tmp_path / "nope"), True, rules))

    assert devnodes.reapply_device_policy(paths, proc) == 2
    assert Cgroup(cgroup).lines("devices.deny") == rules
    assert Cgroup(other).lines("devices.deny") == []  # cgroupfs driver: systemd never touches it
    assert Cgroup(cdi).lines("devices.deny") == []  # in DeviceAllow (CDI / --device)
    assert not devnodes.grant_path(paths, "gone").exists()
    assert json.loads(devnodes.grant_path(paths, "abc123").read_text())["revoked"] == rules
    assert devnodes.reapply_device_policy(paths, proc) == 0  # nothing left to drop


def test_generator_never_fails_the_reload(paths: sim.SimPaths, monkeypatch, capsys) -> None:
    paths.grants.mkdir(parents=True, exist_ok=True)

    def boom(*_a, **_k):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(devnodes, "reapply_device_policy", boom)
    assert reload_generator.main(["/run/systemd/generator"]) == 0
    assert "disk on fire" in capsys.readouterr().err


# --- what programs in the container see -----------------------------------------------------------


def test_smi_in_a_container_after_reload_says_nvml_unknown_error(
        paths: sim.SimPaths, monkeypatch) -> None:
    for name in ("nvidiactl", "nvidia0", "nvidia1"):
        (paths.dev / name).touch(exist_ok=True)
    fake_open(monkeypatch, denied=set())
    out = io.StringIO()
    assert smi.main(["-L"], version=VERSION, out=out) == 0
    fake_open(monkeypatch, denied={"nvidiactl", "nvidia0", "nvidia1"})
    out = io.StringIO()
    assert smi.main(["-L"], version=VERSION, out=out) == 255
    assert out.getvalue() == "Failed to initialize NVML: Unknown Error\n"
    fake_open(monkeypatch, denied={"nvidia0"})  # control device kept, one GPU's node lost
    out = io.StringIO()
    assert smi.main(["-L"], version=VERSION, out=out) == 255
    assert out.getvalue() == "Unable to determine the device handle for GPU0000:01:00.0: " \
                             "Unknown Error\n"


def test_cdi_spec_lists_the_nodes_and_the_driver_mounts(paths: sim.SimPaths, capsys) -> None:
    out_file = paths.root / "cdi" / "nvidia.yaml"
    assert ctk.main(["cdi", "generate", f"--output={out_file}"], version="1.17.8") == 0
    text = out_file.read_text()
    assert text.startswith("---\ncdiVersion: \"0.5.0\"\n") and 'kind: "nvidia.com/gpu"' in text
    spec = ctk.cdi_spec(paths, sim.load_hardware(paths.hardware))
    assert [d["name"] for d in spec["devices"]] == [
        "0", spec["devices"][1]["name"], "1", spec["devices"][3]["name"], "all"]
    assert spec["devices"][1]["name"].startswith("GPU-")
    assert spec["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert [n["path"] for n in spec["containerEdits"]["deviceNodes"]] == [
        str(paths.dev / n) for n in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")]
    assert {m["containerPath"] for m in spec["containerEdits"]["mounts"]} == {
        "/run/nvidia-sim", "/usr/bin/nvidia-smi"}
    as_json = json.loads(ctk.render_cdi(spec, "json"))
    assert as_json == spec
    err = capsys.readouterr().err
    assert "Generated CDI spec with version 0.5.0" in err
    out = io.StringIO()
    assert ctk.cdi_list(ctk.Logger(io.StringIO()), out, [str(out_file.parent)]) is None
    assert out.getvalue().split() == [f"nvidia.com/gpu={d['name']}" for d in spec["devices"]]


def test_cdi_generate_needs_the_driver(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("NVIDIA_SIM_ROOT", str(tmp_path / "empty"))
    assert ctk.main(["cdi", "generate"]) == 1
    assert "ERROR_DRIVER_NOT_LOADED" in capsys.readouterr().err


def test_dev_char_symlinks_command_logs_like_the_real_one(paths: sim.SimPaths, capsys) -> None:
    if os.geteuid() != 0:
        pytest.skip("the nodes need mknod (root)")
    os.unlink(paths.dev / "char" / "195:0")
    assert ctk.main(["system", "create-dev-char-symlinks", "--create-all"]) == 0
    err = capsys.readouterr().err
    assert f"Creating link {paths.dev}/char/195:0 => {paths.dev}/nvidia0" in err
    assert f"Could not create symlink: symlink {paths.dev}/nvidiactl {paths.dev}/char/195:255: " \
           "file exists" in err
    assert (paths.dev / "char" / "195:0").resolve() == (paths.dev / "nvidia0").resolve()


def test_cuda_in_the_simulator_sees_only_nodes_it_may_open(tmp_path: Path, monkeypatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    from vllm_sim_helpers import make_gpu_root  # puts the simulator on sys.path

    simhw = importlib.import_module("vllm.sim.hardware")

    root = make_gpu_root(tmp_path)
    dev = tmp_path / "dev"
    dev.mkdir()
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "void")  # what a CDI spec sets
    assert simhw.visible_gpus(root, dev) == []  # no nodes: the env var is the selection
    created = devnodes.create_host_nodes(dev, _hw(), lambda m: None)
    assert created == 5
    fake_open(monkeypatch, denied=set())
    assert [g.index for g in simhw.visible_gpus(root, dev)] == [0, 1]  # CDI: nodes decide
    fake_open(monkeypatch, denied={"nvidia1"})
    assert [g.index for g in simhw.visible_gpus(root, dev)] == [0]
    fake_open(monkeypatch, denied={"nvidiactl"})  # after a daemon-reload: CUDA sees nothing
    assert simhw.visible_gpus(root, dev) == []
