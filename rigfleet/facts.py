"""Custom pyinfra facts: one command each, which succeeds when the thing is absent (absence is
data); the roles read them through ``read_fact``, once while nothing changed on the host::

    state = read_fact(GpuQuery)
    state.loaded, state.driver_version   # True, "580.105.08"
"""

from __future__ import annotations

import json
import posixpath
import shlex
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from functools import partial
from itertools import groupby
from typing import Any, TypeVar

from pyinfra import host
from pyinfra.api import FactBase
from pyinfra.facts.files import Directory, File, Link, Sha1File
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus
from typing_extensions import override

from rigfleet import genesis_inspect, gpu
from rigfleet.commands import apt as apt_commands
from rigfleet.commands import hosttool
from rigfleet.commands import nvidia as nvidia_commands
from rigfleet.factmemo import fact_key, prime, read_host_once
from rigfleet.hostprobe import last_json
from rigfleet.hostside.layout import MANIFEST_NAME
from rigfleet.hostside.records import weights_mismatch
from rigfleet.pins import HEX40

T = TypeVar("T")


def read_fact(fact: type[FactBase[T]], fresh: bool = False, **kwargs: Any) -> T:
    """``host.get_fact``, asked once while nothing changed on the host (``fresh``: ask again)."""
    read_host_once()
    return host.get_fact(fact, _rigfleet_fresh=fresh, **kwargs)


SERVICE_PROPERTIES = ("SubState", "ActiveState", "UnitFileState")


class ServiceStates(FactBase[dict[str, dict[str, str]]]):
    """``systemctl show`` of several units: unit -> {property: value} (``SERVICE_PROPERTIES``)."""

    default = dict

    @override
    def command(self, units: tuple[str, ...]) -> str:
        props = " ".join(f"--property {p}" for p in ("Id", *SERVICE_PROPERTIES))
        return f"systemctl show {props} {shlex.join(units)} || true"

    @override
    def process(self, output: list[str]) -> dict[str, dict[str, str]]:
        units: dict[str, dict[str, str]] = {}
        for keyed, lines in groupby(output, lambda line: "=" in line):  # a unit's block
            block = dict(line.strip().partition("=")[::2] for line in lines)
            if keyed and block.get("Id"):
                units[block["Id"]] = {k: block.get(k, "") for k in SERVICE_PROPERTIES}
        return units


class UnitActive(FactBase[bool]):
    default = bool

    @override
    def command(self, unit: str) -> str:
        return f"systemctl is-active {unit} 2>/dev/null || true"

    @override
    def process(self, output: list[str]) -> bool:
        return bool(output) and output[-1].strip() == "active"


def read_services(units: tuple[str, ...]) -> None:
    """Prime ``SystemdStatus``, ``SystemdEnabled`` and ``UnitActive`` of ``units`` from one read."""
    systemd_args = {"user_mode": False, "machine": None, "user_name": None}
    for unit, props in read_fact(ServiceStates, units=units).items():
        for fact in (SystemdStatus, SystemdEnabled):
            value = fact().process([f"Id={unit}", f"{fact.state_key}={props[fact.state_key]}"])
            prime(host, fact_key(fact, services=[unit], **systemd_args), value)
        prime(host, fact_key(UnitActive, unit=unit), props["ActiveState"] == "active")


_PATH_MARK = "##rigfleet-path##"
_SECTIONS = ("##rigfleet-stat##", "##rigfleet-sha1##", "##rigfleet-sha256##")
# pyinfra's own ``File`` stat line (``LINUX_STAT_COMMAND``), after the name and the mode,
# owner and group our ``FileDigest`` gives: one ``stat`` for every path.
_STAT_FORMAT = r"%n\t%a %U %G\tuser=%U group=%G mode=%A atime=%X mtime=%Y ctime=%Z size=%s %N\n"


class PathStates(FactBase[dict[str, list[list[str]]]]):
    """Paths -> the outputs ``File``, ``Sha1File`` and ``FileDigest`` would each give alone,
    from one ``stat``, ``sha1sum`` and ``sha256sum`` for all (a fork per path was slow)."""

    default = dict

    @override
    def command(self, paths: tuple[str, ...]) -> str:
        quoted = shlex.join(paths)
        marks = shlex.join(_PATH_MARK + p for p in paths)
        stat, sha1, sha256 = _SECTIONS

        def files(test: str, tool: str) -> str:  # builtins only, then one tool for all
            return (f"set --; for p in {quoted}; do if {test}; then set -- \"$@\" \"$p\"; fi; "
                    f"done; [ $# -eq 0 ] || {tool} -- \"$@\" 2>/dev/null")

        return "; ".join([
            f"printf '%s\\n' {marks}",
            f"echo {shlex.quote(stat)}",
            f"stat --printf {shlex.quote(_STAT_FORMAT)} -- {quoted} 2>/dev/null",
            # Sha1File: not a directory, and there (a link: its target); FileDigest: a file
            f"echo {shlex.quote(sha1)}", files('[ ! -d "$p" ] && [ -e "$p" ]', "sha1sum"),
            f"echo {shlex.quote(sha256)}", files('[ -f "$p" ]', "sha256sum"),
            "true"])

    @override
    def process(self, output: list[str]) -> dict[str, list[list[str]]]:
        paths = [line[len(_PATH_MARK):] for line in output if line.startswith(_PATH_MARK)]
        section = ""
        stat: dict[str, tuple[str, str]] = {}
        sha1: dict[str, str] = {}
        sha256: dict[str, str] = {}
        for line in output:
            if line in _SECTIONS:
                section = line
            elif section == _SECTIONS[0] and line.count("\t") >= 2:
                path, perms, rest = line.split("\t", 2)
                stat[path] = (perms, rest)
            elif section == _SECTIONS[1] and "  " in line:
                sha1[line.split("  ", 1)[1]] = line  # Sha1File reads sha1sum's own line
            elif section == _SECTIONS[2] and "  " in line:
                digest, path = line.split("  ", 1)
                sha256[path] = digest
        return {p: [[stat[p][1]] if p in stat else [], [sha1[p]] if p in sha1 else [],
                    [stat[p][0], sha256[p]] if p in stat and p in sha256 else [], []]
                for p in paths}


def read_paths(paths: Iterable[str]) -> None:
    """Prime the path facts of ``paths`` and their directories from one read (``path_answers``)."""
    wanted = tuple(dict.fromkeys(q for p in paths for q in (posixpath.dirname(p), p) if q))
    for path, outputs in read_fact(PathStates, paths=wanted).items():
        for fact, value in path_answers(path, outputs).items():
            prime(host, fact_key(fact, path=path), value)


def path_answers(path: str, outputs: list[list[str]]) -> dict[type[FactBase[Any]], Any]:
    """The path facts of ``path`` from its ``PathStates`` outputs ({} when incomplete)."""
    if len(outputs) != 4:  # three answers and the mark after the last
        return {}
    stat, sha1, digest = outputs[:3]
    answers: dict[type[FactBase[Any]], Any] = {}
    for fact, lines in ((File, stat), (Directory, stat), (Link, stat), (Sha1File, sha1),
                        (FileDigest, digest)):
        one = fact()
        one.command(path=path)  # as pyinfra does: a fact's process may use its arguments
        answers[fact] = one.process(lines) if lines else one.default()
    return answers


class OsRelease(FactBase[dict[str, str]]):
    """``/etc/os-release`` as a dict, plus ``KERNEL_RELEASE`` (``uname -r``)."""

    default = dict

    @override
    def command(self) -> str:
        return "cat /etc/os-release; echo KERNEL_RELEASE=$(uname -r)"

    @override
    def process(self, output: list[str]) -> dict[str, str]:
        info: dict[str, str] = {}
        for line in output:
            key, sep, value = line.strip().partition("=")
            if not sep or not key or key.startswith("#"):
                continue
            parts = [value.strip("\"'")]
            with suppress(ValueError):
                parts = shlex.split(value)
            info[key] = parts[0] if parts else ""
        return info


@dataclass(frozen=True)
class DebPackage:
    version: str
    installed: bool
    held: bool


class DpkgState(FactBase[dict[str, DebPackage]]):
    """Every package dpkg knows: version, installed or not, held or not (one ``dpkg-query``)."""

    default = dict

    @override
    def command(self) -> str:
        return "dpkg-query -W -f='${Package}\\t${Version}\\t${Status}\\n' 2>/dev/null || true"

    @override
    def process(self, output: list[str]) -> dict[str, DebPackage]:
        packages: dict[str, DebPackage] = {}
        for line in output:
            match line.split("\t"):
                case [name, version, status] if name:
                    words = status.split() or [""]
                    installed = words[-1] == "installed"
                    # Multi-arch packages appear once per architecture; an installed one wins.
                    if installed or not (name in packages and packages[name].installed):
                        packages[name] = DebPackage(version, installed, held=words[0] == "hold")
        return packages


class AptKeyring(FactBase[str]):
    """``same``, ``differ`` or ``missing``: the installed keyring vs the key at its URL."""

    @override
    def command(self, key_url: str, dest: str) -> str:
        return apt_commands.keyring_state(key_url, dest)

    @override
    def process(self, output: list[str]) -> str:
        last = output[-1].strip() if output else "missing"
        return last if last in ("same", "differ", "missing") else "missing"


class TextFile(FactBase[str | None]):
    """A small text file's content, or None when it is missing or empty."""

    @override
    def command(self, path: str) -> str:
        return f"cat {shlex.quote(path)} 2>/dev/null || true"

    @override
    def process(self, output: list[str]) -> str | None:
        text = "\n".join(output)
        return text if text.strip() else None


@dataclass(frozen=True)
class GpuState:
    """What nvidia-smi says: the driver answers, its version, the cards (``gpu.GpuInfo``)."""

    loaded: bool
    driver_version: str | None = None
    gpus: tuple[gpu.GpuInfo, ...] = ()
    error: str = ""


SMI_FAILED = "RIGFLEET-NVIDIA-SMI-FAILED"


class GpuQuery(FactBase[GpuState]):
    default = partial(GpuState, loaded=False, error="no output")

    @override
    def command(self) -> str:
        return (f"out=$({gpu.query_command()} 2>&1) && printf '%s\\n' \"$out\" "
                f"|| {{ echo {SMI_FAILED}; printf '%s\\n' \"$out\" | tail -n 3; }}")

    @override
    def process(self, output: list[str]) -> GpuState:
        if not output or output[0].strip() == SMI_FAILED:
            return GpuState(loaded=False, error=" ".join(line.strip() for line in output[1:]))
        try:
            gpus = tuple(gpu.parse_query_gpu("\n".join(output)))
        except gpu.GpuParseError as e:  # DriverNotLoadedError included
            return GpuState(loaded=False, error=str(e))
        if not gpus:
            return GpuState(loaded=False, error="nvidia-smi listed no GPUs")
        versions = {g.driver_version for g in gpus if g.driver_version}
        return GpuState(loaded=True, driver_version=min(versions) if versions else None, gpus=gpus)


@dataclass(frozen=True)
class PlatformState:
    """Init, architecture, Secure Boot, DKMS's key (``mok``: ``enrolled``, ``pending`` for the
    next boot, ``not-enrolled``, ``unknown``) and the dpkg package owning nvidia-smi."""

    pid1: str = ""
    systemd: bool = False
    arch: str = ""
    secure_boot: str = "unknown"
    mok_cert: str = ""
    mok: str = "unknown"
    run_uninstaller: bool = False
    smi: str = ""
    smi_owner: str = ""

    @property
    def foreign_driver(self) -> bool:
        """A driver no distribution package installed (NVIDIA's .run installer, or unknown)."""
        return self.run_uninstaller or bool(self.smi and not self.smi_owner)


class Platform(FactBase[PlatformState]):
    """``commands.nvidia.PLATFORM_REPORT``'s ``key=value`` lines."""

    default = PlatformState

    @override
    def command(self) -> str:
        return nvidia_commands.PLATFORM_REPORT

    @override
    def process(self, output: list[str]) -> PlatformState:
        values: dict[str, list[str]] = {}
        for line in output:
            key, sep, value = line.strip().partition("=")
            if sep:
                values.setdefault(key, []).append(value.strip())
        one = {key: found[0] for key, found in values.items()}
        sb_detail = " ".join(values.get("sb", []))
        no_mokutil = "mokutil" in values and not sb_detail
        return PlatformState(
            **{key: one.get(key, "") for key in ("pid1", "arch", "mok_cert", "smi", "smi_owner")},
            systemd=one.get("systemd") == "yes",
            secure_boot="unknown" if no_mokutil else _state(sb_detail, _SECURE_BOOT),
            mok=_state(" ".join(values.get("mok", [])), _MOK) if one.get("mok_cert") else "unknown",
            run_uninstaller=one.get("run_uninstaller") == "yes",
        )


# What mokutil prints (--sb-state, then --test-key <der>), first match wins.
_SECURE_BOOT = (("SecureBoot enabled", "enabled"), ("SecureBoot disabled", "disabled"),
                ("not supported", "unsupported"), ("doesn't support", "unsupported"))
_MOK = (("already enrolled", "enrolled"), ("enrollment request", "pending"),
        ("not enrolled", "not-enrolled"))


def _state(text: str, table: tuple[tuple[str, str], ...]) -> str:
    return next((state for needle, state in table if needle in text), "unknown")


class ModuleRejections(FactBase[list[str]]):
    """This boot's log lines saying Secure Boot refused a kernel module (empty: none)."""

    default = list

    @override
    def command(self) -> str:
        return nvidia_commands.MODULE_REJECTIONS

    @override
    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if line.strip()]


@dataclass(frozen=True)
class DaemonConfig:
    """``/etc/docker/daemon.json``: exists, its content, or why it is unreadable."""

    exists: bool = False
    config: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


class DockerDaemonJson(FactBase[DaemonConfig]):
    path = "/etc/docker/daemon.json"
    default = DaemonConfig

    @override
    def command(self) -> str:
        return f"cat {self.path} 2>/dev/null || true"

    @override
    def process(self, output: list[str]) -> DaemonConfig:
        text = "\n".join(output).strip()
        if not text:
            return DaemonConfig()
        try:
            config = json.loads(text)
        except ValueError as e:
            return DaemonConfig(exists=True, error=f"{self.path} is not valid JSON ({e})")
        if not isinstance(config, dict):
            return DaemonConfig(exists=True, error=f"{self.path} is not a JSON object")
        return DaemonConfig(exists=True, config=config)


class DockerRuntimes(FactBase[list[str]]):
    """Names of the runtimes the running Docker daemon has registered (``docker info``)."""

    default = list

    @override
    def command(self) -> str:
        return "docker info --format '{{json .Runtimes}}' 2>/dev/null || true"

    @override
    def process(self, output: list[str]) -> list[str]:
        return sorted(last_json("\n".join(output)) or {})


class ImageLabels(FactBase[dict[str, str] | None]):
    """An image's labels; None when there is no such image."""

    @override
    def command(self, ref: str) -> str:
        return (f"docker image inspect --format '{{{{json .Config.Labels}}}}' {shlex.quote(ref)}"
                " 2>/dev/null || true")

    @override
    def process(self, output: list[str]) -> dict[str, str] | None:
        with suppress(ValueError):  # no such image: no output
            return {str(k): str(v) for k, v in (json.loads("\n".join(output)) or {}).items()}
        return None


@dataclass(frozen=True)
class WeightsState:
    """The weights manifest; ``intact``: its files have the size and mtime recorded at hashing."""

    repo: str | None = None
    revision: str | None = None
    intact: bool = False
    reason: str = "no manifest"

    def holds(self, repo: str, revision: str) -> bool:
        return self.intact and (self.repo, self.revision) == (repo, revision)


_LISTING = "--rigfleet-listing--"


class WeightsManifest(FactBase[WeightsState]):
    """Read ``<dir>/.rigfleet-manifest.json`` and stat the files it lists (one command)."""

    default = WeightsState

    @override
    def command(self, local_dir: str) -> str:
        d = shlex.quote(local_dir)
        return (f"cat {d}/{MANIFEST_NAME} 2>/dev/null | tr -d '\\n'; echo; echo {_LISTING}; "
                f"[ -d {d} ] && find {d} -path {d}/.cache -prune -o -type f "
                "-printf '%P\\t%s\\t%T@\\n' 2>/dev/null || true")

    @override
    def process(self, output: list[str]) -> WeightsState:
        split = output.index(_LISTING) if _LISTING in output else 0
        text = "".join(output[:split]).strip()
        if not text:
            return self.default()
        try:
            manifest = json.loads(text)
            files, repo, revision = manifest["files"], manifest["repo"], manifest["revision"]
        except (ValueError, KeyError, TypeError):
            return WeightsState(reason="manifest unreadable")
        listing: dict[str, tuple[int, float]] = {}
        for line in output[split + 1 :]:
            with suppress(ValueError):  # not "name<TAB>size<TAB>mtime"
                name, size, mtime = line.split("\t")
                listing[name] = (int(size), float(mtime))
        reason = weights_mismatch(files, listing.get)
        return WeightsState(repo, revision, not reason, reason or "matches manifest")


@dataclass(frozen=True)
class GenesisCheckout:
    """The Genesis checkout: HEAD, origin URL, and its layout (None: none known)."""

    head: str | None = None
    origin: str | None = None
    layout: str | None = None


def _markers_command(tree: str) -> str:
    """Shell printing the layout markers under ``tree``, comma-separated (``-``: none)."""
    tests = " ".join(f'[ -e "{tree}/{m}" ] && m="$m,{m}";' for m in genesis_inspect.MARKERS)
    return f'm=""; {tests} echo "${{m#,}}" | sed "s/^$/-/"'


def _layout(markers: str) -> str | None:
    return genesis_inspect.detect_layout(frozenset(markers.split(",")))[0]  # "-": none


class GenesisHead(FactBase[GenesisCheckout]):
    """``git rev-parse HEAD``, the origin URL and the layout markers of a checkout."""

    default = GenesisCheckout

    @override
    def command(self, path: str) -> str:
        p = shlex.quote(path)
        return (f"echo head=$(git -C {p} rev-parse --verify -q HEAD 2>/dev/null); "
                f"echo origin=$(git -C {p} remote get-url origin 2>/dev/null); "
                f"t={p}; echo markers=$({_markers_command('$t')})")

    @override
    def process(self, output: list[str]) -> GenesisCheckout:
        values = dict(line.strip().partition("=")[::2] for line in output if "=" in line)
        return GenesisCheckout(values.get("head") or None, values.get("origin") or None,
                               _layout(values.get("markers", "")))


@dataclass(frozen=True)
class GenesisTreeState:
    """Exported Genesis trees (commit -> (mtime, layout)) and the commits compose files mount."""

    trees: dict[str, tuple[int, str | None]] = field(default_factory=dict)
    referenced: frozenset[str] = frozenset()


class GenesisTrees(FactBase[GenesisTreeState]):
    """``<trees_dir>/<commit>/`` directories and the commits the given compose files name."""

    default = GenesisTreeState

    @override
    def command(self, trees_dir: str, compose_files: tuple[str, ...] = ()) -> str:
        d = shlex.quote(trees_dir.rstrip("/"))
        files = shlex.join(compose_files)
        command = (f'for t in {d}/*/; do [ -d "$t" ] || continue; t="${{t%/}}"; echo "tree '
                   f'$(stat -c %Y "$t") $(basename "$t") $({_markers_command("$t")})"; done')
        if files:
            name = shlex.quote(trees_dir.rstrip("/").rsplit("/", 1)[-1])
            command += (f"; cat {files} 2>/dev/null | grep -oE {name}'/[0-9a-f]{{40}}' "
                        "| sed 's|^.*/|ref |' | sort -u")
        return command + "; true"

    @override
    def process(self, output: list[str]) -> GenesisTreeState:
        trees: dict[str, tuple[int, str | None]] = {}
        referenced: set[str] = set()
        for line in output:
            match line.split():
                case ["tree", mtime, sha, markers] if mtime.isdigit() and HEX40.fullmatch(sha):
                    trees[sha] = (int(mtime), _layout(markers))
                case ["ref", sha] if HEX40.fullmatch(sha):
                    referenced.add(sha)
        return GenesisTreeState(trees, frozenset(referenced))


class VenvPackageVersion(FactBase[str | None]):
    """A distribution's version in a venv; None when either is absent."""

    @override
    def command(self, venv: str, dist: str) -> str:
        code = f"import importlib.metadata as m; print(m.version({dist!r}))"
        return f"{shlex.quote(venv)}/bin/python -c {shlex.quote(code)} 2>/dev/null || true"

    @override
    def process(self, output: list[str]) -> str | None:
        return output[-1].strip() if output and output[-1].strip() else None


@dataclass(frozen=True)
class FileInfo:
    mode: str
    user: str
    group: str
    sha256: str


class FileDigest(FactBase[FileInfo | None]):
    """Mode, owner, group and sha256 of one file (None when missing), in one command."""

    @override
    def command(self, path: str) -> str:
        p = shlex.quote(path)
        return f"if [ -f {p} ]; then stat -c '%a %U %G' {p} && sha256sum {p} | cut -d' ' -f1; fi"

    @override
    def process(self, output: list[str]) -> FileInfo | None:
        match output[0].split() if len(output) >= 2 else []:
            case [mode, user, group]:
                return FileInfo(mode.zfill(4)[-4:], user, group, sha256=output[1].strip())
        return None


class SwapProbe(FactBase[dict[str, Any]]):
    """``rigfleet status``'s host probe (``HostProbe.raw``; ``BARE_PROBE`` without the tool)."""

    default = dict

    @override
    def command(self) -> str:
        return hosttool.probe()

    @override
    def process(self, output: list[str]) -> dict[str, Any]:
        return last_json("\n".join(output)) or {}
