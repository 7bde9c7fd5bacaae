"""The fleet cache (group ``caches``, docs/images.md): a registry proxy for images and nginx for
verified model revisions; what it serves and how hosts reach it::

    seed_command(upstream, "vllm/vllm-openai", digest, warm_marker(digest))  # the pin, cached
    model_mirrors(host.inventory)              # ('http://lb1.lan:8081',)
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Iterable
from contextlib import suppress
from typing import Any

from rigfleet.hostdata import CacheSettings, HostDataError, validate_cache
from rigfleet.hostside.layout import HOST
from rigfleet.inventory import host_kind

REGISTRY_CONFIG = "/etc/docker/registry/config.yml"
# Debian's docker-registry package: its storage (its user's), unit, binary and the unit's user.
REGISTRY_STORAGE = "/var/lib/docker-registry"
REGISTRY_SERVICE = "docker-registry"
REGISTRY_BINARY = "/usr/bin/docker-registry"
REGISTRY_USER = "docker-registry"
NGINX_SITE = "/etc/nginx/conf.d/rigfleet-cache.conf"
# nginx's log of what the model cache served (one line per request: bytes, status, path).
MODEL_LOG = "/var/log/nginx/rigfleet-cache.log"
_LOG_FIELDS = "$time_iso8601 $remote_addr $status $body_bytes_sent $request_method $uri"


def model_path(model_dir: str, repo: str, revision: str) -> str:
    """``<model_dir>/<org>/<name>/<revision>``, on disk and as the model cache's URL path."""
    return posixpath.join(model_dir, repo, revision)


def render_registry_config(settings: CacheSettings) -> str:
    """The pull-through cache's registry config: no auth (Debian's packaged one turns htpasswd
    on; the cache serves public, pinned images and proxy mode refuses pushes)."""
    return f"""\
# Managed by rigfleet (roles/cache.py): a pull-through cache; docs/images.md.
version: 0.1
log:
  level: info
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: {REGISTRY_STORAGE}
  delete:
    enabled: true
http:
  addr: :{settings.registry_port}
proxy:
  remoteurl: {settings.registry_upstream}
"""


def render_nginx_site(settings: CacheSettings) -> str:
    """nginx serving ``cache_model_dir`` read-only on ``cache_model_port`` (docs/images.md); of
    IPv6 too where the hosts reach the cache at an IPv6 address (``listen PORT`` is IPv4's)."""
    v6 = f"\n    listen [::]:{settings.model_port};" if ":" in settings.address else ""
    return f"""\
# Managed by rigfleet (roles/cache.py): the model cache, verified revisions only;
# docs/images.md.
log_format rigfleet_cache '{_LOG_FIELDS}';
server {{
    listen {settings.model_port};{v6}
    root {settings.model_dir};
    access_log {MODEL_LOG} rigfleet_cache;
    autoindex off;
    location ~ /\\. {{
        return 404;
    }}
    location / {{
        limit_except GET {{
            deny all;
        }}
        try_files $uri =404;
    }}
}}
"""


# The seeding registry: a second registry process on a root-only socket over the proxy's
# storage, the only way in for blobs the cache fetched itself (proxy mode refuses pushes).
SEED_CONFIG = "/etc/docker/registry/rigfleet-seed.yml"
SEED_SERVICE = "rigfleet-cache-seed"
SEED_UNIT = f"/etc/systemd/system/{SEED_SERVICE}.service"
SEED_SOCKET = f"/run/{SEED_SERVICE}/registry.sock"


def render_seed_config() -> str:
    """The seeding registry: the proxy's storage, no proxy, the unix socket ``SEED_SOCKET``."""
    return f"""\
# Managed by rigfleet (roles/cache.py): seeds the pull-through cache's storage;
# docs/images.md.
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {REGISTRY_STORAGE}
http:
  net: unix
  addr: {SEED_SOCKET}
"""


def render_seed_unit() -> str:
    """The seeding registry's unit: started by a seed, stopped after it (never enabled)."""
    return f"""\
# Managed by rigfleet (roles/cache.py); docs/images.md.
[Unit]
Description=rigfleet: the fleet cache's seeding registry (root-only socket)
After={REGISTRY_SERVICE}.service
[Service]
User={REGISTRY_USER}
Group={REGISTRY_USER}
RuntimeDirectory={SEED_SERVICE}
RuntimeDirectoryMode=0700
ExecStart={REGISTRY_BINARY} serve {SEED_CONFIG}
"""


def warm_marker(digest: str) -> str:
    """The file on a cache host saying every blob of ``digest`` is held."""
    return f"{HOST.state_dir}/cache-warm/{digest.replace(':', '-')}"


SEED_SCRIPT = str(HOST.script("rigfleet-cache-seed.py"))


def seed_command(upstream: str, path: str, digest: str, marker: str) -> str:
    """Seed one pinned image's blobs from ``upstream``; ``marker`` is written once all are held."""
    seed = (f"python3 {SEED_SCRIPT} --upstream {shlex.quote(upstream)} "
            f"--socket {SEED_SOCKET} --spool {shlex.quote(str(HOST.state_dir / 'cache-spool'))} "
            f"--repo {shlex.quote(path)} --digest {shlex.quote(digest)} "
            f"--marker {shlex.quote(marker)}")
    return (f"systemctl start {SEED_SERVICE} && {{ {seed}; rc=$?; "
            f"systemctl stop {SEED_SERVICE}; exit $rc; }}")


def validate_cache_host(name: str, groups: Iterable[str], data: Any) -> CacheSettings:
    """``validate_cache`` given the ports the host's other services take; ``HostDataError``."""
    return validate_cache(name, data, host_kind(groups))


def cache_settings(inventory: Iterable[Any]) -> list[CacheSettings]:
    """The valid cache hosts of the inventory (``host.inventory`` or ``InventoryHost``s), in
    order; one its own preflight refuses is left out (the rigs fetch upstream)."""
    out = []
    for other in inventory:
        if host_kind(other.groups).cache:
            with suppress(HostDataError):
                out.append(validate_cache_host(other.name, other.groups, other.data))
    return out


def model_mirrors(inventory: Iterable[Any]) -> tuple[str, ...]:
    """The model caches' URLs as the fleet's hosts reach them, in inventory order."""
    return tuple(c.model_url for c in cache_settings(inventory))


# --- peers: no cache, the first rig that holds a pinned thing serves it (docs/images.md) ---

PEER_SCRIPT = str(HOST.script("rigfleet-peer-serve.py"))
PEER_UNIT = "rigfleet-peer-serve"
PEER_IDLE_S = 300  # the peer server stops after this long without a request


def peer_serve_command(port: int, model_dir: str, repositories: Iterable[str]) -> str:
    """Install the peer server from stdin, start it (a transient unit) unless it runs; wait."""
    images = "".join(f" --repository {shlex.quote(r)}" for r in sorted(set(repositories)))
    probe = shlex.quote(f"import socket; socket.create_connection(('127.0.0.1', {port}), 1)")
    part = f"{shlex.quote(PEER_SCRIPT)}.$$.part"  # two peers may send it at once
    return (
        f"install -d -m 0755 {shlex.quote(posixpath.dirname(PEER_SCRIPT))} && cat > {part} && "
        f"chmod 0755 {part} && mv -f {part} {PEER_SCRIPT} || exit 1; "
        f"systemctl is-active --quiet {PEER_UNIT} || systemd-run --quiet --collect "
        f"--unit {PEER_UNIT} python3 {PEER_SCRIPT} --port {port} --model-dir "
        f"{shlex.quote(model_dir)} --idle {PEER_IDLE_S}{images}; "
        f"for i in $(seq 50); do python3 -c {probe} 2>/dev/null && exit 0; sleep 0.2; done; "
        "exit 1"
    )


def peer_image_command(url: str, image_id: str, image: str, record: str, fallback: str,
                       mark: str) -> str:
    """Load ``image_id`` from the peer at ``url``, check it and write it to ``record`` (a load
    has no RepoDigests); else say so on stderr after ``mark`` and run ``fallback``."""
    note = shlex.quote(f"{mark}{image}: the load from peer {url} failed; fetching from the "
                       "host's own source instead")
    load = (f"curl -fsS {shlex.quote(f'{url}/images/{image_id}')} | docker load -q >/dev/null "
            f"&& docker image inspect {shlex.quote(image_id)} >/dev/null && "
            f"docker tag {shlex.quote(image_id)} {shlex.quote(image)} && "
            f"mkdir -p {shlex.quote(posixpath.dirname(record))} && "
            f"printf '%s\\n' {shlex.quote(image_id)} > {shlex.quote(record + '.tmp')} && "
            f"mv -f {shlex.quote(record + '.tmp')} {shlex.quote(record)}")
    return f"{{ {load}; }} || {{ echo {note} >&2; {fallback}; }}"
