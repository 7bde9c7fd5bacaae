"""The fleet's pins (``pins.yaml``): everything that must not move unless a person moves it
(docs/pins.md describes every key, from ``rigfleet.pin_keys``)::

    pins = load_pins("pins.yaml")
    pins.stacks["int8"].image_ref   # "vllm/vllm-openai:nightly-01d4...@sha256:..."
"""

from __future__ import annotations

import fcntl
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from rigfleet.catalog import HF_REPO, Catalog, builtin_catalog
from rigfleet.genesis_inspect import GENERATIONS
from rigfleet.hostside.atomic import write_atomic
from rigfleet.pin_keys import SCHEMA, TABLE, UNRESOLVED, allowed, default
from rigfleet.registry import DIGEST
from rigfleet.validate import Problems, ValidationError, YamlError, load_yaml, parse_yaml
from rigfleet.vllm_versions import NIGHTLY_TAG

SAVE_WAIT = 30.0  # seconds a save waits for another process's save of the same directory
LOCK_HINT = "run `rigfleet pins lock` to resolve it from the registry / hub"

# Tags that move: pinning one pins nothing. vLLM pushes `nightly` and the per-arch
# `nightly-x86_64`/`nightly-aarch64` on every build, and `<variant>-nightly` for variants.
MUTABLE_TAGS = frozenset({"latest", "nightly", "nightly-x86_64", "nightly-aarch64"})

HEX40 = re.compile(r"[0-9a-f]{40}")  # a git commit (also the weights' and trees' revisions)
_SHORT_HEX = re.compile(r"[0-9a-f]{4,39}")
# Docker reference grammar, simplified: optional registry host[:port], lowercase path
# components, then a tag. Digests are a separate key, so no "@" here.
_IMAGE = re.compile(
    r"(?P<repo>(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)"
    r":(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})"
)
_RELEASE_TAG = re.compile(r"v(?P<version>\d+\.\d+\.\d+\S*)")
# PEP 440 public version (release, pre, post, dev) with an optional local part.
_PEP440 = re.compile(
    r"(?P<public>\d+(?:\.\d+)*(?:(?:a|b|rc)\d+)?(?:\.post\d+)?(?:\.dev\d+)?)"
    r"(?:\+(?P<local>[0-9A-Za-z]+(?:[.-][0-9A-Za-z]+)*))?"
)
_LOCAL_GIT = re.compile(r"g(?P<abbrev>[0-9a-f]{7,40})(?:[.-].*)?")
_DRIVER_BRANCH = re.compile(r"[0-9]{3,4}")
_DRIVER_VERSION = re.compile(r"[0-9]{3,4}\.[0-9]+(?:\.[0-9]+)?")
_TOOLKIT_VERSION = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+(?:~rc\.[0-9]+)?-[0-9]+")
_LOCAL_DIR = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_GENESIS_VERSION = re.compile(r"v?\d+(?:\.\d+){1,3}(?:[.-][A-Za-z0-9]+)*")

DEFAULT_LAYOUT = default("stacks.<stack>.genesis.layout")


class PinsError(ValidationError):
    """``pins.yaml`` is missing, unreadable or wrong; one line per problem."""


@dataclass(frozen=True)
class GenesisPin:
    """The Genesis patch tree, by full commit."""

    repo: str
    commit: str
    layout: str = DEFAULT_LAYOUT
    version: str | None = None

    @property
    def label(self) -> str:
        """``v12.1.0 (66e37841a18f)`` or the short commit."""
        return f"{self.version} ({self.commit[:12]})" if self.version else self.commit[:12]


@dataclass(frozen=True)
class StackPins:
    """What one stack runs: image tag + digest, the vLLM version it reports, Genesis."""

    name: str
    image: str  # also the name of the staged, verified image on a host (no digest)
    digest: str
    vllm_version: str
    genesis: GenesisPin | None = None
    image_id: str | None = None

    @property
    def image_ref(self) -> str:
        """``<repo>:<tag>@<digest>``: the tag stays readable, Docker pulls by digest."""
        return f"{self.image}@{self.digest}"

    @property
    def repository(self) -> str:
        return self.image.rsplit(":", 1)[0]

    @property
    def tag(self) -> str:
        return self.image.rsplit(":", 1)[1]


@dataclass(frozen=True)
class ModelPin:
    """The weights; ``key``: where the pins file holds it (``model``, or ``models.<repo>``)."""

    repo: str
    revision: str
    local_dir: str
    key: str = "model"


@dataclass(frozen=True)
class Pins:
    """The whole pins file, validated."""

    path: str
    serial: int
    driver_branch: str
    driver_version: str | None
    toolkit_version: str
    hf_hub_version: str
    model: ModelPin
    stacks: dict[str, StackPins]
    history: list[dict] = field(default_factory=list)
    # host name -> stack name -> the pins that host runs instead of ``stacks[stack]``.
    hosts: dict[str, dict[str, StackPins]] = field(default_factory=dict)
    # The ``models`` section, by repo (``model`` is the default: its own entry, or the first).
    models: dict[str, ModelPin] = field(default_factory=dict)
    # The stacks the file was checked against (None: the built-in ones); ``save_pins`` too.
    catalog: Catalog | None = field(default=None, compare=False, repr=False)

    @property
    def all_models(self) -> dict[str, ModelPin]:
        """Every pinned model by repo, the default first."""
        return {self.model.repo: self.model, **self.models}

    def model_for(self, repo: str | None) -> ModelPin:
        """The pin of model ``repo`` (None: the default model); ``PinsError`` when not pinned."""
        if repo is None:
            return self.model
        try:
            return self.all_models[repo]
        except KeyError:
            raise PinsError(f"{self.path}: models.{repo}: not pinned; pinned: "
                            f"{', '.join(self.all_models)}; allowed: pin it under models "
                            "(docs/pins.md)") from None

    def for_host(self, name: str) -> Pins:
        """These pins as host ``name`` runs them: its ``hosts`` overrides merged into ``stacks``."""
        overrides = self.hosts.get(name)
        return replace(self, stacks={**self.stacks, **overrides}) if overrides else self

    def stack(self, name: str) -> StackPins:
        """The pins of stack ``name`` (raises ``PinsError`` when it is not pinned)."""
        try:
            return self.stacks[name]
        except KeyError:
            raise PinsError(f"{self.path}: stacks.{name}: not pinned; pinned: "
                            f"{', '.join(self.stacks)}") from None

    def unresolved(self) -> list[str]:
        """Key paths still ``unresolved`` (what ``rigfleet pins lock`` has to fill in)."""
        keys = [f"stacks.{n}.digest" for n, s in self.stacks.items() if s.digest == UNRESOLVED]
        keys += [f"hosts.{h}.stacks.{n}.digest" for h, stacks in self.hosts.items()
                 for n, s in stacks.items() if s.digest == UNRESOLVED]
        keys += [f"{m.key}.revision" for m in self.all_models.values()
                 if m.revision == UNRESOLVED]
        return keys

    def to_dict(self) -> dict[str, Any]:
        """The file's content as plain data, keys in file order (what ``save_pins`` dumps)."""
        out: dict[str, Any] = {
            "schema": SCHEMA, "serial": self.serial,
            "driver": _present(branch=self.driver_branch, version=self.driver_version),
            "container_toolkit": {"version": self.toolkit_version},
            "huggingface_hub": {"version": self.hf_hub_version},
        }
        if self.model.key == "model":
            out["model"] = {"repo": self.model.repo, "revision": self.model.revision,
                            "local_dir": self.model.local_dir}
        if self.models:  # absent unless a stack serves another model: old files unchanged
            out["models"] = {r: {"revision": m.revision, "local_dir": m.local_dir}
                             for r, m in self.models.items()}
        out["stacks"] = {name: stack_dict(s) for name, s in self.stacks.items()}
        if self.hosts:  # absent unless a rollout left hosts on other pins: old files unchanged
            out["hosts"] = {h: {"stacks": {n: stack_dict(s) for n, s in stacks.items()}}
                            for h, stacks in self.hosts.items()}
        out["history"] = [dict(h) for h in self.history]
        return out


def _present(**values: Any) -> dict[str, Any]:
    """The ``values`` that are not None, in order (keys left out of the file)."""
    return {k: v for k, v in values.items() if v is not None}


def stack_dict(s: StackPins) -> dict[str, Any]:
    g = s.genesis
    return _present(
        image=s.image, digest=s.digest, vllm_version=s.vllm_version, image_id=s.image_id,
        genesis=None if g is None else _present(
            repo=g.repo, commit=g.commit,
            layout=g.layout if g.layout != DEFAULT_LAYOUT or g.version else None,
            version=g.version or None))


def load_pins(path: str | Path, *, allow_unresolved: bool = False,
              catalog: Catalog | None = None) -> Pins:
    """``allow_unresolved``: only for ``rigfleet pins lock``; raises ``PinsError`` listing all."""
    path = str(path)
    try:
        data = load_yaml(path, "the pins file", "create it (see docs/converge.md)")
    except YamlError as e:
        raise PinsError(str(e)) from None
    return parse_pins(data, path, allow_unresolved=allow_unresolved, catalog=catalog)


def parse_pins(data: Any, path: str = "pins.yaml", *, allow_unresolved: bool = False,
               catalog: Catalog | None = None) -> Pins:
    """Validate already-parsed pins data (``load_pins`` without the file read)."""
    c = _Checker(path, catalog or builtin_catalog())
    pins = c.pins(data)
    c.raise_if_any(PinsError)
    assert pins is not None
    unresolved = pins.unresolved()
    if unresolved and not allow_unresolved:
        raise PinsError([f"{path}: {key}: is {UNRESOLVED!r}; {LOCK_HINT}" for key in unresolved])
    return pins


def dump_pins(pins: Pins) -> str:
    """The YAML text ``save_pins`` writes (no comments: the file is machine-written)."""
    return yaml.safe_dump(pins.to_dict(), sort_keys=False, default_flow_style=False, width=100)


def save_pins(pins: Pins, history_entry: dict[str, Any] | None = None) -> Pins:
    """Write ``pins`` atomically at serial + 1 with ``history_entry``; refused if saved since."""
    path, data = Path(pins.path), None
    with saving(path):  # the serial is compared and the file written by one process at a time
        with suppress(YamlError):
            data = load_yaml(path, "the pins file")
        on_disk = data.get("serial") if isinstance(data, dict) else None
        if type(on_disk) is int and on_disk != pins.serial:  # a bool is no serial
            raise PinsError(f"{path}: serial: file is at serial {on_disk} but these pins were "
                            f"loaded at {pins.serial}; someone saved in between. Reload, "
                            "re-apply, save again")
        history = [dict(h) for h in pins.history]
        if history_entry is not None:
            history.append({**history_entry, "serial": pins.serial + 1})
        new = replace(pins, serial=pins.serial + 1, history=history)
        parse_pins(parse_yaml(dump_pins(new), str(path)), str(path), allow_unresolved=True,
                   catalog=pins.catalog)
        write_keeping_mode(path, dump_pins(new))
    return new


@contextmanager
def saving(path: Path) -> Iterator[None]:
    """One process at a time reads and replaces ``path``: an ``flock`` of its directory."""
    fd = os.open(path.parent, os.O_RDONLY)  # the kernel drops the lock when the process ends
    try:
        for _ in range(int(SAVE_WAIT * 20)):
            with suppress(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            time.sleep(0.05)
        else:
            raise PinsError(f"{path}: not saved: another rigfleet process held the lock of "
                            f"{path.parent} for {SAVE_WAIT:g}s; allowed: run again when it ends")
        yield
    finally:
        os.close(fd)


def write_keeping_mode(path: Path, text: str) -> None:
    """``write_atomic``, keeping the file's mode (0644 for a new one)."""
    write_atomic(path, text, path.stat().st_mode & 0o777 if path.exists() else 0o644)


class _Checker(Problems):

    def __init__(self, path: str, catalog: Catalog) -> None:
        super().__init__(path, TABLE)
        self.catalog = catalog
        self.repos: tuple[str, ...] = ()  # the pinned models, read before the stacks

    def section(self, key: str) -> str:
        """A host's stack entries are described as the fleet's."""
        return super().section(re.sub(r"^hosts\..+?\.stacks\.", "stacks.", key))

    def pinned(self, key: str, value: Any, pattern: re.Pattern[str], *,
               allow_unresolved: bool) -> str | None:
        """A full commit or digest (or ``unresolved``, when allowed, until ``pins lock``)."""
        text = self.allowed(key) or ""
        if allow_unresolved:
            text += f" (or {UNRESOLVED!r} until `rigfleet pins lock`)"
        if value == UNRESOLVED and allow_unresolved:
            return value
        if pattern is HEX40 and isinstance(value, str) and _SHORT_HEX.fullmatch(value):
            self.bad(key, value, text, f"is a short hash ({len(value)} characters); git and the "
                     "Hugging Face hub need the full 40-hex hash to pin exactly")
            return None
        return self.string(key, value, pattern, text)

    def pins(self, data: Any) -> Pins | None:
        if (top := self.mapping("", data)) is None:
            return None
        if top.get("schema") != SCHEMA:
            self.bad("schema", top.get("schema"), allowed("schema"), "is not a supported schema")
        serial = self.integer("serial", top.get("serial"), low=1)
        driver_branch, driver_version = self.driver(top.get("driver"))
        toolkit = self.versioned("container_toolkit", top.get("container_toolkit"),
                                 _TOOLKIT_VERSION)
        hf_hub = self.versioned("huggingface_hub", top.get("huggingface_hub"), _PEP440)
        model, models = self.models(top.get("model"), top.get("models"))
        self.repos = (model.repo, *models) if model else ()
        stacks = self.stacks("stacks", top.get("stacks"),
                             f"{allowed('stacks')}: {', '.join(self.catalog.names)}")
        # Not checked key by key below: no control characters in host names and history either.
        self.control_chars("hosts", top.get("hosts"))
        self.control_chars("history", top.get("history"))
        hosts = self.hosts(top.get("hosts"))
        history = top.get("history", [])
        if not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
            self.bad("history", history, allowed("history"))
            history = []
        if self.lines:
            return None
        assert serial and driver_branch and toolkit and hf_hub and model and stacks is not None
        return Pins(path=self.where, serial=serial, driver_branch=driver_branch,
                    driver_version=driver_version, toolkit_version=toolkit, hf_hub_version=hf_hub,
                    model=model, stacks=stacks, history=history, hosts=hosts, models=models,
                    catalog=self.catalog)

    def driver(self, value: Any) -> tuple[str | None, str | None]:
        d = self.mapping("driver", value)
        if d is None:
            return None, None
        branch = d.get("branch")
        if isinstance(branch, int) and not isinstance(branch, bool):
            branch = str(branch)  # `branch: 580` unquoted in YAML means the same thing
        branch = self.string("driver.branch", branch, _DRIVER_BRANCH)
        version = d.get("version")
        text = allowed("driver.version").replace("<branch>", branch or "<branch>")
        if version is None or self.unquoted("driver.version", version, text):
            return branch, None
        if not isinstance(version, str) or not _DRIVER_VERSION.fullmatch(version):
            self.bad("driver.version", version, text)
        elif branch and version.split(".")[0] != branch:
            self.bad("driver.version", version, text, f"is not on branch {branch}")
        else:
            return branch, version
        return branch, None

    def versioned(self, key: str, value: Any, pattern: re.Pattern[str]) -> str | None:
        if (d := self.mapping(key, value)) is None or self.unquoted(
                f"{key}.version", d.get("version"), self.allowed(f"{key}.version") or ""):
            return None
        return self.string(f"{key}.version", d.get("version"), pattern)

    def unquoted(self, key: str, value: Any, allowed: str) -> bool:
        """A version YAML read as a number (recorded): which one was meant is lost."""
        if not isinstance(value, int | float) or isinstance(value, bool):
            return False
        self.bad(key, value, allowed + ", quoted",
                 "is an unquoted number (YAML reads 440.100 as 440.1)")
        return True

    def models(self, one: Any, more: Any) -> tuple[ModelPin | None, dict[str, ModelPin]]:
        """(the default model, the ``models`` section)."""
        entries: list[ModelPin | None] = []
        if one is not None or not more:
            entries.append(self.model_entry("model", None, one))
        for repo, entry in self.named("models", more).items():
            key = f"models.{repo}"
            if self.string(key, repo, HF_REPO) is None:
                continue
            if isinstance(one, dict) and repo == one.get("repo"):
                self.bad(key, repo, allowed("models.<repo>"), "is pinned under model too")
            else:
                entries.append(self.model_entry(key, repo, entry))
        pins = [pin for pin in entries if pin is not None]
        dirs: dict[str, str] = {}
        for pin in pins:
            if pin.local_dir in dirs:
                self.bad(f"{pin.key}.local_dir", pin.local_dir,
                         allowed("models.<repo>.local_dir"), f"is {dirs[pin.local_dir]}'s too")
            dirs[pin.local_dir] = pin.key
        return (pins[0] if pins else None), {pin.repo: pin for pin in pins if pin.key != "model"}

    def model_entry(self, key: str, repo: str | None, value: Any) -> ModelPin | None:
        """``{revision, local_dir}`` of the model ``repo`` at ``key`` (``model`` names its own)."""
        d = self.mapping(key, value)
        if d is None:
            return None
        if key == "model":
            repo = self.string("model.repo", d.get("repo"), HF_REPO)
        revision = self.pinned(f"{key}.revision", d.get("revision"), HEX40,
                               allow_unresolved=True)
        local_dir = d.get("local_dir")
        if local_dir is None and key != "model" and repo:
            local_dir = repo.split("/")[1].lower()
        local_dir = self.string(f"{key}.local_dir", local_dir, _LOCAL_DIR,
                                allowed("model.local_dir"))
        if repo and revision and local_dir:
            return ModelPin(repo=repo, revision=revision, local_dir=local_dir, key=key)
        return None

    def stacks(self, key: str, value: Any, shape: str) -> dict[str, StackPins] | None:
        """A non-empty mapping stack name -> its pins (``stacks``, a host's ``stacks``)."""
        if not isinstance(value, dict) or not value:
            self.bad(key, value, shape)
            return None
        out: dict[str, StackPins] = {}
        for name, entry in value.items():
            if name not in self.catalog:
                self.bad(f"{key}.{name}", name, ", ".join(self.catalog.names),
                         "is not a stack in the catalog")
            elif (pinned := self.stack(name, entry, f"{key}.{name}")) is not None:
                out[name] = pinned
        return out

    def hosts(self, value: Any) -> dict[str, dict[str, StackPins]]:
        out: dict[str, dict[str, StackPins]] = {}
        for host, entry in self.named("hosts", value).items():
            if not isinstance(host, str) or not host:
                self.bad(f"hosts.{host}", host, allowed("hosts.<host>"))
                continue
            d = self.mapping(f"hosts.{host}", entry)
            stacks = None if d is None else self.stacks(
                f"hosts.{host}.stacks", d.get("stacks"), allowed("hosts.<host>.stacks"))
            if stacks is not None:
                out[host] = stacks
        return out

    def stack(self, name: str, value: Any, base: str) -> StackPins | None:
        spec = self.catalog.get(name)
        d = self.mapping(base, value)
        if d is None:
            return None
        if spec.model is not None and self.repos and spec.model not in self.repos:
            self.bad(base, name, f"a stack whose model is pinned (pinned: {', '.join(self.repos)})",
                     f"serves {spec.model} ({spec.source}: model), which is not pinned under "
                     "model or models")
        image = self.image(f"{base}.image", d.get("image"))
        digest = self.pinned(f"{base}.digest", d.get("digest"), DIGEST, allow_unresolved=True)
        version = self.vllm_version(f"{base}.vllm_version", d.get("vllm_version"), image)
        image_id = self.string(f"{base}.image_id", d.get("image_id"), DIGEST, required=False)
        genesis = self.genesis(f"{base}.genesis", d.get("genesis")) if spec.genesis else None
        if spec.genesis is None and "genesis" in d:
            self.bad(f"{base}.genesis", d["genesis"], "no 'genesis' key for this stack",
                     f"is set but stack {name} does not use Genesis")
        elif image and digest and version and (genesis or spec.genesis is None):
            return StackPins(name, image, digest, version, genesis, image_id)
        return None

    def image(self, key: str, value: Any) -> str | None:
        text = self.allowed(key) or ""
        if (image := self.string(key, value, _IMAGE, text)) is None:
            return None
        tag = image.rsplit(":", 1)[1]
        if tag in MUTABLE_TAGS or tag.endswith("-nightly"):
            self.bad(key, value, text, f"uses the moving tag {tag!r}, which pins nothing")
            return None
        return image

    def vllm_version(self, key: str, value: Any, image: str | None) -> str | None:
        version = self.string(key, value, _PEP440)
        if version is None or image is None:
            return version
        tag = image.rsplit(":", 1)[1]
        local = _PEP440.fullmatch(version).group("local")  # type: ignore[union-attr]
        if m := NIGHTLY_TAG.fullmatch(tag):
            sha = m.group("sha")
            g = _LOCAL_GIT.fullmatch(local or "")
            want = f"a version ending in '+g{sha[:9]}' (this build's commit)"
            if g is None:
                self.bad(key, value, want,
                         f"has no '+g<commit>' part, but the image is the nightly of {sha[:9]}")
                return None
            if not sha.startswith(g.group("abbrev")):
                self.bad(key, value, want, f"names commit {g.group('abbrev')}, but the image tag "
                         f"is nightly-{sha}; copy-paste from another pin?")
                return None
        elif (m := _RELEASE_TAG.fullmatch(tag)) and version != m.group("version"):
            self.bad(key, value, repr(m.group("version")),
                     f"does not match the release tag {tag!r}")
            return None
        return version

    def genesis(self, key: str, value: Any) -> GenesisPin | None:
        if value is None:
            self.missing(key, self.allowed(key))
            return None
        d = self.mapping(key, value)
        if d is None:
            return None
        layout = d.get("layout", DEFAULT_LAYOUT)
        if not isinstance(layout, str) or layout not in GENERATIONS:
            self.bad(f"{key}.layout", layout, ", ".join(GENERATIONS),
                     "is not a Genesis layout rigfleet knows")
            layout = None
        version = self.string(f"{key}.version", d.get("version"), _GENESIS_VERSION,
                              required=False)
        repo = self.git_url(f"{key}.repo", d.get("repo"))
        commit = self.pinned(f"{key}.commit", d.get("commit"), HEX40, allow_unresolved=False)
        if repo and commit and layout:
            return GenesisPin(repo=repo, commit=commit, layout=layout, version=version)
        return None
