"""Stand-in ``nvidia-ctk`` (NVIDIA Container Toolkit CLI), the parts a deploy uses.

``runtime configure --runtime=docker [--config=PATH] [--set-as-default] [--dry-run]`` merges the
``nvidia`` runtime into Docker's daemon.json and keeps every other key, writing the file the way
the Go tool does (keys sorted, 4-space indent), so running it again changes nothing. Log lines go
to stderr in logrus' format: ``INFO[0000] ...`` on a terminal, ``time=... level=info msg=...``
otherwise (over ssh without a tty, as pyinfra runs it)::

    nvidia-ctk runtime configure --runtime=docker
    nvidia-ctk --version
    nvidia-ctk cdi list
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
    """List devices of JSON CDI specs (YAML specs are not read by this stand-in)."""
    devices: list[str] = []
    for d in spec_dirs:
        for spec in sorted(Path(d).glob("*.json")):
            try:
                raw = json.loads(spec.read_text())
            except (OSError, ValueError):
                continue
            kind = raw.get("kind", "")
            devices += [f"{kind}={dev.get('name')}" for dev in raw.get("devices", [])]
    log.info(f"Found {len(devices)} CDI devices")
    for name in devices:
        out.write(name + "\n")


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
        stdout.write(f"No help topic for '{' '.join(args)}'\n")
        return 3
    except CtkError as exc:
        log.error(str(exc))
        return 1
