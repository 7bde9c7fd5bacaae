"""Stand-in ``nvidia-ctk`` (NVIDIA Container Toolkit CLI), the parts a deploy uses.

``runtime configure --runtime=docker [--config=PATH] [--set-as-default] [--dry-run]`` merges the
``nvidia`` runtime into Docker's daemon.json and keeps every other key, writing the file the way
the Go tool does (keys sorted, 4-space indent), so running it again changes nothing. Log lines go
to stderr in logrus' format: ``INFO[0000] ...`` on a terminal, ``time=... level=info msg=...``
otherwise (over ssh without a tty, as pyinfra runs it)::

    nvidia-ctk runtime configure --runtime=docker
    nvidia-ctk --version
    nvidia-ctk cdi list
    nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml [--format=yaml|json]
    nvidia-ctk system create-dev-char-symlinks [--create-all] [--dev-char-path=/dev/char]

``cdi generate`` writes a CDI spec (kind ``nvidia.com/gpu``, devices ``0``.., the GPU UUIDs and
``all``) from the loaded driver, as the real one does from NVML: the control and GPU device
nodes, ``NVIDIA_VISIBLE_DEVICES=void`` (so the legacy hook leaves CDI containers alone), and as
mounts what stands in for the driver's files (``/run/nvidia-sim``, ``/usr/bin/nvidia-smi``).
With Docker's CDI support (``features.cdi`` in daemon.json, ``--device nvidia.com/gpu=all``) the
devices are then in the OCI spec, so runc and systemd know them (``devnodes``).
``system create-dev-char-symlinks`` makes ``/dev/char/M:m`` links to the NVIDIA nodes and logs
each one, warning about links that exist (nvidia-container-toolkit#48's udev-rule command).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

if __package__:
    from . import devnodes
    from . import simstate as sim
else:  # inside the zipapp on a simulated host
    import devnodes  # type: ignore[no-redef]
    import simstate as sim  # type: ignore[no-redef]

DOCKER_CONFIG = "/etc/docker/daemon.json"
RUNTIME_NAME = "nvidia"
RUNTIME_PATH = "nvidia-container-runtime"
CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")


class CtkError(Exception):
    """A failure reported as an ERROR log line, exit 1."""


class Logger:
    """logrus' TextFormatter, enough to look the same: colours and padding on a tty only."""

    _COLOURS = {"info": 36, "warning": 33, "error": 31}

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.start = time.time()

    def _emit(self, level: str, msg: str) -> None:
        if self.stream.isatty():
            tag = level.upper()[:4]
            secs = int(time.time() - self.start)
            line = f"\x1b[{self._COLOURS[level]}m{tag}\x1b[0m[{secs:04d}] {msg:<44} "
        else:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            line = f'time="{stamp}" level={level} msg={json.dumps(msg)}'
        print(line, file=self.stream, flush=True)

    def info(self, msg: str) -> None:
        self._emit("info", msg)

    def warning(self, msg: str) -> None:
        self._emit("warning", msg)

    def error(self, msg: str) -> None:
        self._emit("error", msg)


def merge_docker_config(config: dict[str, Any], set_as_default: bool = False) -> dict[str, Any]:
    """daemon.json with the nvidia runtime added; every other key kept as it was."""
    merged = dict(config)
    runtimes = dict(merged.get("runtimes") or {})
    runtimes[RUNTIME_NAME] = {"args": [], "path": RUNTIME_PATH}
    merged["runtimes"] = runtimes
    if set_as_default:
        merged["default-runtime"] = RUNTIME_NAME
    return merged


def render_config(config: dict[str, Any]) -> str:
    # Go's json.MarshalIndent(cfg, "", "    ") of a map: sorted keys, no trailing newline.
    return json.dumps(config, indent=4, sort_keys=True, ensure_ascii=False)


def configure_docker(path: Path, log: Logger, *, set_as_default: bool = False,
                     dry_run: bool = False, out: TextIO = sys.stdout) -> None:
    if path.exists():
        log.info(f"Loading config from {path}")
        try:
            text = path.read_text()
            config = json.loads(text) if text.strip() else {}
        except (OSError, ValueError) as exc:
            raise CtkError(f"unable to load config for runtime docker: {exc}") from exc
        if not isinstance(config, dict):
            raise CtkError("unable to load config for runtime docker: not a JSON object")
    else:
        log.info("Config file does not exist; using empty config")
        config = {}
    rendered = render_config(merge_docker_config(config, set_as_default))
    if dry_run:
        out.write(rendered + "\n")
        return
    # The twin's record of what the running dockerd read at start (its exec-opts stay).
    devnodes.remember_dockerd_config(sim.SimPaths.from_env())
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(rendered)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    log.info(f"Wrote updated config to {path}")
    log.info("It is recommended that docker daemon be restarted.")


def cdi_list(log: Logger, out: TextIO, spec_dirs: Sequence[str] = CDI_SPEC_DIRS) -> None:
    """List devices of CDI specs: JSON ones, and YAML ones in the shape ``cdi generate`` writes."""
    devices: list[str] = []
    for d in spec_dirs:
        for spec in sorted(p for p in Path(d).glob("*") if p.suffix in (".json", ".yaml")):
            try:
                text = spec.read_text()
                raw = json.loads(text) if spec.suffix == ".json" else _read_own_yaml(text)
            except (OSError, ValueError):
                continue
            kind = raw.get("kind", "")
            devices += [f"{kind}={dev.get('name')}" for dev in raw.get("devices", [])]
    log.info(f"Found {len(devices)} CDI devices")
    for name in devices:
        out.write(name + "\n")


CDI_VERSION = "0.5.0"
CDI_KIND = "nvidia.com/gpu"


def cdi_spec(paths: sim.SimPaths, hw: sim.Hardware) -> dict[str, Any]:
    """The CDI spec of this host's GPUs (what ``cdi generate`` writes)."""
    def nodes(names: Sequence[str]) -> list[dict[str, str]]:
        return [{"path": str(paths.dev / n)} for n in names]

    per_gpu = [(str(g.index), g.uuid, devnodes.gpu_node(g.index).name) for g in hw.gpus]
    devices = [{"containerEdits": {"deviceNodes": nodes([node])}, "name": name}
               for index, uuid, node in per_gpu for name in (index, uuid)]
    devices.append({"containerEdits": {"deviceNodes": nodes([n for _, _, n in per_gpu])},
                    "name": "all"})
    return {
        "cdiVersion": CDI_VERSION,
        "containerEdits": {
            "deviceNodes": nodes([n.name for n in devnodes.CONTROL_NODES]),
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "mounts": [
                {"containerPath": sim.DEFAULT_ROOT, "hostPath": str(paths.root),
                 "options": ["rbind", "rw"]},
                {"containerPath": "/usr/bin/nvidia-smi", "hostPath": "/usr/bin/nvidia-smi",
                 "options": ["ro", "nosuid", "nodev", "bind"]},
            ],
        },
        "devices": devices,
        "kind": CDI_KIND,
    }


def _yaml(value: Any, indent: int = 0) -> list[str]:
    """Block YAML for the dict/list/str trees of a CDI spec (keys as given, strings quoted)."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, (dict, list)):
                lines.append(f"{pad}{key}:")
                lines += _yaml(item, indent + (0 if isinstance(item, list) else 2))
            else:
                lines.append(f"{pad}{key}: {json.dumps(item)}")
    else:
        for item in value:
            sub = _yaml(item, indent + 2) if isinstance(item, (dict, list)) \
                else [f"{pad}  {json.dumps(item)}"]
            lines.append(f"{pad}- {sub[0].strip()}")
            lines += sub[1:]
    return lines


def render_cdi(spec: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(spec, indent=2) + "\n"
    return "---\n" + "\n".join(_yaml(spec)) + "\n"


def _read_own_yaml(text: str) -> dict[str, Any]:
    """kind and device names of a spec in the shape :func:`render_cdi` writes."""
    kind, names, in_devices = "", [], False
    for line in text.splitlines():
        if line.startswith("kind:"):
            kind = json.loads(line.split(":", 1)[1].strip())
        in_devices = line.startswith("devices:") or (in_devices and line.startswith((" ", "-")))
        if in_devices and line.strip().startswith(("name:", "- name:")) and \
                line.startswith(("- ", "  name:")):
            names.append(json.loads(line.split("name:", 1)[1].strip()))
    return {"kind": kind, "devices": [{"name": n} for n in names]}


def cdi_generate(log: Logger, out: TextIO, output: str | None, fmt: str | None) -> None:
    paths = sim.SimPaths.from_env()
    loaded = sim.loaded_version(paths)
    if loaded is None:
        raise CtkError("failed to generate CDI spec: failed to create device CDI specs: failed to "
                       "initialize NVML: ERROR_DRIVER_NOT_LOADED")
    fmt = fmt or ("json" if output and output.endswith(".json") else "yaml")
    if fmt not in ("yaml", "json"):
        raise CtkError(f"invalid output format: {fmt}")
    try:
        hw = sim.load_hardware(paths.hardware)
    except sim.SimError as exc:
        raise CtkError(f"failed to generate CDI spec: {exc}") from exc
    log.info(f"Using driver version {loaded}")
    spec = cdi_spec(paths, hw)
    for node in spec["containerEdits"]["deviceNodes"] + spec["devices"][-1]["containerEdits"][
            "deviceNodes"]:
        log.info(f"Selecting {node['path']} as {node['path']}")
    text = render_cdi(spec, fmt)
    if output:
        target = Path(output)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    else:
        out.write(text)
    log.info(f"Generated CDI spec with version {CDI_VERSION}")


def create_dev_char_symlinks(log: Logger, create_all: bool, dev_char: str | None) -> None:
    paths = sim.SimPaths.from_env()
    char_dir = Path(dev_char) if dev_char else paths.dev / "char"
    if create_all:
        if sim.loaded_version(paths) is None:
            raise CtkError("error creating symlink creator: failed to create NVIDIA device "
                           "nodes: failed to load NVIDIA kernel modules: driver not loaded")
        devnodes.create_host_nodes(paths.dev, sim.load_hardware(paths.hardware), log.error)
    char_dir.mkdir(parents=True, exist_ok=True)
    for name in sorted(p.name for p in paths.dev.glob("nvidia*")):
        node = paths.dev / name
        try:
            rdev = node.stat().st_rdev
        except OSError:
            continue
        link = char_dir / f"{os.major(rdev)}:{os.minor(rdev)}"
        log.info(f"Creating link {link} => {node}")
        try:
            link.symlink_to(node)
        except FileExistsError:
            log.warning(f"Could not create symlink: symlink {node} {link}: file exists")


def _option(args: list[str], name: str) -> tuple[str | None, list[str]]:
    """Pop ``--name=value`` or ``--name value`` (urfave/cli accepts both, and one dash)."""
    rest: list[str] = []
    value = None
    i = 0
    while i < len(args):
        a = args[i]
        bare = a.lstrip("-")
        if a.startswith("-") and bare.split("=", 1)[0] == name:
            if "=" in bare:
                value = bare.split("=", 1)[1]
            elif i + 1 < len(args):
                i += 1
                value = args[i]
            else:
                raise CtkError(f"flag needs an argument: -{name}")
        else:
            rest.append(a)
        i += 1
    return value, rest


def _flag(args: list[str], name: str) -> tuple[bool, list[str]]:
    rest = [a for a in args if a.lstrip("-") != name]
    return len(rest) != len(args), rest


def _options(args: list[str], values: Sequence[str] = (),
             flags: Sequence[str] = ()) -> dict[str, Any]:
    """A subcommand's options by name (None/False when absent); anything else is an error."""
    found: dict[str, Any] = {}
    for name in values:
        found[name], args = _option(args, name)
    for name in flags:
        found[name], args = _flag(args, name)
    if args:
        raise CtkError(f"flag provided but not defined: {args[0]}")
    return found


def version_text(version: str) -> str:
    # The real binary prints its git commit; a stand-in has none, so this one is derived.
    commit = hashlib.sha1(f"nvidia-container-toolkit {version}".encode()).hexdigest()
    return f"NVIDIA Container Toolkit CLI version {version}\ncommit: {commit}\n"


def main(argv: Sequence[str] | None = None, *, version: str = "1.17.8",
         out: TextIO | None = None, err: TextIO | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    stdout, log = out or sys.stdout, Logger(err or sys.stderr)
    try:
        if not args or args[0] in ("-h", "--help", "help"):
            stdout.write("NAME:\n   NVIDIA Container Toolkit CLI - Tools to configure the NVIDIA "
                         "Container Toolkit\n\nCOMMANDS:\n   runtime  A collection of runtime-"
                         "related utilities for the NVIDIA Container Toolkit\n   cdi      "
                         "Provide tools for interacting with Container Device Interface specs\n")
            return 0
        if args[0] in ("-v", "--version", "version"):
            stdout.write(version_text(version))
            return 0
        if args[:2] == ["runtime", "configure"]:
            rest = args[2:]
            runtime, rest = _option(rest, "runtime")
            config, rest = _option(rest, "config")
            set_default, rest = _flag(rest, "set-as-default")
            dry_run, rest = _flag(rest, "dry-run")
            if rest:
                raise CtkError(f"flag provided but not defined: {rest[0]}")
            runtime = runtime or "docker"
            if runtime != "docker":
                raise CtkError(f"unrecognized runtime '{runtime}'")
            configure_docker(Path(config or DOCKER_CONFIG), log, set_as_default=set_default,
                             dry_run=dry_run, out=stdout)
            return 0
        if args[:2] == ["cdi", "list"]:
            cdi_list(log, stdout)
            return 0
        if args[:2] == ["cdi", "generate"]:
            opts = _options(args[2:], values=("output", "format"))
            cdi_generate(log, stdout, opts["output"], opts["format"])
            return 0
        if args[:2] == ["system", "create-dev-char-symlinks"]:
            opts = _options(args[2:], values=("dev-char-path",), flags=("create-all",))
            create_dev_char_symlinks(log, bool(opts["create-all"]), opts["dev-char-path"])
            return 0
        stdout.write(f"No help topic for '{' '.join(args)}'\n")
        return 3
    except CtkError as exc:
        log.error(str(exc))
        return 1
