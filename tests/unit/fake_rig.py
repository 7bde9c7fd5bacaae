"""A pretend GPU host for ``@fake`` runs of the roles: answers facts, remembers commands.

pyinfra's ``@fake`` connector answers every command with empty success unless scripted. Our
roles read a dozen facts; scripting each by hand per test would hide what a test is about.
``FakeRig`` instead keeps a small model of one host (files, packages, services, GPUs,
containers, checkouts, weights) and:

- answers the fact commands the roles send, from that model;
- applies the commands the roles run (``apt-get install``, ``apt-mark hold``, ``chmod``,
  ``systemctl``, ``nvidia-ctk``, ``docker compose up/down``, the weights fetcher, a reboot...)
  to the model, so a second run sees a converged host;
- receives uploads (``put_file`` is patched to store the bytes) and secrets written through a
  command's stdin (``roles.ops.secret_file``);
- knows the platform: PID 1, Secure Boot (mokutil), DKMS's signing key and whether it is
  enrolled (a DKMS module then refuses to load at boot, as the kernel does), a driver left by
  NVIDIA's .run installer;
- plays the host-side tool (``rigfleet-host.pyz``): its probe, a swap transaction (promoted,
  or rolled back / failed as ``swap_failure`` says), ``status``, ``adopt``, ``ensure`` and the
  maintenance window (``maintenance open`` holds the lock and answers 503; ``maintenance
  close`` recreates the active stack and gates it, or fails as ``close_failure`` says);
- plays dockerd's configuration: ``systemctl restart docker`` stops the running containers
  unless ``live-restore`` was in effect, ``reload`` applies the reloadable keys.

It knows our command shapes, nothing more: it is a test double, not an emulator.

Example::

    rig = FakeRig("debian13")
    result = run_converge(rig, host_data)         # see test_roles_fake.py
    rig.files["/etc/systemd/system/rigfleet-power-caps.service"]
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shlex
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from images_fakes import FakeEngine

from rigfleet.vllmargs import MARKER as VLLM_ARGS_MARKER

OS_RELEASES = {
    "ubuntu2204": (
        'PRETTY_NAME="Ubuntu 22.04.5 LTS"\nNAME="Ubuntu"\nVERSION_ID="22.04"\n'
        "VERSION_CODENAME=jammy\nID=ubuntu\nID_LIKE=debian\nKERNEL_RELEASE=5.15.0-130-generic"
    ),
    "ubuntu2404": (
        'PRETTY_NAME="Ubuntu 24.04.3 LTS"\nNAME="Ubuntu"\nVERSION_ID="24.04"\n'
        "VERSION_CODENAME=noble\nID=ubuntu\nID_LIKE=debian\nKERNEL_RELEASE=6.8.0-88-generic"
    ),
    "debian12": (
        'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\n'
        'VERSION_ID="12"\nVERSION_CODENAME=bookworm\nID=debian\n'
        "KERNEL_RELEASE=6.1.0-40-amd64"
    ),
    "debian13": (
        'PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nNAME="Debian GNU/Linux"\n'
        'VERSION_ID="13"\nVERSION_CODENAME=trixie\nID=debian\n'
        "KERNEL_RELEASE=6.12.48+deb13-amd64"
    ),
    "rocky9": 'NAME="Rocky Linux"\nVERSION_ID="9.4"\nID=rocky\nKERNEL_RELEASE=5.14.0',
}

DRIVER_VERSION = "580.105.08"
VLLM_VERSION = "0.20.2rc1.dev9+g01d4d1ad3"
SERVED_NAME = "qwen3.6-27b-autoround"
_SYMBOLIC = {
    "0": "---",
    "1": "--x",
    "2": "-w-",
    "3": "-wx",
    "4": "r--",
    "5": "r-x",
    "6": "rw-",
    "7": "rwx",
}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _mode(mode: str) -> str:
    return mode.zfill(4)[-4:]


@dataclass
class Gpu:
    index: int
    limit: float = 350.0
    minimum: float = 100.0
    maximum: float = 350.0

    def csv(self, fields: tuple[str, ...], driver: str) -> str:
        values = {
            "index": str(self.index),
            "name": "NVIDIA GeForce RTX 3090",
            "uuid": f"GPU-0000000{self.index}-aaaa-bbbb-cccc-dddddddddddd",
            "pci.bus_id": f"00000000:0{self.index + 1}:00.0",
            "driver_version": driver,
            "power.limit": f"{self.limit:.2f}",
            "power.default_limit": "350.00",
            "power.min_limit": f"{self.minimum:.2f}",
            "power.max_limit": f"{self.maximum:.2f}",
            "enforced.power.limit": f"{self.limit:.2f}",
            "persistence_mode": "Enabled",
            "memory.total": "24576",
            "memory.used": "1",
            "temperature.gpu": "40",
            "clocks.max.sm": "2100",
            "compute_cap": "8.6",
            "vbios_version": "94.02.42.40.2A",
        }
        return ", ".join(values.get(f, "[N/A]") for f in fields)


def weights_manifest(repo: str, revision: str, at: int = 1700000000) -> dict:
    """A manifest as the fetcher writes it (one shard), for the fake's model directory."""
    return {"repo": repo, "revision": revision, "at": at, "files": {
        "model-00001-of-00004.safetensors": {"size": 1024, "sha256": "0" * 64,
                                             "mtime": 1700000000.5}}}


@dataclass
class FakeRig:
    """The model of one host; see the module docstring."""

    os_key: str
    files: dict[str, bytes] = field(default_factory=dict)
    modes: dict[str, str] = field(default_factory=dict)
    dirs: dict[str, str] = field(default_factory=dict)  # path -> mode
    packages: dict[str, str] = field(default_factory=dict)  # name -> version
    held: set[str] = field(default_factory=set)
    active: set[str] = field(default_factory=set)
    enabled: set[str] = field(default_factory=set)
    keyrings: set[str] = field(default_factory=set)
    gpus: list[Gpu] = field(default_factory=lambda: [Gpu(0), Gpu(1)])
    driver_loaded: str | None = None  # loaded driver version
    # Versions of nvidia-driver-cuda the configured repositories offer (apt-cache madison);
    # None: whatever is asked for.
    cuda_offers: list[str] | None = None
    runtimes_registered: bool = False
    # The Docker engine's images, the host's saved archives and the Docker root's free space.
    engine: FakeEngine = field(default_factory=FakeEngine)
    built: dict[str, dict[str, str]] = field(default_factory=dict)  # derived image -> labels
    # What the pinned image's vLLM says of a stack's command line (rigfleet.vllmargs): argparse's
    # error line, "" to accept; the version is the image tag's.
    vllm_args_error: str = ""
    containers: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    genesis_head: str | None = None
    genesis_origin: str | None = None
    genesis_trees: dict[str, int] = field(default_factory=dict)  # exported commit -> mtime
    genesis_layout: str = "v7"  # what the checkout's and the trees' files mark
    # The Genesis registry the inspect helper reports: GENESIS_ENABLE_ suffix -> lifecycle
    # (None: every switch the built-in stack files name, as live patches).
    genesis_switches: dict[str, str] | None = None
    vllm_version: str = VLLM_VERSION
    allowlist: list[str] = field(default_factory=lambda: [VLLM_VERSION])
    venv_version: str | None = None
    # Model directory entries: path -> the manifest of a verified revision, or a link target.
    weights: dict[str, dict | str] = field(default_factory=dict)
    ledger: list[str] = field(default_factory=list)
    boot_marker: str | None = None
    reboots: int = 0
    commands: list[str] = field(default_factory=list)
    # The host-side tool's state: active record, front route, lock holder, finished swaps.
    active_record: dict | None = None
    route: str | None = None
    lock: dict | None = None
    lock_probes: int | None = None  # the lock's holder lets go after this many more probes
    swaps: dict[str, dict] = field(default_factory=dict)
    # None: a swap promotes; else (phase, reason) of a failure: it rolls back (or fails).
    swap_failure: tuple[str, str] | None = None
    # The maintenance window (window.json as the host tool keeps it) and how its close ends.
    window: dict | None = None
    close_failure: tuple[str, str] | None = None
    # What the running dockerd read: live-restore in effect, the exec-opts it started with.
    live_restore: bool = False
    exec_opts: list = field(default_factory=list)
    events: list[str] = field(default_factory=list)  # restarts, reboots, windows, in order
    links: dict[str, str] = field(default_factory=dict)  # symlink -> target
    pid1: str = "systemd"
    # None: no EFI (mokutil says so); else Secure Boot on or off.
    secure_boot: bool | None = None
    mok_enrolled: bool = False
    mok_pending: bool = False
    journal: list[str] = field(default_factory=list)  # this boot's log lines
    run_installer: bool = False  # a driver from NVIDIA's .run installer (nvidia-uninstall)
    pkg_busy: str = ""  # ``maintenance ready`` fails with this (a held dpkg lock, a full disk)
    apt_failure: str = ""  # ``apt-get install`` (not a download) fails with this
    stdin_seen: list[str] = field(default_factory=list)  # what commands got on stdin
    uploads: list[str] = field(default_factory=list)  # paths written by an upload (put_file)
    # What `haproxy -c` says of a config (None: valid), as HAProxy's own message.
    haproxy_refuses: str | None = None

    # --- uploads ------------------------------------------------------------------------

    def put(self, path: str, data: bytes) -> None:
        self.uploads.append(path)
        self.files[path] = data
        self.modes.setdefault(path, "0644")

    # --- the connector hook ---------------------------------------------------------------

    def respond(self, cmd: str, stdin: str | None = None) -> tuple[bool, list[str]]:
        self.commands.append(cmd)
        if stdin is not None:
            self.stdin_seen.append(stdin)
            m = re.match(r"umask 077 && rf_tmp=\$\(mktemp .*chown (\S+) .*chmod (\d+) "
                         r"\"\$rf_tmp\" && mv -f \"\$rf_tmp\" (\S+); \}", cmd)
            if m:
                path = m.group(3)
                self.files[path] = base64.b64decode(stdin)
                self.modes[path] = _mode(m.group(2))
                return True, []
        for handler in (self._facts, self._actions):
            answer = handler(cmd)
            if answer is not None:
                return answer
        return True, []

    # --- the platform --------------------------------------------------------------------

    MOK_CERT = "/var/lib/dkms/mok.pub"

    def _platform(self) -> list[str]:
        out = [f"pid1={self.pid1}", f"systemd={'yes' if self.pid1 == 'systemd' else 'no'}",
               "arch=amd64"]
        if "mokutil" in self.packages:
            if self.secure_boot is None:
                out.append("sb=EFI variables are not supported on this system")
            else:
                out.append(f"sb=SecureBoot {'enabled' if self.secure_boot else 'disabled'}")
            if self.MOK_CERT in self.files:
                out.append(f"mok_cert={self.MOK_CERT}")
                state = ("is already enrolled" if self.mok_enrolled else
                         "is already in the enrollment request" if self.mok_pending
                         else "is not enrolled")
                out.append(f"mok={self.MOK_CERT} {state}")
        else:
            out.append("mokutil=missing")
        if self.run_installer:
            out += ["run_uninstaller=yes", "smi=/usr/bin/nvidia-smi", "smi_owner="]
        elif self.driver_loaded:
            out += ["smi=/usr/bin/nvidia-smi", "smi_owner=nvidia-smi"]
        return out

    def _dkms_module_refused(self) -> bool:
        """The kernel's verdict on a DKMS-built module under Secure Boot."""
        return bool(self.secure_boot) and "nvidia-kernel-open-dkms" in self.packages \
            and not self.mok_enrolled

    # --- facts -----------------------------------------------------------------------------

    def _facts(self, cmd: str) -> tuple[bool, list[str]] | None:
        if cmd.startswith("docker run --rm --pull never --network none --entrypoint python3"):
            image = shlex.split(cmd)[11]
            answer = {"version": image.rsplit(":", 1)[-1].removeprefix("v"),
                      "rc": 2 if self.vllm_args_error else 0, "error": self.vllm_args_error}
            return True, [VLLM_ARGS_MARKER + json.dumps(answer)]
        if cmd.startswith('echo "pid1=$(cat /proc/1/comm'):
            return True, self._platform()
        if cmd.startswith("since=$(") and "{ journalctl -b -q --no-pager" in cmd:
            # a machine: PID 1 started with the kernel, so the journal of this boot is -b's
            return True, [line for line in self.journal
                          if re.search(r"Key was rejected by service|Loading of .* is rejected",
                                       line)][:3]
        if cmd.startswith("if [ -f /usr/local/lib/rigfleet/rigfleet-host.pyz ]; then") \
                and "rigfleet-host.pyz probe" in cmd:
            if "/usr/local/lib/rigfleet/rigfleet-host.pyz" not in self.files:
                return True, ['{"schema": "rigfleet-probe/1", "bare": true}']  # not deployed
            return True, [json.dumps(self._probe())]
        m = re.search(r"rigfleet-host.pyz status --id (\S+) --since (\d+) --json$", cmd)
        if m:
            done = self.swaps.get(m.group(1))
            if done is None:
                return True, [json.dumps({"events": [], "next": 0, "state": "died",
                                          "result": None})]
            events = done["events"][int(m.group(2)):]
            return True, [json.dumps({"events": events, "next": len(done["events"]),
                                      "state": "done", "result": done["result"]})]
        m = re.match(r"systemctl is-active (\S+)", cmd)
        if m:
            return True, ["active" if m.group(1) in self.active else "inactive"]
        if cmd.startswith("cat /etc/os-release"):
            return True, OS_RELEASES[self.os_key].splitlines()
        if cmd.startswith("dpkg-query -W"):
            out = []
            for name, version in sorted(self.packages.items()):
                want = "hold" if name in self.held else "install"
                out.append(f"{name}\t{version}\t{want} ok installed")
            return True, out
        m = re.match(r"if \[ ! -s (\S+) \]; then echo missing", cmd)
        if m:
            return True, ["same" if m.group(1) in self.keyrings else "missing"]
        m = re.match(r"! \(test -e (\S+) \|\|", cmd)
        if m:
            return True, self._stat(m.group(1))
        m = re.match(r"test -e (\S+) && \( sha256sum", cmd)
        if m:
            path = m.group(1)
            return True, [f"{_sha(self.files[path])}  {path}"] if path in self.files else []
        m = re.match(r"if \[ -f (\S+) \]; then stat -c '%a %U %G'", cmd)
        if m:
            path = m.group(1)
            if path not in self.files:
                return True, []
            return True, [f"{int(self.modes[path], 8):o} root root", _sha(self.files[path])]
        m = re.search(r"systemctl show --all --property Id --property (\w+) (\S+)", cmd)
        if m:
            key, unit = m.group(1), m.group(2).strip("'")
            if key == "SubState":
                value = "running" if unit in self.active else "dead"
            else:
                value = "enabled" if unit in self.enabled else "disabled"
            return True, [f"Id={unit}", f"{key}={value}"]
        if cmd.startswith("out=$(nvidia-smi --query-gpu="):
            if not self.driver_loaded:
                return True, [
                    "RIGFLEET-NVIDIA-SMI-FAILED",
                    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
                ]
            fields = tuple(re.search(r"--query-gpu=(\S+)", cmd).group(1).split(","))
            return True, [g.csv(fields, self.driver_loaded) for g in self.gpus]
        if cmd.startswith("cat /etc/docker/daemon.json"):
            return True, self._text("/etc/docker/daemon.json")
        if cmd.startswith("docker info --format"):
            if "docker.io" not in self.packages and "docker-ce" not in self.packages:
                return True, []
            runtimes = {"runc": {"path": "runc"}}
            if self.runtimes_registered:
                runtimes["nvidia"] = {"path": "nvidia-container-runtime"}
            return True, [json.dumps(runtimes)]
        if cmd.startswith("root=$(docker info") and "rf_img()" in cmd:
            self.engine.installed = "docker.io" in self.packages or "docker-ce" in self.packages
            return True, self.engine.state(cmd)
        m = re.match(r"docker image inspect --format '\{\{json \.Config\.Labels\}\}' (\S+)", cmd)
        if m:
            labels = self.built.get(m.group(1))
            return True, [json.dumps(labels)] if labels is not None else []
        m = re.match(
            r"docker inspect --type container --format '\{\{\.State\.Status\}\} "
            r"\{\{index \.Config\.Labels \"io\.rigfleet\.config-hash\"\}\}' (\S+)",
            cmd,
        )
        if m:
            name = m.group(1)
            if name not in self.containers:
                return True, []
            status, label = self.containers[name]
            return True, [f"{status} {label or '<no value>'}"]
        if cmd.startswith("printf 'state=%s"):
            name = re.search(r"\}\}' (\S+) 2>/dev/null", cmd).group(1)
            if name not in self.containers:
                return True, ["state=", "health=000", "models="]
            status, _ = self.containers[name]
            models = json.dumps({"data": [{"id": SERVED_NAME}]}) if status == "running" else ""
            code = "200" if status == "running" else "000"
            return True, [f"state={status} 0 0", f"health={code}", f"models={models}"]
        m = re.match(r"echo head=\$\(git -C (\S+) rev-parse", cmd)
        if m:
            return True, [
                f"head={self.genesis_head or ''}",
                f"origin={self.genesis_origin or ''}",
                f"markers={self._genesis_marker() if self.genesis_head else '-'}",
            ]
        m = re.match(r"for t in (\S+)/\*/; do", cmd)
        if m:
            out = [f"tree {t} {c} {self._genesis_marker()}" for c, t in self.genesis_trees.items()]
            refs = sorted({r for data in self.files.values()
                           for r in re.findall(rb"genesis-trees/([0-9a-f]{40})", data)})
            return True, out + [f"ref {r.decode()}" for r in refs]
        if "import importlib.metadata as m" in cmd:
            return True, [self.venv_version] if self.venv_version else []
        m = re.match(r"cat (\S+)/\.rigfleet-manifest\.json", cmd)
        if m:
            manifest = self._weights_at(m.group(1))
            if manifest is None:
                return True, ["", "--rigfleet-listing--"]
            listing = [f"{n}\t{f['size']}\t{f['mtime']}" for n, f in manifest["files"].items()]
            return True, [json.dumps(manifest), "--rigfleet-listing--", *listing]
        m = re.match(r"for e in (\S+)/\* ", cmd)
        if m:
            return True, self._weights_listing(m.group(1), cmd)
        m = re.match(r"cat (\S+) 2>/dev/null \|\| true$", cmd)
        if m:
            return True, self._text(m.group(1))
        if cmd.startswith("cat /run/rigfleet/boot-marker"):
            return True, [self.boot_marker] if self.boot_marker else []
        if "import vllm; print(vllm.__version__)" in cmd:
            return True, [self.vllm_version]
        if "rigfleet-genesis-inspect.py" in cmd and cmd.startswith("python3"):
            return True, [json.dumps(self._genesis_report())]
        return None

    def _weights_at(self, path: str) -> dict | None:
        entry = self.weights.get(path)
        if isinstance(entry, str):  # a link, relative to its directory
            entry = self.weights.get(f"{path.rsplit('/', 1)[0]}/{entry}")
        return entry if isinstance(entry, dict) else None

    def _weights_listing(self, model_dir: str, cmd: str) -> list[str]:
        """The ``WeightsDirs`` fact: entries of ``model_dir`` and what compose files name."""
        out = []
        for path, entry in sorted(self.weights.items()):
            parent, _, name = path.rpartition("/")
            if parent != model_dir or (name.startswith(".") and not name.endswith(".partial")):
                continue
            if isinstance(entry, str):
                out.append(f"link 1700000000 {name} {entry}")
            else:
                out.append(f"dir {int(entry.get('at', 1700000000))} {name}")
        if "grep -oE" in cmd:
            files = re.findall(r"(/\S+\.yaml)", cmd.split("| grep")[0])
            pattern = re.compile(rf"\s{re.escape(model_dir)}/([^/\s:]+):")
            refs = {r for f in files for r in pattern.findall(
                self.files.get(f, b"").decode())}
            out += [f"ref {r}" for r in sorted(refs)]
        return out

    def _genesis_marker(self) -> str:
        from rigfleet.genesis_inspect import GENERATIONS

        return GENERATIONS[self.genesis_layout].check_file

    def _genesis_report(self) -> dict:
        """What rigfleet-genesis-inspect.py prints for the exported tree (its schema)."""
        from rigfleet.catalog import builtin_catalog
        from rigfleet.genesis_inspect import GENERATIONS, SCHEMA

        files = GENERATIONS[self.genesis_layout]
        switches = self.genesis_switches
        if switches is None:
            switches = {name: "experimental" for spec in builtin_catalog().stacks.values()
                        if spec.genesis for on, off in spec.genesis.switches.values()
                        for name in (*on, *off)}  # fmt: skip
        pid = {s: re.match(r"PN?[0-9]+[A-Z]?", s).group(0) for s in switches}
        return {
            "schema": SCHEMA, "layout": self.genesis_layout, "markers": [files.check_file],
            "version": None, "version_file": files.version_file, "flags": [], "errors": [],
            "allowlist": {"file": files.allowlist_file, "known_good": self.allowlist,
                          "pending": []},
            "registry": {
                "file": files.registry_file, "patches": len(switches), "lifecycles": {},
                "switch_prefixes": list(files.switch_prefixes),
                "retired_skipped": files.retired_skipped,
                "switches": {s: [[pid[s], lc, "env_flag"]] for s, lc in switches.items()},
                "patch_flags": {pid[s]: [f"GENESIS_ENABLE_{s}", lc, False]
                                for s, lc in switches.items()},
            },
        }  # fmt: skip

    def _text(self, path: str) -> list[str]:
        return self.files[path].decode().splitlines() if path in self.files else []

    def _stat(self, path: str) -> list[str]:
        if path in self.links:
            return [f"user=root group=root mode=lrwxrwxrwx atime=0 mtime=0 ctime=0 size=34 "
                    f"'{path}' -> '{self.links[path]}'"]
        if path in self.files:
            mode = _mode(self.modes[path])
            sym = "-" + "".join(_SYMBOLIC[d] for d in mode[1:])
            size = len(self.files[path])
        elif path in self.dirs:
            sym = "d" + "".join(_SYMBOLIC[d] for d in _mode(self.dirs[path])[1:])
            size = 4096
        else:
            return []
        return [f"user=root group=root mode={sym} atime=0 mtime=0 ctime=0 size={size} '{path}'"]

    # --- actions ---------------------------------------------------------------------------

    def _actions(self, cmd: str) -> tuple[bool, list[str]] | None:
        m = re.match(r"haproxy -c -q -f (\S+) \|\| \{ rf_rc=\$\?; rm -f (\S+);", cmd)
        if m:  # roles.ops.checked_file: the staged copy checked, removed when refused
            if self.haproxy_refuses is None:
                return True, []
            self.files.pop(m.group(2), None)
            return False, [self.haproxy_refuses]
        m = re.match(r"mv -f (\S+) (\S+)$", cmd)
        if m and m.group(1) in self.files:
            self.files[m.group(2)] = self.files.pop(m.group(1))
            self.modes[m.group(2)] = self.modes.pop(m.group(1), "0644")
            return True, []
        m = re.match(r"chown root:root (\S+) && chmod (\d+) (\S+)$", cmd)
        if m:
            self.modes[m.group(1)] = _mode(m.group(2))
            return True, []
        m = re.match(r"systemctl reload-or-restart (\S+)$", cmd)
        if m:
            self.active.add(f"{m.group(1)}.service")
            return True, []
        if cmd.startswith("printf '%s\\n' ") and cmd.endswith(">&2; exit 1"):
            return False, []
        m = re.search(r"^systemd-run --unit rigfleet-swap-\S+ .* swap --plan (\S+)$", cmd)
        if m:
            self._swap(json.loads(self.files[m.group(1)]))
            return True, []
        m = re.search(r"rigfleet-host.pyz adopt --plan (\S+)$", cmd)
        if m:
            plan = json.loads(self.files[m.group(1)])
            self._promote(plan["desired"], {"result": "not-run"}, "adopt")
            return True, []
        if "rigfleet-host.pyz record --json " in cmd:
            tracked = json.loads(shlex.split(cmd)[4])
            state = json.loads(self.files.get("/var/lib/rigfleet/state.json") or b"{}")
            self.put("/var/lib/rigfleet/state.json", json.dumps({**state, **tracked}).encode())
            self.ledger.append(json.dumps({"event": "pins", **tracked}))
            return True, []
        if "rigfleet-host.pyz maintenance ready" in cmd:
            self.events.append("window ready" + (" (packages)" if "--packages" in cmd else ""))
            if self.pkg_busy:
                return False, [f"not opening the maintenance window: {self.pkg_busy}"]
            return True, []
        m = re.search(r"rigfleet-host.pyz maintenance open --plan (\S+) --step (.+?)"
                      r"(?: --reboot-grace-s (\S+))?$", cmd)
        if m:
            return self._window_open(json.loads(self.files[m.group(1)]), shlex.split(m.group(2))[0])
        if "rigfleet-host.pyz maintenance hold" in cmd:
            self.events.append("window hold")
            return True, []
        m = re.search(r"^systemd-run --unit rigfleet-maint-\S+ .* maintenance close --plan (\S+) "
                      r"--journal-id (\S+) --own(?: --cause (.+))?$", cmd)
        if m:
            self._window_close(json.loads(self.files[m.group(1)]), m.group(2))
            return True, []
        m = re.match(r"chmod (\d+) (\S+) && sync -- \S+ && mv -f -- (\S+) (\S+) && sync -- \S+$",
                     cmd)
        if m:
            self.files[m.group(4)] = self.files.pop(m.group(3))
            self.modes.pop(m.group(3), None)
            self.modes[m.group(4)] = _mode(m.group(1))
            return True, []
        if "rigfleet-host.pyz ensure" in cmd:
            ref = self.active_record["ref"]
            self.containers = {ref["container"]: ("running", ref["config_hash"])}
            self.route = f"{ref['stack']}/{ref['config_hash']}"
            return True, []
        if "apt-cache madison nvidia-driver-cuda" in cmd and self.cuda_offers is not None:
            return self._madison(cmd, self.cuda_offers)
        m = re.search(r"apt-get .* install (.+)$", cmd)
        if m and " --download-only " in cmd:
            self.events.append(f"download {m.group(1)}")
            return True, []
        if m and self.apt_failure:
            return False, [self.apt_failure]
        if m:
            for spec in shlex.split(m.group(1)):
                name, _, version = spec.partition("=")
                self.packages[name] = version or self._default_version(name)
                if name == "nginx":  # Debian's and Ubuntu's package enable the default site
                    self.links["/etc/nginx/sites-enabled/default"] = (
                        "/etc/nginx/sites-available/default")
                if name == "nvidia-kernel-open-dkms":  # DKMS signs with a key of its own
                    self.files.setdefault(self.MOK_CERT, b"DKMS module signing key (DER)")
                    self.modes.setdefault(self.MOK_CERT, "0644")
            return True, []
        m = re.match(r"rm -f (\S+)$", cmd)
        if m:
            path = shlex.split(m.group(1))[0]
            self.links.pop(path, None)
            self.files.pop(path, None)
            return True, []
        if cmd.startswith("apt-mark hold "):
            self.held.update(shlex.split(cmd)[2:])
            return True, []
        m = re.match(
            r"install -d -m 0755 /etc/apt/keyrings && .* install -m 0644 -o root "
            r"-g root \S+ (\S+) && rm",
            cmd,
        )
        if m:
            self.keyrings.add(m.group(1))
            return True, []
        m = re.match(r"mkdir -p (\S+)$", cmd)
        if m:
            self.dirs.setdefault(m.group(1), "0755")
            return True, []
        m = re.match(r"chmod (\d+) (\S+)$", cmd)
        if m:
            if m.group(2) in self.files:
                self.modes[m.group(2)] = _mode(m.group(1))
            else:
                self.dirs[m.group(2)] = _mode(m.group(1))
            return True, []
        m = re.match(r"install -m (\d+) -o root -g root /dev/null (\S+)$", cmd)
        if m:
            self.files[m.group(2)] = b""
            self.modes[m.group(2)] = _mode(m.group(1))
            return True, []
        m = re.match(r"systemctl (start|enable|restart|reload) (\S+)$", cmd)
        if m:
            action, unit = m.groups()
            unit = unit if "." in unit else f"{unit}.service"
            if action == "enable":
                self.enabled.add(unit)
            else:
                self.active.add(unit)
            if unit == "rigfleet-power-caps.service" and action in ("start", "restart"):
                self._apply_power_unit()
            if unit == "docker.service" and action in ("restart", "reload"):
                self._dockerd(action)
            return True, []
        if cmd.startswith("nvidia-ctk runtime configure"):
            config = json.loads(self.files.get("/etc/docker/daemon.json", b"{}") or b"{}")
            config.setdefault("runtimes", {})["nvidia"] = {
                "args": [],
                "path": "nvidia-container-runtime",
            }
            # nvidia-ctk writes its own formatting: tab indentation.
            self.files["/etc/docker/daemon.json"] = json.dumps(config, indent="\t").encode()
            return True, []
        m = re.match(r"mkdir -p /run/rigfleet && echo (\w+) > /run/rigfleet/boot-marker", cmd)
        if m:
            self.boot_marker = m.group(1)
            return True, []
        if "systemctl reboot" in cmd:
            self._reboot()
            return True, []
        m = re.match(r"docker build --quiet --network host -t (\S+) (\S+)$", cmd)
        if m:
            # The labels the Dockerfile the deploy uploaded sets (its LABEL line).
            dockerfile = self.files[f"{m.group(2)}/Dockerfile"].decode()
            label_line = next(ln for ln in dockerfile.splitlines() if ln.startswith("LABEL "))
            pairs = shlex.split(label_line[len("LABEL "):])
            self.built[m.group(1)] = dict(p.split("=", 1) for p in pairs)
            return True, []
        m = re.match(r"docker load -i (\S+); rc=\$\?; rm -f \S+; exit \$rc$", cmd)
        if m and m.group(1) in self.files:  # an archive the deploy uploaded
            out = self.engine.load_tar(self.files.pop(m.group(1)))
            return True, out.splitlines()
        engine = self.engine.apply(cmd)
        if engine is not None:
            return engine
        m = re.match(r"docker compose -p (\S+) -f (\S+) (up|down)", cmd)
        if m:
            _, path, action = m.groups()
            doc = yaml.safe_load(self.files[path])
            service = next(iter(doc["services"].values()))
            name = service["container_name"]
            if action == "up":
                self.containers[name] = ("running", service["labels"]["io.rigfleet.config-hash"])
            else:
                self.containers.pop(name, None)
            return True, []
        if "python3 -m venv /opt/rigfleet/hf-venv" in cmd:
            self.venv_version = re.search(r"huggingface_hub==(\S+)", cmd).group(1).strip("'")
            return True, []
        m = re.search(r"rigfleet-fetch-weights.py fetch --repo (\S+) --revision (\S+) "
                      r"--local-dir (\S+) ", cmd)
        if m:
            self.weights[m.group(3)] = weights_manifest(m.group(1), m.group(2))
            return True, []
        m = re.search(r"rigfleet-fetch-weights.py adopt --repo \S+ --revision \S+ --from (\S+) "
                      r"--to (\S+) ", cmd)
        if m:
            old, new = m.group(1), m.group(2)
            self.weights[new] = self.weights.pop(old)
            self.weights[old] = new.rsplit("/", 1)[1]
            return True, []
        if cmd.startswith("rm -rf -- "):
            for path in shlex.split(cmd)[3:]:
                self.weights.pop(path, None)
            return True, []
        m = re.search(r"git init --quiet \S+ && git -C \S+ remote add origin (\S+)$", cmd)
        if m:
            self.genesis_origin = m.group(1)
            return True, []
        m = re.search(r"remote set-url origin (\S+)$", cmd)
        if m:
            self.genesis_origin = m.group(1)
            return True, []
        m = re.search(r"checkout --quiet --force --detach (\S+)$", cmd)
        if m:
            self.genesis_head = m.group(1)
            return True, []
        m = re.search(r"archive --format=tar (\S+) \|", cmd)
        if m:
            self.genesis_trees[m.group(1)] = len(self.genesis_trees) + 1700000000
            return True, []
        m = re.match(r"rm -rf (/opt/rigfleet/genesis-trees/\S+ ?)+$", cmd)
        if m:
            for path in cmd.split()[2:]:
                self.genesis_trees.pop(path.rsplit("/", 1)[1], None)
            return True, []
        m = re.search(r"printf '%s\\n' (\S+) > (\S+)$", cmd)
        if m:
            self.files[m.group(2)] = (m.group(1) + "\n").encode()
            self.modes[m.group(2)] = "0644"
            return True, []
        m = re.match(r"printf '%s\\n' (.+) >> /var/lib/rigfleet/ledger.jsonl", cmd)
        if m:
            self.ledger.append(shlex.split(m.group(1))[0])
            return True, []
        return None

    # --- the host-side tool -----------------------------------------------------------------

    def _probe(self) -> dict:
        state = self.files.get("/var/lib/rigfleet/state.json")
        bundle = self.files.get("/usr/local/lib/rigfleet/rigfleet-host.pyz")
        status = "none"
        if self.window is not None and self.window["state"] == "failed":
            status = "failed"
        elif self.window is not None and self.window["state"] == "open":
            status = "held" if self.lock and self.lock.get("window") else "abandoned"
        if self.lock_probes is not None:
            self.lock_probes -= 1
            if self.lock_probes < 0:
                self.lock, self.lock_probes = None, None
        return {
            "active": self.active_record,
            "state": json.loads(state) if state else None,
            "lock": self.lock,
            "containers": {n: {"status": st, "hash": h, "stack": n.removeprefix("rigfleet-")}
                           for n, (st, h) in self.containers.items()},
            "route": self.route,
            "bundle": _sha(bundle) if bundle else None,
            "maintenance": {"status": status, "why": (self.window or {}).get("reason", ""),
                            "window": self.window},
        }

    # --- dockerd and the maintenance window -------------------------------------------------

    def _dockerd(self, action: str) -> None:
        """What dockerd does with daemon.json at a restart (everything) or a reload (the
        reloadable keys: runtimes, live-restore; docs.docker.com live-restore, moby reload.go)."""
        config = json.loads(self.files.get("/etc/docker/daemon.json", b"{}") or b"{}")
        if action == "restart":
            self.events.append("docker restart")
            if not self.live_restore:  # the old daemon stops its containers on the way down
                self.containers = {n: ("exited", h) for n, (_, h) in self.containers.items()}
            self.exec_opts = list(config.get("exec-opts") or [])
        self.live_restore = bool(config.get("live-restore"))
        self.runtimes_registered = "nvidia" in config.get("runtimes", {})

    def _window_open(self, plan: dict, step: str) -> tuple[bool, list[str]]:
        if self.lock and self.lock.get("alive") and self.lock.get("window") != plan["id"]:
            return False, [f"locked by {self.lock.get('who')}"]
        if self.window is None or self.window["state"] != "open" \
                or self.window["id"] != plan["id"]:
            self.window = {"id": plan["id"], "state": "open", "steps": [], "reason": ""}
            self.events.append(f"window open {plan['id']}")
        self.window["steps"].append(step)
        self.lock = {"who": plan["by"], "why": f"maintenance: {step}", "window": plan["id"],
                     "alive": True, "pid": 1, "since": "now"}
        self.route = "maintenance"
        self.events.append(f"step {step}")
        return True, []

    def _window_close(self, plan: dict, journal: str) -> None:
        """Recreate the active stack and gate it (or fail as ``close_failure`` says)."""
        ref = (self.active_record or {})["ref"]
        self.events.append(f"window close {journal}")
        self.lock = None
        events = [{"phase": "maintenance", "message": "closing"}]
        if self.close_failure is None:
            self.containers = {ref["container"]: ("running", ref["config_hash"])}
            self.route = f"{ref['stack']}/{ref['config_hash']}"
            self.window = {**(self.window or {"id": plan["id"]}), "state": "closed"}
            self.ledger.append(json.dumps({"event": "maintenance", "result": "closed",
                                           **ref["record"], "gate": {"result": "pass"}}))
            result = {"result": "closed", "exit": 0, "stack": ref["stack"],
                      "serving": self.route, "gate": {"result": "pass"}}
        else:
            phase, reason = self.close_failure
            self.containers = {}
            self.route = "maintenance"
            self.window = {**(self.window or {"id": plan["id"]}), "state": "failed",
                           "reason": reason}
            result = {"result": "failed", "exit": 2, "stack": ref["stack"], "phase": phase,
                      "reason": f"maintenance failed ({phase}): {reason}",
                      "serving": "maintenance"}
        self.swaps[journal] = {"events": events, "result": result}

    def _promote(self, ref: dict, gate: dict, event: str) -> None:
        self.containers = {ref["container"]: ("running", ref["config_hash"])}
        if ref["compose_file"] in self.files:  # the snapshot of what passed (write_active)
            self.put("/var/lib/rigfleet/active/compose.yaml", self.files[ref["compose_file"]])
        self.active_record = {"ref": ref, "gate": gate}
        self.route = f"{ref['stack']}/{ref['config_hash']}"
        state = json.loads(self.files.get("/var/lib/rigfleet/state.json") or b"{}")
        state.update(ref["record"], config_hash=ref["config_hash"], gate=gate)
        self.put("/var/lib/rigfleet/state.json", json.dumps(state).encode())
        self.ledger.append(json.dumps({"event": event, "result": "promoted", **ref["record"],
                                       "gate": gate}))

    def _swap(self, plan: dict) -> None:
        new = plan["desired"]
        events = [{"phase": "plan", "message": f"-> {new['stack']}"}]
        if self.swap_failure is None:
            self._promote(new, {"result": "pass"}, "swap")
            result = {"result": "promoted", "exit": 0, "stack": new["stack"],
                      "serving": self.route, "gate": {"result": "pass"}}
        else:
            phase, reason = self.swap_failure
            old = (self.active_record or {}).get("ref")
            result = {"result": "rolled-back" if old else "failed", "exit": 1 if old else 2,
                      "stack": new["stack"], "phase": phase, "reason": reason,
                      "serving": self.route if old else "maintenance",
                      "gate": {"result": "fail"} if phase == "gate" else None}
            events.append({"phase": "rollback", "message": reason})
        self.swaps[plan["id"]] = {"events": events, "result": result}

    @staticmethod
    def _madison(cmd: str, versions: list[str]) -> tuple[bool, list[str]]:
        """Runs the command itself in sh, with an apt-cache that prints ``versions``."""
        with tempfile.TemporaryDirectory() as shim:
            tool = Path(shim) / "apt-cache"
            tool.write_text("#!/bin/sh\n" + "".join(
                f"echo 'nvidia-driver-cuda | {v} | http://repo/ Packages'\n" for v in versions))
            tool.chmod(0o755)
            proc = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True,
                                  env={"PATH": f"{shim}:{os.environ['PATH']}"})
        return proc.returncode == 0, (proc.stdout + proc.stderr).splitlines()

    def _default_version(self, name: str) -> str:
        if "nvidia" in name and "container" not in name:
            return f"{DRIVER_VERSION}-1"
        return "1.0-1"

    def _apply_power_unit(self) -> None:
        unit = self.files.get("/etc/systemd/system/rigfleet-power-caps.service", b"").decode()
        for index, watts in re.findall(r"nvidia-smi -i (\d+) -pl (\d+)", unit):
            gpu = self.gpus[int(index)]
            if not gpu.minimum <= float(watts) <= gpu.maximum:
                raise AssertionError(f"nvidia-smi would refuse {watts} W on card {index}")
            gpu.limit = float(watts)

    def _reboot(self) -> None:
        self.reboots += 1
        self.events.append("reboot")
        # A reboot stops every container; dockerd starts with daemon.json as it is.
        self.containers = {n: ("exited", h) for n, (_, h) in self.containers.items()}
        config = json.loads(self.files.get("/etc/docker/daemon.json", b"{}") or b"{}")
        self.live_restore = bool(config.get("live-restore"))
        self.exec_opts = list(config.get("exec-opts") or [])
        self.boot_marker = None
        self.journal = []
        driver = [
            v
            for n, v in self.packages.items()
            if n in ("nvidia-driver-cuda", "nvidia-driver-580-server-open")
        ]
        self.driver_loaded = driver[0].split("-")[0] if driver else None
        if self.driver_loaded and self._dkms_module_refused():
            # What the kernel and udev log when Secure Boot refuses the module.
            self.driver_loaded = None
            self.journal = [
                "kernel: Loading of module with unavailable key is rejected",
                "systemd-udevd[312]: nvidia: Failed to insert module 'nvidia': Key was "
                "rejected by service",
            ]
        for gpu in self.gpus:
            gpu.limit = 350.0
        if "rigfleet-power-caps.service" in self.enabled:
            self._apply_power_unit()
        self.active = {u for u in self.enabled}
