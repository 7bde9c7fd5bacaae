"""Docker Engine + Compose v2, and ``/etc/docker/daemon.json`` merged (never overwritten).

Package source per OS (chosen so every host gets Compose v2 as ``docker compose``):

- Debian 13: Debian's own ``docker.io docker-cli docker-compose`` (Docker 26, Compose v2 as
  the CLI plugin). No third-party repository.
- Debian 12: Debian has only Compose v1, so Docker's apt repository: ``docker-ce docker-ce-cli
  containerd.io docker-compose-plugin``.
- Ubuntu 22.04/24.04: Ubuntu's archive ``docker.io docker-compose-v2`` (universe). Security
  updates come with the OS and no extra key is trusted; Docker's repository would only buy a
  newer engine, which vLLM does not need.

Example::

    docker(ctx)
"""

from __future__ import annotations

import io
import json
from typing import Any

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.operations import files, systemd

from rigfleet.commands import apt as apt_commands
from rigfleet.facts import DockerDaemonJson, read_fact
from rigfleet.hostdata import AptRepo
from roles.ops import apt_keyring, apt_packages, fail, on_change
from roles.preflight import HostContext, OsInfo

DAEMON_JSON = "/etc/docker/daemon.json"

# Docker's repository for Debian 12 (Compose v2 is not in bookworm), used when host data has
# no apt_repos.docker (a mirror, a stand-in). Its signing key's fingerprint is pinned (Docker's
# install docs: 9DC8 5822 9FC7 DD38 854A  E2D8 8D81 803C 0EBF CD88), so a swapped key fails.
DOCKER_DEBIAN_REPO = AptRepo(
    name="docker",
    url="https://download.docker.com/linux/debian",
    key_url="https://download.docker.com/linux/debian/gpg",
    suite="{codename}",
    components=("stable",),
    key_fingerprint="9DC858229FC7DD38854AE2D88D81803C0EBFCD88",
)

# Container logs are kept, but bounded: vLLM logs every request at INFO.
LOG_OPTS = {"max-size": "100m", "max-file": "5"}


def docker_packages(os: OsInfo) -> tuple[str, ...]:
    """The engine + Compose v2 packages for this OS (see the module docstring)."""
    if os.id == "debian" and os.version_id == "12":
        return ("docker-ce", "docker-ce-cli", "containerd.io", "docker-compose-plugin")
    if os.id == "debian":
        return ("docker.io", "docker-cli", "docker-compose")
    return ("docker.io", "docker-compose-v2")


def docker_repo(os: OsInfo, configured: AptRepo | None = None) -> AptRepo | None:
    """Docker's apt repository when this OS needs it (Debian 12), else None.

    + configured: host data ``apt_repos.docker`` (a mirror, a fingerprint), else Docker's own
    """
    if os.id == "debian" and os.version_id == "12":
        repo = configured or DOCKER_DEBIAN_REPO
        return repo.expand(os_id=os.id, version_id=os.version_id, codename=os.codename)
    return None


def daemon_settings(registry_mirror: str | None) -> dict[str, Any]:
    """The keys rigfleet owns in daemon.json; everything else in the file is left alone."""
    settings: dict[str, Any] = {"log-driver": "json-file", "log-opts": dict(LOG_OPTS)}
    if registry_mirror:
        settings["registry-mirrors"] = [registry_mirror]
    return settings


def merge_daemon_config(current: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """``current`` with ``settings`` applied: ``log-opts`` merged key by key, other keys set.

    Keys rigfleet does not own (``runtimes`` from nvidia-ctk, a user's ``data-root``) stay.
    ``registry-mirrors`` is left as it is when no mirror is configured.
    """
    merged = json.loads(json.dumps(current))
    for key, value in settings.items():
        if key == "log-opts" and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


@operation()
def daemon_json(settings: dict[str, Any]):
    """Merge ``settings`` into ``/etc/docker/daemon.json``; upload only when it differs.

    The current file is read as JSON (a fact), so formatting differences (nvidia-ctk rewrites
    the file with its own indentation) are not changes.

    + settings: the keys to own (``daemon_settings``)
    """
    current = read_fact(DockerDaemonJson)
    if current.error:
        yield from fail(f"{host.name}: {current.error}; fix or remove it, then re-run")
        return
    merged = merge_daemon_config(current.config, settings)
    if current.exists and merged == current.config:
        host.noop(f"{DAEMON_JSON} already has {', '.join(sorted(settings))}")
        return
    text = json.dumps(merged, indent=2, sort_keys=True) + "\n"
    yield from files.put._inner(
        src=io.StringIO(text),
        dest=DAEMON_JSON,
        user="root",
        group="root",
        mode="0644",
    )


def add_apt_repo(name: str, repo: AptRepo) -> list:
    """Keyring + deb822 sources file for ``repo``; returns both operations."""
    keyring = apt_commands.keyring_path(repo.key_url)
    key_op = apt_keyring(
        name=f"{name}: signing key {keyring}",
        key_url=repo.key_url,
        dest=keyring,
        fingerprint=repo.key_fingerprint,
    )
    sources_op = files.put(
        name=f"{name}: apt source",
        src=io.StringIO(
            apt_commands.deb822_sources(repo.url, repo.suite, repo.components, keyring)
        ),
        dest=f"{apt_commands.SOURCES_DIR}/rigfleet-{repo.name}.sources",
        user="root",
        group="root",
        mode="0644",
    )
    return [key_op, sources_op]


@deploy("Docker")
def docker(ctx: HostContext) -> None:
    """Install Docker Engine + Compose v2, merge daemon.json, restart only when it changed."""
    repo = docker_repo(ctx.os, ctx.settings.apt_repos.get("docker"))
    if repo is not None:
        add_apt_repo("Docker", repo)
    apt_packages(
        name="Install Docker Engine and Compose v2", packages=list(docker_packages(ctx.os))
    )
    daemon = daemon_json(
        name=f"Merge {DAEMON_JSON} (log rotation, registry mirror)",
        settings=daemon_settings(ctx.settings.docker_registry_mirror),
    )
    systemd.service(name="Docker enabled and running", service="docker", running=True, enabled=True)
    on_change(
        name="Restart Docker (daemon.json changed)",
        commands=["systemctl restart docker"],
        gates=[daemon],
        reason="daemon.json unchanged",
    )
