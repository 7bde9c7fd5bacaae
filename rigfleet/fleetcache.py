"""The fleet cache: what a cache host serves and how the fleet's hosts reach it.

A host of inventory group ``caches`` runs Docker's registry in proxy (pull-through) mode for
``cache_registry_upstream`` and nginx serving the model revisions it fetched and verified,
read-only, as ``http://<cache_address>:<cache_model_port>/<org>/<name>/<revision>/<file>``
(``model_path``). Rigs fetch weights from the caches first, then from their ``hf_endpoint``,
and verify every file's sha256 against the pinned revision's listing either way
(files/rigfleet-fetch-weights.py ``--mirror``); docs/images.md.

Example::

    render_registry_config(settings)           # /etc/docker/registry/config.yml
    render_nginx_site(settings)                # /etc/nginx/conf.d/rigfleet-cache.conf
    warm_command(5000, "vllm/vllm-openai", digest, marker)   # the pin through the cache
    model_path("/srv/c", "org/m", "ab" * 20)   # /srv/c/org/m/abab...
    model_mirrors(host.inventory)              # ('http://lb1.lan:8081',)
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Iterable
from typing import Any

from rigfleet.hostdata import CacheSettings, HostDataError, validate_cache
from rigfleet.inventory import host_kind

REGISTRY_CONFIG = "/etc/docker/registry/config.yml"
# Debian's docker-registry package: its storage (owned by its user) and its unit's name.
REGISTRY_STORAGE = "/var/lib/docker-registry"
REGISTRY_SERVICE = "docker-registry"
NGINX_SITE = "/etc/nginx/conf.d/rigfleet-cache.conf"
# nginx's log of what the model cache served (one line per request: bytes, status, path).
MODEL_LOG = "/var/log/nginx/rigfleet-cache.log"


def model_path(model_dir: str, repo: str, revision: str) -> str:
    """Where the cache keeps one verified revision: ``<model_dir>/<org>/<name>/<revision>``
    (the URL path under the model cache is the same, below ``model_dir``)."""
    return posixpath.join(model_dir, repo, revision)


def render_registry_config(settings: CacheSettings) -> str:
    """Docker's registry (distribution 2.x) as a pull-through cache of the upstream: no auth
    (Debian's packaged config turns htpasswd on; the cache serves public, pinned images and
    proxy mode refuses pushes), every address on ``cache_registry_port``, the access log on
    (bytes served per request, in the journal)."""
    return (
        "# Managed by rigfleet (roles/cache.py): a pull-through cache; docs/images.md.\n"
        "version: 0.1\n"
        "log:\n"
        "  level: info\n"
        "  accesslog:\n"
        "    disabled: false\n"
        "storage:\n"
        "  filesystem:\n"
        f"    rootdirectory: {REGISTRY_STORAGE}\n"
        "  delete:\n"
        "    enabled: true\n"
        "http:\n"
        f"  addr: :{settings.registry_port}\n"
        "proxy:\n"
        f"  remoteurl: {settings.registry_upstream}\n"
    )


def render_nginx_site(settings: CacheSettings) -> str:
    """nginx serving ``cache_model_dir`` read-only on ``cache_model_port``: GET and HEAD only,
    no listing, nothing under a dot name (partial downloads, manifests, the hub client's
    metadata); one log line per request with the bytes sent."""
    return (
        "# Managed by rigfleet (roles/cache.py): the model cache, verified revisions only;\n"
        "# docs/images.md.\n"
        "log_format rigfleet_cache '$time_iso8601 $remote_addr $status $body_bytes_sent "
        "$request_method $uri';\n"
        "server {\n"
        f"    listen {settings.model_port};\n"
        f"    root {settings.model_dir};\n"
        f"    access_log {MODEL_LOG} rigfleet_cache;\n"
        "    autoindex off;\n"
        "    location ~ /\\. {\n"
        "        return 404;\n"
        "    }\n"
        "    location / {\n"
        "        limit_except GET {\n"
        "            deny all;\n"
        "        }\n"
        "        try_files $uri =404;\n"
        "    }\n"
        "}\n"
    )


# What a registry answers a manifest request with, most specific last (index, then image).
MANIFEST_TYPES = ",".join((
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
))


def warm_command(port: int, path: str, digest: str, marker: str) -> str:
    """Pull one pinned image through the cache on its own host (the linux/amd64 manifest,
    its config and layers to /dev/null), so the rigs find it there; ``marker`` is written
    when every blob came through (the next converge skips it).

    + path: the repository path in the upstream (``vllm/vllm-openai``); digest: the pin
    """
    base = shlex.quote(f"http://127.0.0.1:{port}/v2/{path}")
    accept = shlex.quote(f"Accept: {MANIFEST_TYPES}")
    amd64 = ('.manifests[]? | select(.platform.os == "linux" and .platform.architecture == '
             '"amd64") | .digest')
    return (
        "set -e; "
        f"idx=$(curl -fsS -H {accept} {base}/manifests/{shlex.quote(digest)}); "
        f"m=$(printf '%s' \"$idx\" | jq -r {shlex.quote(amd64)} | head -n 1); "
        f'if [ -n "$m" ]; then man=$(curl -fsS -H {accept} {base}/manifests/"$m"); '
        'else man=$idx; fi; '
        "for b in $(printf '%s' \"$man\" | jq -r '.config.digest, .layers[].digest'); do "
        f'curl -fsS -o /dev/null {base}/blobs/"$b"; done; '
        f"install -d -m 0755 {shlex.quote(posixpath.dirname(marker))}; "
        f"touch {shlex.quote(marker)}"
    )


def cache_settings(inventory: Iterable[Any]) -> list[CacheSettings]:
    """The valid cache hosts of the inventory (``host.inventory`` or ``InventoryHost``s), in
    order. A cache host whose data does not validate is left out here: its own preflight
    refuses it, naming the problem, and the rigs fetch upstream."""
    out: list[CacheSettings] = []
    for other in inventory:
        if not host_kind(other.groups).cache:
            continue
        try:
            out.append(validate_cache(other.name, other.data))
        except HostDataError:
            continue
    return out


def model_mirrors(inventory: Iterable[Any]) -> tuple[str, ...]:
    """The model caches' URLs as the fleet's hosts reach them, in inventory order."""
    return tuple(c.model_url for c in cache_settings(inventory))
