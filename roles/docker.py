"""Docker Engine + Compose v2, and ``/etc/docker/daemon.json`` merged (never overwritten).

What rigfleet owns in daemon.json (``daemon_settings``: ``live-restore``, the ``cgroupfs``
driver) keeps the serving stack up across a dockerd restart and a ``systemctl daemon-reload``
(NVIDIA/nvidia-container-toolkit#48). A change Docker reloads (``RELOADABLE``) is applied with
``systemctl reload docker``; any other key needs a restart, which disturbs a serving host and
so runs in its maintenance window (``roles.maintenance``). The packages come from each OS's
own archive, Docker's repository only on Debian 12 (Compose v2 as ``docker compose`` on
every host). docs/converge.md ("Docker: packages and daemon.json") says why for each.

Example::

    docker(ctx)
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.operations import files, systemd

from rigfleet.commands import apt as apt_commands
from rigfleet.facts import DockerDaemonJson, read_fact, read_paths
from rigfleet.fleetcache import cache_settings
from rigfleet.hostdata import AptRepo
from rigfleet.packages import OsInfo
from roles import maintenance
from roles.maintenance import disturbing
from roles.ops import apt_keyring, apt_packages, fail, on_change
from roles.preflight import HostContext

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
# NVIDIA/nvidia-container-toolkit#48: containers in cgroupfs cgroups keep their GPUs across a
# systemctl daemon-reload (the systemd driver's scopes get their DeviceAllow= re-applied).
CGROUP_DRIVER_OPT = "native.cgroupdriver=cgroupfs"
# What dockerd applies on SIGHUP (moby daemon/reload.go: runtimes, debug, labels, the
# download/upload limits, shutdown timeout, insecure registries, registry mirrors, live
# restore); every other key is read at start only.
RELOADABLE = frozenset({
    "debug", "labels", "live-restore", "max-concurrent-downloads", "max-concurrent-uploads",
    "max-download-attempts", "shutdown-timeout", "insecure-registries", "registry-mirrors",
    "runtimes", "default-runtime",
})


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


def daemon_settings(registry_mirror: str | None,
                    insecure: Sequence[str] = ()) -> dict[str, Any]:
    """The keys rigfleet owns in daemon.json; everything else in the file is left alone.

    + insecure: ``host:port`` of plain-HTTP registries the host pulls from (the fleet
      caches': ``rigfleet.fleetcache``), added to ``insecure-registries``
    """
    settings: dict[str, Any] = {"log-driver": "json-file", "log-opts": dict(LOG_OPTS),
                                "live-restore": True, "exec-opts": [CGROUP_DRIVER_OPT]}
    if registry_mirror:
        settings["registry-mirrors"] = [registry_mirror]
    if insecure:
        settings["insecure-registries"] = list(insecure)
    return settings


def merge_daemon_config(current: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """``current`` with ``settings`` applied: ``log-opts`` merged key by key, ``exec-opts``
    option by option (rigfleet's cgroup driver replaces any other), other keys set.

    Keys rigfleet does not own (``runtimes`` from nvidia-ctk, a user's ``data-root``) stay.
    ``registry-mirrors`` is left as it is when no mirror is configured.
    """
    merged = json.loads(json.dumps(current))
    for key, value in settings.items():
        if key == "log-opts" and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        elif key == "insecure-registries" and isinstance(merged.get(key), list):
            merged[key] = merged[key] + [v for v in value if v not in merged[key]]
        elif key == "exec-opts" and isinstance(merged.get(key), list):
            ours = {str(v).partition("=")[0].strip() for v in value}
            kept = [o for o in merged[key] if str(o).partition("=")[0].strip() not in ours]
            merged[key] = kept + list(value)
        else:
            merged[key] = value
    return merged


def changed_keys(current: dict[str, Any], merged: dict[str, Any]) -> list[str]:
    """The daemon.json keys whose value the merge changes (added, changed or removed)."""
    return sorted(k for k in set(current) | set(merged) if current.get(k) != merged.get(k))


def restart_keys(keys: list[str]) -> list[str]:
    """Of ``keys``, those dockerd reads only at start (a restart is needed for them)."""
    return [k for k in keys if k not in RELOADABLE]


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


def add_apt_repo(name: str, repo: AptRepo, also: Sequence[str] = ()) -> list:
    """Keyring + deb822 sources file for ``repo``; returns both operations. ``also``: files
    the caller writes next, read with the sources file in one round trip (``read_paths``)."""
    keyring = apt_commands.keyring_path(repo.key_url)
    sources = f"{apt_commands.SOURCES_DIR}/rigfleet-{repo.name}.sources"
    read_paths([sources, *also])
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
        dest=sources,
        user="root",
        group="root",
        mode="0644",
    )
    return [key_op, sources_op]


def reload_detaches_gpus(ctx: HostContext) -> bool:
    """(Preparing) would a ``systemctl daemon-reload`` later in this run take the serving
    container's GPUs (NVIDIA/nvidia-container-toolkit#48)? Only while the cgroupfs driver is
    not in effect for it: daemon.json lacks it and this run does not restart Docker with it
    (that restart's window recreates the stack under the new driver)."""
    if not maintenance.serves(ctx):
        return False
    current = read_fact(DockerDaemonJson)
    opts = current.config.get("exec-opts") if not current.error else None
    if isinstance(opts, list) and CGROUP_DRIVER_OPT in opts:
        return False
    return not any(s.startswith("Docker restart") for s in maintenance.steps_planned(ctx.want.name))


def daemon_change(settings: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(Preparing) the daemon.json keys the merge changes, and those that need a restart."""
    current = read_fact(DockerDaemonJson)
    if current.error:
        return [], []  # daemon_json fails the host with the message
    keys = changed_keys(current.config, merge_daemon_config(current.config, settings))
    return keys, restart_keys(keys)


@deploy("Docker")
def docker(ctx: HostContext) -> None:
    """Install Docker Engine + Compose v2, merge daemon.json; reload Docker when only keys it
    reloads changed, restart it (in the maintenance window of a serving host) otherwise."""
    repo = docker_repo(ctx.os, ctx.want.settings.apt_repos.get("docker"))
    if repo is not None:
        add_apt_repo("Docker", repo)
    apt_packages(
        name="Install Docker Engine and Compose v2", packages=list(docker_packages(ctx.os))
    )
    caches = tuple(urlsplit(c.registry_url).netloc for c in cache_settings(host.inventory))
    settings = daemon_settings(ctx.want.settings.docker_registry_mirror, caches)
    keys, restart = daemon_change(settings)
    daemon = daemon_json(
        name=f"Merge {DAEMON_JSON} (log rotation, registry mirror, live-restore, cgroupfs)",
        settings=settings,
    )
    systemd.service(name="Docker enabled and running", service="docker", running=True, enabled=True)
    what = f"Docker restart (daemon.json: {', '.join(restart)})"
    maintenance.plan_step(ctx, what, bool(restart))
    disturbing(
        name="Restart Docker (daemon.json changed keys it reads only at start)",
        ctx=ctx,
        commands=["systemctl restart docker"],
        what=what,
        force=bool(restart),
        reason="daemon.json: nothing that needs a restart",
    )
    on_change(
        name="Reload Docker (daemon.json changed keys it reloads)",
        commands=["systemctl reload docker"],
        gates=[daemon] if keys and not restart else [],
        reason="daemon.json: nothing to reload",
    )
