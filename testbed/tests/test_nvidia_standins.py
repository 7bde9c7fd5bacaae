"""The NVIDIA stand-ins print the real formats and fail the real ways."""

from __future__ import annotations

import fcntl
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from rigfleet_testbed.hardware import hardware_profile
from rigfleet_testbed.nvidia import container_runtime, ctk, kmod, persistenced, runtime_hook, smi
from rigfleet_testbed.nvidia import simstate as sim

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "tests" / "fixtures" / "nvidia-smi" / "h200-ubuntu2404-580.159.04"
VERSION = "580.105.08"


def run_smi(*args: str, version: str = VERSION) -> tuple[int, str]:
    out = io.StringIO()
    rc = smi.main(list(args), version=version, out=out)
    return rc, out.getvalue()


def state(paths: sim.SimPaths) -> dict:
    return json.loads(paths.state.read_text())["gpus"]


def as_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)


# --- formats vs the real fixtures ------------------------------------------------------------


def test_default_table_shape(paths: sim.SimPaths) -> None:
    rc, out = run_smi()
    assert rc == 0
    lines = out.splitlines()
    assert re.fullmatch(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4} {7}", lines[0])
    assert all(len(ln) == 91 for ln in lines[1:] if ln), [ln for ln in lines if len(ln) != 91]
    assert lines[2] == ("| NVIDIA-SMI 580.105.08             Driver Version: 580.105.08     "
                        "CUDA Version: 13.0     |")
    assert lines[8] == ("|   0  NVIDIA GeForce RTX 3090        Off |   00000000:01:00.0 Off |"
                        "                  N/A |")
    assert lines[9] == ("| 30%   35C    P8             23W /  350W |       1MiB /  24576MiB |"
                        "      0%      Default |")
    assert "|  No running processes found" in out
    assert lines[12].startswith("|   1  NVIDIA GeForce RTX 3090")


def test_list_gpus(paths: sim.SimPaths) -> None:
    rc, out = run_smi("-L")
    hw = hardware_profile("host1")
    assert out == "".join(f"GPU {g['index']}: NVIDIA GeForce RTX 3090 (UUID: {g['uuid']})\n"
                          for g in hw["gpus"])


def test_query_header_matches_real_form(paths: sim.SimPaths) -> None:
    rc, out = run_smi("--query-gpu=index,name,power.limit", "--format=csv", "-i", "0")
    real = (H200 / "query-gpu-header.csv").read_text().splitlines()
    mine = out.splitlines()
    assert mine[0] == real[0] == "index, name, power.limit [W]"
    assert re.fullmatch(r"\d+, [^,]+, \d+\.\d\d W", mine[1]) and re.fullmatch(
        r"\d+, [^,]+, \d+\.\d\d W", real[1])


def test_query_same_columns_as_real(paths: sim.SimPaths) -> None:
    fields = ("index,name,uuid,pci.bus_id,driver_version,power.limit,power.default_limit,"
              "power.min_limit,power.max_limit,enforced.power.limit,persistence_mode,memory.total,"
              "memory.used,temperature.gpu,clocks.max.sm,compute_cap,vbios_version")
    rc, out = run_smi(f"--query-gpu={fields}", "--format=csv,noheader,nounits")
    real = (H200 / "query-gpu.csv").read_text().splitlines()[0].split(", ")
    for line in out.splitlines():
        mine = line.split(", ")
        assert len(mine) == len(real)
        for a, b in zip(mine, real, strict=True):  # same kind of value in every column
            assert re.sub(r"\d", "9", a).count(".") == re.sub(r"\d", "9", b).count(".") or \
                not a[0].isdigit(), (a, b)


def test_query_units_and_na(paths: sim.SimPaths) -> None:
    rc, out = run_smi("--query-gpu=memory.used,memory.free,clocks.max.sm,utilization.gpu,"
                      "temperature.gpu,pstate,serial,power.draw", "--format=csv", "-i", "1")
    assert out.splitlines() == [
        "memory.used [MiB], memory.free [MiB], clocks.max.sm [MHz], utilization.gpu [%], "
        "temperature.gpu, pstate, serial, power.draw [W]",
        "1 MiB, 24295 MiB, 2100 MHz, 0 %, 35, P8, [N/A], 22.75 W",
    ]


def test_query_aliases_print_canonical_header(paths: sim.SimPaths) -> None:
    rc, out = run_smi("--query-gpu=gpu_name,clocks.sm", "--format=csv,nounits", "-i", "0")
    assert out.splitlines()[0] == "name, clocks.current.sm [MHz]"


def test_q_power_has_real_layout(paths: sim.SimPaths) -> None:
    rc, out = run_smi("-q", "-d", "POWER", "-i", "0")
    real = (H200 / "nvidia-smi-q-power.txt").read_text()

    def labels(text: str) -> list[str]:  # the left column; values and bus ids dropped
        return [re.sub(r"^GPU [0-9A-F:.]+$", "GPU <bus>", ln.split(" : ")[0].rstrip())
                for ln in text.splitlines()]

    assert labels(out) == labels(real)
    assert "        Current Power Limit                            : 350.00 W" in out
    assert "    GPU Memory Power Readings \n" in out  # the trailing space is real


def test_q_full_and_display_types(paths: sim.SimPaths) -> None:
    rc, out = run_smi("-q")
    assert rc == 0
    assert "    Product Name                                       : NVIDIA GeForce RTX 3090" in out
    assert "    Processes                                          : None" in out
    rc, out = run_smi("-q", "-d", "MEMORY,TEMPERATURE")
    assert "FB Memory Usage" in out and "GPU Current Temp" in out and "Power Readings" not in out
    rc, out = run_smi("-q", "-d", "BOGUS")
    assert rc == 2


def test_q_xml_like_real(paths: sim.SimPaths) -> None:
    rc, out = run_smi("-q", "-x")
    real = (H200 / "nvidia-smi-q.xml").read_text()
    assert out.splitlines()[:3] == real.splitlines()[:3]
    assert out.endswith("\t</gpu>\n\n</nvidia_smi_log>\n") and real.endswith(
        "\t</gpu>\n\n</nvidia_smi_log>\n")
    strip = re.compile(r"<!DOCTYPE[^>]*>")
    mine_root, real_root = ET.fromstring(strip.sub("", out)), ET.fromstring(strip.sub("", real))
    paths_to_check = [
        "driver_version", "cuda_version", "attached_gpus", "gpu/product_name", "gpu/uuid",
        "gpu/persistence_mode", "gpu/vbios_version", "gpu/pci/pci_bus_id",
        "gpu/fb_memory_usage/total", "gpu/fb_memory_usage/used", "gpu/performance_state",
        "gpu/gpu_power_readings/current_power_limit", "gpu/gpu_power_readings/min_power_limit",
        "gpu/gpu_power_readings/max_power_limit", "gpu/gpu_power_readings/default_power_limit",
        "gpu/max_clocks/sm_clock", "gpu/temperature/gpu_temp", "gpu/processes",
    ]
    for p in paths_to_check:
        assert real_root.find(p) is not None and mine_root.find(p) is not None, p
    gpus = mine_root.findall("gpu")
    assert [g.get("id") for g in gpus] == ["00000000:01:00.0", "00000000:21:00.0"]
    assert gpus[0].findtext("fb_memory_usage/total") == "24576 MiB"
    assert gpus[0].findtext("gpu_power_readings/max_power_limit") == "350.00 W"


def test_topo_like_real(paths: sim.SimPaths) -> None:
    rc, out = run_smi("topo", "-m")
    real = (H200 / "topo.txt").read_text()
    assert out.splitlines()[0] == (
        "\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m")
    assert out.split("\nLegend:")[1] == real.split("\nLegend:")[1]
    assert re.fullmatch(r"GPU0\t X \tPHB\t0-\d+\t0\t\tN/A", out.splitlines()[1])


def test_version_like_real(paths: sim.SimPaths) -> None:
    rc, out = run_smi("--version")
    real = (H200 / "version.txt").read_text()
    assert [ln.split(":")[0] for ln in out.splitlines()] == [
        ln.split(":")[0] for ln in real.splitlines()]


# --- argument errors -------------------------------------------------------------------------


def test_argument_errors_go_to_stdout_like_real(paths: sim.SimPaths) -> None:
    assert run_smi("-pl", "300", "-i", "0", "--help") == (
        2, "ERROR: Option -pl is not valid for this command. Please run 'nvidia-smi -h' for help."
           "\n\n")
    rc, out = run_smi("--bogus")
    assert rc == 2 and out.startswith("ERROR: Option --bogus is not recognized.")
    rc, out = run_smi("-i")
    assert rc == 2 and out.startswith("ERROR: Option -i is missing its value.")
    rc, out = run_smi("--query-gpu=nope", "--format=csv")
    assert rc == 2 and out.startswith('Field "nope" is not a valid field to query.')
    assert run_smi("-i", "7", "-L") == (6, "No devices were found\n")
    assert state(paths)["0"]["power_limit_w"] == 350


# --- driver failures -------------------------------------------------------------------------


def test_not_loaded_exact_message(paths: sim.SimPaths) -> None:
    paths.loaded.unlink()
    for args in ([], ["-L"], ["--query-gpu=index", "--format=csv"], ["-pl", "250"], ["topo", "-m"]):
        rc, out = run_smi(*args)
        assert rc == 9
        assert out.splitlines()[0] == (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.")


def test_upgrade_without_reboot_mismatches(paths: sim.SimPaths) -> None:
    assert run_smi("-L", version="590.44.01") == (
        18, "Failed to initialize NVML: Driver/library version mismatch\n"
            "NVML library version: 590.44\n")


# --- -pl and -pm -----------------------------------------------------------------------------


def test_power_limit_success(paths: sim.SimPaths) -> None:
    rc, out = run_smi("-i", "0", "-pl", "250")
    assert (rc, out) == (0, "Power limit for GPU 00000000:01:00.0 was set to 250.00 W from "
                            "350.00 W.\nAll done.\n")
    assert state(paths)["0"]["power_limit_w"] == 250 and state(paths)["1"]["power_limit_w"] == 350
    rc, out = run_smi("--query-gpu=power.limit,enforced.power.limit", "--format=csv,noheader")
    assert out == "250.00 W, 250.00 W\n350.00 W, 350.00 W\n"
    rc, out = run_smi("-pl", "300")  # no -i: every GPU
    assert out.splitlines() == [
        "Power limit for GPU 00000000:01:00.0 was set to 300.00 W from 250.00 W.",
        "Power limit for GPU 00000000:21:00.0 was set to 300.00 W from 350.00 W.", "All done."]


def test_power_limit_out_of_range(paths: sim.SimPaths) -> None:
    rc, out = run_smi("-i", "0", "-pl", "400")
    assert rc == 2
    assert out == ("Provided power limit 400.00 W is not a valid power limit which should be "
                   "between 100.00 W and 350.00 W for GPU 00000000:01:00.0\n"
                   "Terminating early due to previous errors.\n")
    assert run_smi("-pl", "99.5")[0] == 2
    assert state(paths)["0"]["power_limit_w"] == 350


def test_power_limit_needs_root(paths: sim.SimPaths, monkeypatch: pytest.MonkeyPatch) -> None:
    as_user(monkeypatch)
    rc, out = run_smi("-i", "1", "-pl", "250")
    assert rc == 4
    assert out == ("Failed to set power management limit for GPU 00000000:21:00.0: "
                   "Insufficient Permissions\nTerminating early due to previous errors.\n")
    assert state(paths)["1"]["power_limit_w"] == 350


def test_power_limit_not_settable_card(paths: sim.SimPaths) -> None:
    hw = json.loads(paths.hardware.read_text())
    hw["gpus"][0]["power_limit_settable"] = False
    paths.hardware.write_text(json.dumps(hw))
    rc, out = run_smi("-i", "0", "-pl", "250")
    assert (rc, out) == (0, "Changing power management limit is not supported in current scope "
                            "for GPU: 00000000:01:00.0.\nAll done.\n")


def test_persistence_mode(paths: sim.SimPaths, monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_smi("-i", "0", "-pm", "1") == (
        0, "Enabled persistence mode for GPU 00000000:01:00.0.\nAll done.\n")
    assert run_smi("-i", "0", "-pm", "ENABLED") == (
        0, "Persistence mode is already Enabled for GPU 00000000:01:00.0.\nAll done.\n")
    assert state(paths)["0"]["persistence"] is True and state(paths)["1"]["persistence"] is False
    assert run_smi("--query-gpu=persistence_mode", "--format=csv,noheader") == (
        0, "Enabled\nDisabled\n")
    assert "On  |" in run_smi()[1]
    as_user(monkeypatch)
    assert run_smi("-pm", "0") == (4, "Unable to set persistence mode for GPU 00000000:01:00.0: "
                                      "Insufficient Permissions\n"
                                      "Terminating early due to previous errors.\n")


# --- memory from allocation files ------------------------------------------------------------


def _alloc(paths: sim.SimPaths, name: str, body: dict) -> Path:
    path = paths.alloc_dir / f"{name}.json"
    path.write_text(json.dumps(body))
    return path


def test_memory_used_counts_live_holders_only(paths: sim.SimPaths) -> None:
    live = _alloc(paths, "vllm", {"gpus": {"0": 20480, "1": 20480}, "pid": 4242,
                                  "container": "vllm-main", "since": "2026-11-29T16:00:00Z"})
    holder = os.open(live, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)  # a live holder keeps its lock
    stale = _alloc(paths, "dead", {"gpus": {"0": 4096}, "pid": 1})  # nobody holds it
    try:
        rc, out = run_smi("--query-gpu=index,memory.used,memory.free,pstate",
                          "--format=csv,noheader,nounits")
        assert out == "0, 20481, 3815, P2\n1, 20481, 3815, P2\n"
        assert not stale.exists() and live.exists()  # the dead holder's file was cleaned up
        table = run_smi()[1]
        assert "|   20481MiB /  24576MiB |" in table
        assert "|    0   N/A  N/A            4242      C   vllm-main" in table
        assert "20480MiB |" in table
    finally:
        os.close(holder)
    rc, out = run_smi("--query-gpu=memory.used", "--format=csv,noheader,nounits")
    assert out == "1\n1\n" and not live.exists()


def test_memory_of_a_killed_holder_process_is_released(paths: sim.SimPaths) -> None:
    path = paths.alloc_dir / "proc.json"
    code = (
        "import fcntl, json, os, sys, time\n"
        f"f = open({str(path)!r}, 'w')\n"
        "fcntl.flock(f, fcntl.LOCK_EX)\n"
        "json.dump({'gpus': {'1': 1000}, 'pid': os.getpid()}, f); f.flush()\n"
        "print('ready', flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        assert run_smi("--query-gpu=memory.used", "--format=csv,noheader,nounits")[1] == "1\n1001\n"
    finally:
        proc.kill()
        proc.wait()
    assert run_smi("--query-gpu=memory.used", "--format=csv,noheader,nounits")[1] == "1\n1\n"


def test_utilization_from_allocation(paths: sim.SimPaths) -> None:
    path = _alloc(paths, "busy", {"gpus": {"0": 1000}, "utilization": {"0": 100}})
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        run_smi("-i", "0", "-pl", "250")
        rc, out = run_smi("--query-gpu=utilization.gpu,power.draw", "--format=csv,noheader",
                          "-i", "0")
        assert out == "100 %, 250.00 W\n"  # a busy card draws up to its limit, not beyond
    finally:
        os.close(fd)


# --- kernel module boot unit -----------------------------------------------------------------


def test_kmod_load_creates_the_driver_files(tmp_path: Path) -> None:
    source = tmp_path / "hw.json"
    source.write_text(json.dumps(hardware_profile("h")))
    p = sim.SimPaths(tmp_path / "run", tmp_path / "run/hardware.json")
    assert kmod.load(p, source, VERSION, err=io.StringIO()) == 0
    assert p.loaded.read_text() == VERSION + "\n"
    assert json.loads(p.hardware.read_text()) == json.loads(source.read_text())
    assert state(p) == {"0": {"persistence": False, "power_limit_w": 350},
                        "1": {"persistence": False, "power_limit_w": 350}}
    assert p.alloc_dir.is_dir() and oct(p.alloc_dir.stat().st_mode & 0o7777) == "0o1777"
    # A second load (the unit restarted, or a newer package without reboot) changes nothing.
    assert kmod.load(p, source, "590.44.01", err=io.StringIO()) == 0
    assert p.loaded.read_text() == VERSION + "\n"


def test_kmod_refuses_unsupported_branch_and_missing_gpu(tmp_path: Path) -> None:
    source = tmp_path / "hw.json"
    profile = hardware_profile("h")
    profile["driver_branch_supported"] = ["580"]
    source.write_text(json.dumps(profile))
    p = sim.SimPaths(tmp_path / "run", tmp_path / "run/hardware.json")
    err = io.StringIO()
    assert kmod.load(p, source, "590.44.01", err=err) == 1
    assert "is not supported by the NVIDIA 590.44.01 driver release" in err.getvalue()
    assert not p.loaded.exists()
    err = io.StringIO()
    assert kmod.load(p, tmp_path / "absent.json", VERSION, err=err) == 1
    assert "could not insert 'nvidia': No such device" in err.getvalue()


# --- persistence daemon ----------------------------------------------------------------------


def test_persistenced_enables_and_gives_back(paths: sim.SimPaths) -> None:
    changed = persistenced.initialize(paths, VERSION, enable=True)
    assert changed == [0, 1]
    assert all(g["persistence"] for g in state(paths).values())
    persistenced.teardown(paths, changed)
    assert not any(g["persistence"] for g in state(paths).values())


def test_persistenced_fails_without_driver_or_with_mismatch(paths: sim.SimPaths) -> None:
    assert persistenced.initialize(paths, "590.44.01", enable=True) is None
    paths.loaded.unlink()
    assert persistenced.initialize(paths, VERSION, enable=True) is None


def test_persistenced_daemon_runs_until_sigterm(paths: sim.SimPaths, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = ("import sys; from pathlib import Path; from rigfleet_testbed.nvidia import "
            f"persistenced; sys.exit(persistenced.main(['--foreground'], version={VERSION!r}, "
            f"pid_file=Path({str(pid_file)!r})))")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 10
        while not pid_file.exists() and time.time() < deadline:
            time.sleep(0.05)
        assert pid_file.read_text().strip() == str(proc.pid)
        assert all(g["persistence"] for g in state(paths).values())
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    assert not pid_file.exists()
    assert not any(g["persistence"] for g in state(paths).values())


# --- nvidia-ctk ------------------------------------------------------------------------------


def ctk_run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = ctk.main(list(args), version="1.17.8", out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


def test_ctk_merge_keeps_other_keys_and_is_stable(tmp_path: Path) -> None:
    cfg = tmp_path / "daemon.json"
    cfg.write_text(json.dumps({"registry-mirrors": ["http://registry.rigfleet.test:5000"],
                               "runtimes": {"crun": {"path": "/usr/bin/crun"}},
                               "log-driver": "journald"}))
    rc, out, err = ctk_run("runtime", "configure", "--runtime=docker", f"--config={cfg}")
    assert rc == 0
    assert json.loads(cfg.read_text()) == {
        "log-driver": "journald",
        "registry-mirrors": ["http://registry.rigfleet.test:5000"],
        "runtimes": {"crun": {"path": "/usr/bin/crun"},
                     "nvidia": {"args": [], "path": "nvidia-container-runtime"}},
    }
    assert [re.search(r'msg="([^"]*)"', ln).group(1) for ln in err.splitlines()] == [
        f"Loading config from {cfg}", f"Wrote updated config to {cfg}",
        "It is recommended that docker daemon be restarted."]
    first = cfg.read_bytes()
    assert ctk_run("runtime", "configure", "--runtime", "docker", "--config", str(cfg))[0] == 0
    assert cfg.read_bytes() == first
    assert first.startswith(b'{\n    "log-driver": "journald",')


def test_ctk_creates_missing_config_and_rejects_bad_input(tmp_path: Path) -> None:
    cfg = tmp_path / "etc/docker/daemon.json"
    rc, out, err = ctk_run("runtime", "configure", "--runtime=docker", f"--config={cfg}")
    assert rc == 0 and "Config file does not exist; using empty config" in err
    assert json.loads(cfg.read_text()) == {
        "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}
    cfg.write_text("{not json")
    rc, out, err = ctk_run("runtime", "configure", "--runtime=docker", f"--config={cfg}")
    assert rc == 1 and "level=error" in err and cfg.read_text() == "{not json"
    assert ctk_run("runtime", "configure", "--runtime=podman", f"--config={cfg}")[0] == 1


def test_ctk_version_and_default_runtime(tmp_path: Path) -> None:
    rc, out, err = ctk_run("--version")
    assert out.startswith("NVIDIA Container Toolkit CLI version 1.17.8\ncommit: ")
    cfg = tmp_path / "daemon.json"
    ctk_run("runtime", "configure", "--runtime=docker", f"--config={cfg}", "--set-as-default")
    assert json.loads(cfg.read_text())["default-runtime"] == "nvidia"


# --- OCI hook and runtime --------------------------------------------------------------------


def _bundle(tmp_path: Path, env: list[str], root: str = "rootfs") -> Path:
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps(
        {"root": {"path": root}, "process": {"env": ["PATH=/usr/bin", *env]}}))
    return bundle


def hook(tmp_path: Path, env: list[str], run=None) -> tuple[int, str, list[list[str]]]:
    bundle = _bundle(tmp_path, env)
    calls: list[list[str]] = []
    state_json = json.dumps({"ociVersion": "1.0.2", "id": "c1", "status": "creating",
                             "pid": 4321, "bundle": str(bundle)})
    err = io.StringIO()
    try:
        runtime_hook.prestart(json.loads(state_json), sim.SimPaths.from_env(),
                              run=run or calls.append, smi=Path("/usr/bin/nvidia-smi"))
        rc = 0
    except runtime_hook.HookError as exc:
        print(f"nvidia-container-cli: {exc}", file=err)
        rc = 1
    return rc, err.getvalue(), calls


def test_hook_fails_like_real_without_driver(paths: sim.SimPaths, tmp_path: Path) -> None:
    paths.loaded.unlink()
    bundle = _bundle(tmp_path, ["NVIDIA_VISIBLE_DEVICES=all"])
    err = io.StringIO()
    rc = runtime_hook.main(["prestart"], err=err, stdin=io.StringIO(
        json.dumps({"pid": 99, "bundle": str(bundle)})))
    assert rc == 1
    assert err.getvalue() == ("nvidia-container-cli: initialization error: nvml error: "
                              "driver not loaded\n")


def test_hook_mounts_the_driver_into_the_container(paths: sim.SimPaths, tmp_path: Path) -> None:
    rc, err, calls = hook(tmp_path, ["NVIDIA_VISIBLE_DEVICES=0,1"])
    assert rc == 0, err
    rootfs = tmp_path / "bundle/rootfs"
    enter = ["nsenter", "--target", "4321", "--mount", "--"]
    assert calls == [
        enter + ["mount", "--bind", str(paths.root), f"{rootfs}/run/nvidia-sim"],
        enter + ["mount", "--bind", "/usr/bin/nvidia-smi", f"{rootfs}/usr/bin/nvidia-smi"],
        enter + ["mount", "-o", "remount,bind,ro", f"{rootfs}/usr/bin/nvidia-smi"],
    ]
    assert (rootfs / "run/nvidia-sim").is_dir() and (rootfs / "usr/bin/nvidia-smi").exists()


def test_hook_ignores_non_gpu_containers_and_rejects_unknown_devices(
        paths: sim.SimPaths, tmp_path: Path) -> None:
    assert hook(tmp_path / "a", []) == (0, "", [])
    assert hook(tmp_path / "b", ["NVIDIA_VISIBLE_DEVICES=void"]) == (0, "", [])
    rc, err, calls = hook(tmp_path / "c", ["NVIDIA_VISIBLE_DEVICES=0,2"])
    assert (rc, err, calls) == (1, "nvidia-container-cli: device error: 2: unknown device\n", [])
    rc, err, calls = hook(tmp_path / "d", ["NVIDIA_VISIBLE_DEVICES=all",
                                           "NVIDIA_DRIVER_CAPABILITIES=compute"])
    assert rc == 0 and len(calls) == 1  # no utility capability: no nvidia-smi


def test_hook_other_stages_do_nothing() -> None:
    assert runtime_hook.main(["poststop"], stdin=io.StringIO("")) == 0


def test_runtime_adds_hook_only_for_gpu_containers() -> None:
    cfg = {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}}
    assert container_runtime.add_hook(cfg)
    assert cfg["hooks"]["prestart"] == [{"path": "/usr/bin/nvidia-container-runtime-hook",
                                         "args": ["nvidia-container-runtime-hook", "prestart"]}]
    assert not container_runtime.add_hook(cfg)  # --gpus already added one: not twice
    assert not container_runtime.add_hook({"process": {"env": ["PATH=/bin"]}})
