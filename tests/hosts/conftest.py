"""Host checks: is every GPU host of a pyinfra inventory still what the deploy made it?

    pytest tests/hosts --inventory inventory/home.py           # every host, one after another
    pytest tests/hosts --inventory inventory/home.py -n auto   # hosts in parallel (xdist)
    RIGFLEET_INVENTORY=inventory/home.py pytest tests/hosts --weights-check stat

The bridge from pyinfra to testinfra: the inventory is read by pyinfra itself in a subprocess
(``rigfleet.inventory.load_inventory``; importing ``pyinfra_cli`` here would monkey-patch
gevent and break xdist), and each host becomes a testinfra ``ssh://<name>`` host whose SSH
settings come from an ssh_config generated from the inventory's connection data
(``ssh_hostname``, ``ssh_port``, ``ssh_user``, ``ssh_key``). testinfra's paramiko backend
accepts any host key (``WarningPolicy``) and never reads a known_hosts file, so OpenSSH is
used instead: ``UserKnownHostsFile`` is the inventory's ``ssh_known_hosts_file`` (only that
file) and ``StrictHostKeyChecking`` is the inventory's ``ssh_strict_host_key_checking``
(``yes`` when unset). Commands share one connection per host and process (ControlPersist).
A host whose data sets ``_sudo`` runs the checks through ``sudo``.

What a host should be is its ``rigfleet.desired.DesiredHost``, built from its inventory data,
the pins file its data names and the stack catalog (``load_desired``: the model the deploy
renders from and ``rigfleet status`` compares with); every path on the host comes from
``rigfleet.hostside.layout.HOST``. Each check gets a ``rig`` (``rig.want``, ``rig.host``).
Every failure message starts with the host's name and says what was found and what was
expected.

Needs pytest-testinfra (a dependency of the rigfleet package: ``pip install -e .`` in the
checkout, or ``pip install pytest-testinfra``); without it ``--inventory`` is a usage error.
Without ``--inventory`` (e.g. a plain ``pytest tests``) every check here is skipped.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rigfleet.desired import DesiredHost, load_desired
from rigfleet.endpoints import read_key
from rigfleet.errors import RigfleetError
from rigfleet.hostside.layout import BASE_DIGEST_LABEL
from rigfleet.inventory import InventoryError, InventoryHost, gpu_hosts, load_inventory

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
_WORKER_KEY = "rigfleet_hosts_bridge"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("rigfleet", "rigfleet host checks")
    group.addoption(
        "--inventory",
        default=os.environ.get("RIGFLEET_INVENTORY"),
        help="pyinfra inventory whose hosts to check (env RIGFLEET_INVENTORY)",
    )
    group.addoption(
        "--weights-check",
        choices=("sha256", "stat"),
        default="sha256",
        help="sha256: hash every weights file against the manifest (default); "
        "stat: size and mtime only (fast)",
    )


# --- the bridge ------------------------------------------------------------------------------


@dataclass
class Bridge:
    """The inventory's hosts as testinfra specs, plus the ssh_config they use.

    Built once by the controlling process and handed to xdist workers as JSON, so the
    inventory is read once and every worker collects the same host list.
    """

    inventory: str
    rows: list[dict[str, Any]]
    specs: list[str]
    tmpdir: str | None
    ssh_config: str | None

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> Bridge:
        return cls(**json.loads(text))

    def hosts(self) -> list[InventoryHost]:
        return [InventoryHost(r["name"], tuple(r["groups"]), r["data"]) for r in self.rows]


_BRIDGE = pytest.StashKey["Bridge | None"]()
_RIGS = pytest.StashKey[dict[Any, Any]]()


def ssh_config_block(host: InventoryHost, control_dir: str) -> str:
    """One ``Host`` block of the generated ssh_config (strict host keys from the inventory).

    + host: an inventory host (``ssh_*`` keys as pyinfra's SSH connector reads them)
    + control_dir: where ControlPersist sockets live (a private temp dir)
    """
    hostname, port, user = host.ssh_target
    data = host.data
    strict = data.get("ssh_strict_host_key_checking")
    if isinstance(strict, bool) or strict is None:
        strict = "no" if strict is False else "yes"
    lines = [
        f"Host {host.name}",
        f"    HostName {hostname}",
        f"    Port {port}",
        f"    User {user}",
        "    BatchMode yes",
        f"    StrictHostKeyChecking {strict}",
        f"    ControlPath {control_dir}/cm-%C",
        "    ServerAliveInterval 15",
        "    LogLevel ERROR",
    ]
    known = data.get("ssh_known_hosts_file")
    if known:
        # Only the inventory's file: a stale entry elsewhere must not vouch for the host.
        lines.append(f'    UserKnownHostsFile "{Path(str(known)).expanduser()}"')
        lines.append("    GlobalKnownHostsFile /dev/null")
    key = data.get("ssh_key")
    if key:
        lines.append(f'    IdentityFile "{Path(str(key)).expanduser()}"')
        lines.append("    IdentitiesOnly yes")
    return "\n".join(lines) + "\n"


def testinfra_spec(host: InventoryHost, ssh_config: str) -> str:
    """``ssh://<name>?ssh_config=...``: the testinfra host for one inventory host."""
    spec = f"ssh://{host.name}?ssh_config={ssh_config}&controlpersist=120&timeout=15"
    return spec + ("&sudo=true" if host.data.get("_sudo") else "")


def build_bridge(inventory: str) -> Bridge:
    """Read the inventory (pyinfra, in a subprocess) and write the ssh_config: its GPU hosts
    (a balancer-only host serves no stack; test_07 and ``rigfleet status`` check it)."""
    hosts = gpu_hosts(load_inventory(inventory))
    bad = [h.name for h in hosts if h.name.startswith("@") or not _NAME.fullmatch(h.name)]
    if bad:
        raise pytest.UsageError(
            f"{inventory}: hosts {bad} are not SSH hosts with plain names; the host checks "
            "reach hosts over SSH (names: letters, digits, '.', '_', '-')"
        )
    tmpdir = tempfile.mkdtemp(prefix="rigfleet-hosts-")
    config = Path(tmpdir) / "ssh_config"
    config.write_text("".join(ssh_config_block(h, tmpdir) for h in hosts))
    config.chmod(0o600)
    rows = [{"name": h.name, "groups": list(h.groups), "data": h.data} for h in hosts]
    specs = [testinfra_spec(h, str(config)) for h in hosts]
    return Bridge(inventory, rows, specs, tmpdir, str(config))


# pytest-testinfra registers --hosts and the ``host`` fixture; without it the checks cannot run.
NO_TESTINFRA = (
    "--inventory {inventory}: the host checks need pytest-testinfra, which is not installed "
    "in this Python environment (or its plugin is disabled). It is a dependency of the "
    "rigfleet package: run `pip install -e .` in the rigfleet checkout, or "
    "`pip install pytest-testinfra`."
)


def pytest_configure(config: pytest.Config) -> None:
    inventory = config.getoption("inventory", default=None)
    bridge: Bridge | None = None
    workerinput = getattr(config, "workerinput", None) or {}
    if (inventory or _WORKER_KEY in workerinput) and not hasattr(config.option, "hosts"):
        # Checked before the inventory is read: config.option.hosts is testinfra's option.
        raise pytest.UsageError(NO_TESTINFRA.format(inventory=inventory))
    if _WORKER_KEY in workerinput:
        bridge = Bridge.from_json(workerinput[_WORKER_KEY])
    elif inventory:
        try:
            bridge = build_bridge(inventory)
        except InventoryError as e:
            raise pytest.UsageError(str(e)) from None
    config.stash[_BRIDGE] = bridge
    config.stash[_RIGS] = {}
    if bridge is not None and not config.option.hosts:
        config.option.hosts = ",".join(bridge.specs)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist (controller): hand the bridge to each worker."""
    bridge = node.config.stash.get(_BRIDGE, None)
    if bridge is not None:
        node.workerinput[_WORKER_KEY] = bridge.to_json()


def pytest_unconfigure(config: pytest.Config) -> None:
    bridge = config.stash.get(_BRIDGE, None)
    if bridge is None or hasattr(config, "workerinput") or not bridge.tmpdir:
        return
    # Close the shared connections (workers opened them) before removing their sockets.
    for row in bridge.rows:
        subprocess.run(
            ["ssh", "-F", str(bridge.ssh_config), "-O", "exit", row["name"]],
            capture_output=True,
            timeout=10,
            check=False,
        )
    shutil.rmtree(bridge.tmpdir, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.stash.get(_BRIDGE, None) is not None:
        return
    skip = pytest.mark.skip(reason="host checks need --inventory (or RIGFLEET_INVENTORY)")
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)


# --- what each test gets ---------------------------------------------------------------------


@dataclass(frozen=True)
class Rig:
    """One inventory host as the checks see it.

    + name: the inventory name (every message starts with it)
    + host: the inventory host (name, groups, merged data)
    + want: what the deploy makes of it (``rigfleet.desired.DesiredHost``: settings, pins,
      every staged stack with its compose file)
    """

    name: str
    host: InventoryHost = field(repr=False)
    want: DesiredHost = field(repr=False)

    def api_key(self) -> str:
        """The API key from the control-side ``api_key_file`` (never printed)."""
        return read_key(self.want.settings)


def _make_rig(host: InventoryHost) -> Rig | str:
    try:
        want = load_desired(host.name, host.data, REPO)
    except RigfleetError as e:
        return (
            f"{host.name}: the inventory data or pins are invalid, nothing to check against:\n{e}"
        )
    return Rig(host.name, host, want)


@pytest.fixture(scope="module")
def rig(host: Any, request: pytest.FixtureRequest) -> Rig:
    """The inventory host behind testinfra's ``host``, with ``want``: what it should be."""
    bridge = request.config.stash[_BRIDGE]
    assert bridge is not None
    name = host.backend.hostname
    cache = request.config.stash[_RIGS]
    if name not in cache:
        match = [h for h in bridge.hosts() if h.name == name]
        if not match:
            pytest.fail(f"{name}: not in inventory {bridge.inventory}")
        cache[name] = _make_rig(match[0])
    made = cache[name]
    if isinstance(made, str):
        pytest.fail(made, pytrace=False)
    if ("ssh", name) not in cache:  # once per host and process: an unreachable host fails fast
        cache[("ssh", name)] = _reach(host)
    reached = cache[("ssh", name)]
    if reached is not None:
        pytest.fail(f"{name}: {reached}", pytrace=False)
    return made


def _reach(host: Any) -> str | None:
    """None when a first command runs over SSH, else why not (host key, auth, network)."""
    try:
        result = host.run("true")
    except RuntimeError as e:  # testinfra's ssh backend: ssh itself exited 255
        out = e.args[0] if e.args else None
        why = str(getattr(out, "stderr", "") or e).replace("\r", "").strip().splitlines()
        return "cannot reach over SSH: " + " | ".join(why[-3:])
    if result.rc != 0:
        return f"`true` exited {result.rc} over SSH: {result.stderr.strip()[-300:]}"
    return None


@pytest.fixture(scope="module")
def sh(host: Any, rig: Rig) -> Callable[..., str]:
    """``sh(cmd, what)``: run ``cmd`` on the host; its stdout, or fail naming host and what."""

    def run(cmd: str, what: str) -> str:
        result = host.run(cmd)
        if result.rc != 0:
            detail = (result.stderr or result.stdout).strip()[-800:]
            pytest.fail(f"{rig.name}: {what}: `{cmd}` exited {result.rc}: {detail}", pytrace=False)
        return str(result.stdout)

    return run


@dataclass(frozen=True)
class Docker:
    """The host's Docker engine as the checks read it (``docker inspect`` over testinfra)."""

    host: Any

    def container(self, name: str) -> dict[str, Any] | None:
        """``docker inspect`` of container ``name``; None when there is no such container."""
        out = self.host.run(f"docker inspect --type container {shlex.quote(name)}")
        if out.rc != 0 or not out.stdout.strip():
            return None
        data = json.loads(out.stdout)
        return data[0] if data else None

    def repo_digests(self, image: str) -> tuple[list[str], str | None]:
        """The image's ``RepoDigests`` (``repo@sha256:...``; [] when it has none or is gone)
        and, for a derived image (a Genesis stack's packages baked in), the digest of the
        pinned image it was built from (its ``io.rigfleet.base-digest`` label)."""
        fmt = shlex.quote("{{json .RepoDigests}}\t{{json .Config.Labels}}")
        out = self.host.run(f"docker image inspect --format {fmt} {shlex.quote(image)}")
        if out.rc != 0 or not out.stdout.strip():
            return [], None
        digests, _, labels = out.stdout.strip().partition("\t")
        base = (json.loads(labels or "null") or {}).get(BASE_DIGEST_LABEL)
        return [str(d) for d in json.loads(digests) or []], str(base) if base else None

    def image_digests(self, image: str, repository: str) -> tuple[list[str], list[str]]:
        """(the image's ``RepoDigests``, the digests of ``repository`` it is: those among
        them, and a derived image's base digest): what a pinned digest is compared with.
        A ``docker load``-ed archive has none; its image id is compared then."""
        entries, base = self.repo_digests(image)
        return entries, digests_of(entries, repository) + ([base] if base else [])


def _docker_hub_short(repo: str) -> str:
    """``docker.io/library/x`` and ``x`` name the same repository."""
    for prefix in ("docker.io/", "index.docker.io/"):
        repo = repo.removeprefix(prefix)
    return repo.removeprefix("library/")


def digests_of(repo_digests: list[str], repository: str) -> list[str]:
    """The digests ``repo_digests`` (``repo@sha256:...``) lists for ``repository``, in order
    (``vllm/vllm-openai``; a registry prefix such as ``mirror:5000/vllm/vllm-openai`` counts).

        digests_of(["vllm/vllm-openai@sha256:ab", "other/x@sha256:cd"], "vllm/vllm-openai")
        # ['sha256:ab']
    """
    want = _docker_hub_short(repository)
    out = []
    for entry in repo_digests:
        repo, _, digest = entry.partition("@")
        repo = _docker_hub_short(repo)
        if repo == want or repo.endswith("/" + want):
            out.append(digest)
    return out


@pytest.fixture(scope="module")
def docker(host: Any) -> Docker:
    """``docker.container(name)``, ``docker.image_digests(image, repository)`` on the host."""
    return Docker(host)


@pytest.fixture(scope="session")
def weights_check(request: pytest.FixtureRequest) -> str:
    return str(request.config.getoption("weights_check", default="sha256"))


@pytest.fixture(scope="module")
def fail_if(rig: Rig) -> Callable[[str, list[str]], None]:
    """``fail_if(what, problems)``: fail with ``<host>: <what>:`` and one problem per line."""

    def check(what: str, problems: list[str]) -> None:
        if problems:
            pytest.fail(f"{rig.name}: {what}:\n  " + "\n  ".join(problems), pytrace=False)

    return check


@pytest.fixture(scope="session")
def require() -> Callable[[object, str], None]:
    """``require(ok, message)``: fail with ``message`` alone (it names the host) unless ok."""

    def check(ok: object, message: str) -> None:
        if not ok:
            pytest.fail(message, pytrace=False)

    return check
