"""Docker Engine + Compose v2, daemon.json merged (never overwritten): a change Docker reloads
(``RELOADABLE``) is reloaded, any other restarts it, in a window (docs/converge.md)."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.operations import files

from rigfleet.commands import apt as apt_commands
from rigfleet.facts import DockerDaemonJson, read_fact, read_paths
from rigfleet.fleetcache import cache_settings
from rigfleet.hostdata import AptRepo
from rigfleet.packages import OsInfo
from roles import maintenance
from roles.ops import apt_keyring, apt_packages, enabled_running, fail, on_change, root_put
from roles.preflight import HostContext

DAEMON_JSON = "/etc/docker/daemon.json"

# Docker's repository for Debian 12 (no Compose v2 in bookworm) unless host data has one.
DOCKER_DEBIAN_REPO = AptRepo(
    name="docker", url="https://download.docker.com/linux/debian",
    key_url="https://download.docker.com/linux/debian/gpg", suite="{codename}",
    components=("stable",), key_fingerprint="9DC858229FC7DD38854AE2D88D81803C0EBFCD88")

# Container logs are kept, but bounded: vLLM logs every request at INFO.
LOG_OPTS = {"max-size": "100m", "max-file": "5"}
# Containers in cgroupfs cgroups keep their GPUs across a daemon-reload (toolkit#48).
CGROUP_DRIVER_OPT = "native.cgroupdriver=cgroupfs"
# What dockerd applies on SIGHUP (moby daemon/reload.go); every other key is read at start.
RELOADABLE = frozenset("debug labels live-restore max-concurrent-downloads max-concurrent-uploads "
                       "max-download-attempts shutdown-timeout insecure-registries "
                       "registry-mirrors runtimes default-runtime".split())


def docker_packages(os: OsInfo) -> tuple[str, ...]:
    if os.id == "debian" and os.version_id == "12":
        return ("docker-ce", "docker-ce-cli", "containerd.io", "docker-compose-plugin")
    if os.id == "debian":
        return ("docker.io", "docker-cli", "docker-compose")
    return ("docker.io", "docker-compose-v2")


def daemon_settings(registry_mirror: str | None, insecure: Sequence[str] = ()) -> dict[str, Any]:
    """The keys rigfleet owns in daemon.json; ``insecure``: the fleet caches' registries."""
    settings: dict[str, Any] = {"log-driver": "json-file", "log-opts": dict(LOG_OPTS),
                                "live-restore": True, "exec-opts": [CGROUP_DRIVER_OPT]}
    if registry_mirror:
        settings["registry-mirrors"] = [registry_mirror]
    if insecure:
        settings["insecure-registries"] = list(insecure)
    return settings


def merge_daemon_config(current: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """``current`` with ``settings`` merged, by key and by item; keys rigfleet does not own stay."""
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
    return sorted(k for k in set(current) | set(merged) if current.get(k) != merged.get(k))


def restart_keys(keys: list[str]) -> list[str]:
    return [k for k in keys if k not in RELOADABLE]


@operation()
def daemon_json(settings: dict[str, Any]):
    """Merge ``settings`` into daemon.json; upload only when the JSON differs."""
    current = read_fact(DockerDaemonJson)
    if current.error:
        yield from fail(f"{host.name}: {current.error}; fix or remove it, then re-run")
        return
    merged = merge_daemon_config(current.config, settings)
    if current.exists and merged == current.config:
        host.noop(f"{DAEMON_JSON} already has {', '.join(sorted(settings))}")
        return
    text = json.dumps(merged, indent=2, sort_keys=True) + "\n"
    yield from files.put._inner(src=io.StringIO(text), dest=DAEMON_JSON, user="root",
                                group="root", mode="0644")


def add_apt_repo(name: str, repo: AptRepo, also: Sequence[str] = ()) -> None:
    """Keyring + sources file for ``repo`` (``also``: read with them, one round trip)."""
    keyring = apt_commands.keyring_path(repo.key_url)
    sources = f"{apt_commands.SOURCES_DIR}/rigfleet-{repo.name}.sources"
    read_paths([sources, *also])
    apt_keyring(name=f"{name}: signing key {keyring}", key_url=repo.key_url, dest=keyring,
                fingerprint=repo.key_fingerprint)
    text = apt_commands.deb822_sources(repo.url, repo.suite, repo.components, keyring)
    root_put(name=f"{name}: apt source", src=io.StringIO(text), dest=sources)


def reload_detaches_gpus(ctx: HostContext) -> bool:
    """(Preparing) would a daemon-reload later in this run take the serving container's GPUs?"""
    if not maintenance.serves(ctx):
        return False
    opts = read_fact(DockerDaemonJson).config.get("exec-opts")  # {} when not JSON
    if isinstance(opts, list) and CGROUP_DRIVER_OPT in opts:
        return False
    planned = maintenance.book().steps.get(ctx.want.name, [])
    return not any(s.startswith("Docker restart") for s in planned)


@deploy("Docker")
def docker(ctx: HostContext) -> None:
    os = ctx.os
    if os.id == "debian" and os.version_id == "12":
        repo = ctx.want.settings.apt_repos.get("docker") or DOCKER_DEBIAN_REPO
        add_apt_repo("Docker", repo.expand(os_id=os.id, version_id=os.version_id,
                                           codename=os.codename))
    apt_packages(name="Install Docker Engine and Compose v2", packages=list(docker_packages(os)))
    caches = tuple(urlsplit(c.registry_url).netloc for c in cache_settings(host.inventory))
    settings = daemon_settings(ctx.want.settings.docker_registry_mirror, caches)
    current = read_fact(DockerDaemonJson)  # an error: daemon_json fails the host with it
    keys = [] if current.error else changed_keys(current.config,
                                                 merge_daemon_config(current.config, settings))
    restart = restart_keys(keys)
    daemon = daemon_json(
        name=f"Merge {DAEMON_JSON} (log rotation, registry mirror, live-restore, cgroupfs)",
        settings=settings)
    enabled_running(name="Docker enabled and running", service="docker")
    what = f"Docker restart (daemon.json: {', '.join(restart)})"
    maintenance.plan_step(ctx, what, bool(restart))
    on_change(name="Restart Docker (daemon.json changed keys it reads only at start)",
              commands=["systemctl restart docker"], window=lambda: maintenance.enter(ctx, what),
              force=bool(restart), reason="daemon.json: nothing that needs a restart")
    on_change(name="Reload Docker (daemon.json changed keys it reloads)",
              commands=["systemctl reload docker"],
              gates=[daemon] if keys and not restart else [],
              reason="daemon.json: nothing to reload")
