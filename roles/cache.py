"""The fleet cache: a pull-through Docker registry, nginx serving model files (docs/images.md)."""

from __future__ import annotations

import io
from dataclasses import dataclass

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.facts.files import File

from rigfleet.balancer.plan import read_fleet
from rigfleet.desired import load_desired
from rigfleet.facts import read_fact
from rigfleet.fleetcache import (
    NGINX_SITE,
    REGISTRY_CONFIG,
    REGISTRY_SERVICE,
    SEED_CONFIG,
    SEED_SCRIPT,
    SEED_UNIT,
    model_path,
    render_nginx_site,
    render_registry_config,
    render_seed_config,
    render_seed_unit,
    seed_command,
    validate_cache_host,
    warm_marker,
)
from rigfleet.hostdata import CacheSettings
from rigfleet.pins import ModelPin
from rigfleet.registry import registry_of, split_image
from rigfleet.resources import project_file
from roles.front import DEFAULT_SITE, site_disabled
from roles.ops import Secret, apt_packages, enabled_running, on_change, root_dir, root_put
from roles.preflight import PreflightError, check_service_os, preflight_of, read_secret
from roles.weights import fetch_weights, fetcher


@dataclass(frozen=True)
class CacheContext:
    settings: CacheSettings
    models: tuple[ModelPin, ...]
    hf_hub_version: str
    hf_token: Secret | None = None
    gpu_host: bool = False
    # (repository path, digest) of every pinned Docker Hub image the GPU hosts stage.
    images: tuple[tuple[str, str], ...] = ()


def _check_cache(name: str, gpu_host: bool) -> CacheContext:
    """A cache host: its data, every GPU host's (their pins), the OS, systemd."""
    settings = validate_cache_host(name, host.groups, host.data)
    wants = read_fleet(name, "caches", "the revisions to cache cannot be read", host.inventory,
                       lambda each, kind: load_desired(each.name, each.data) if kind.gpu else None)
    if not wants:
        raise PreflightError(f"{name}: caches: the inventory has no GPU host to cache for; "
                             "allowed: a cache beside at least one GPU host")
    models: dict[tuple[str, str], ModelPin] = {}
    images: set[tuple[str, str]] = set()
    for want in wants:
        for model in want.pins.all_models.values():
            models.setdefault((model.repo, model.revision), model)
        for stack in want.stacks.values():
            registry, path = registry_of(split_image(stack.pins.image)[0])
            if registry is None:  # the cache pulls through for Docker Hub's names only
                images.add((path, stack.pins.digest))
    check_service_os(name)
    token = (read_secret(name, "hf_token_file", settings.hf_token_file)
             if settings.hf_token_file else None)
    return CacheContext(settings, tuple(models[k] for k in sorted(models)),
                        max(w.pins.hf_hub_version for w in wants), token, gpu_host,
                        tuple(sorted(images)))


preflight_cache = preflight_of("Preflight (cache)", _check_cache)


@operation()
def image_warm(path: str, digest: str, upstream: str):
    """Seed the pinned image ``path@digest`` from ``upstream`` into the cache, once."""
    marker = warm_marker(digest)
    if read_fact(File, path=marker):
        host.noop(f"{path}@{digest[:19]} is in the cache")
        return
    yield seed_command(upstream, path, digest, marker)


@deploy("Cache (pull-through registry, model files)")
def cache(ctx: CacheContext) -> None:
    """The registry bound before its package starts it, the revisions fetched and served."""
    s = ctx.settings
    root_dir(name="Directory /etc/docker/registry", path="/etc/docker/registry")
    registry_conf = root_put(
        name=f"{REGISTRY_CONFIG} (pull-through cache of {s.registry_upstream}; before the "
             "package starts it)",
        src=io.StringIO(render_registry_config(s)), dest=REGISTRY_CONFIG)
    apt_packages(name="Install docker-registry and nginx", packages=["docker-registry", "nginx"])
    enabled_running(name=f"{REGISTRY_SERVICE} enabled and running", service=REGISTRY_SERVICE)
    on_change(name=f"Restart {REGISTRY_SERVICE} (its config changed)",
              commands=[f"systemctl restart {REGISTRY_SERVICE}"], gates=[registry_conf],
              reason="config unchanged")
    seed_conf = root_put(name=f"{SEED_CONFIG} (the seeding registry: the same storage)",
                         src=io.StringIO(render_seed_config()), dest=SEED_CONFIG)
    seed_unit = root_put(name=f"{SEED_UNIT} (started only while seeding)",
                         src=io.StringIO(render_seed_unit()), dest=SEED_UNIT)
    on_change(name="systemd daemon-reload (the seeding unit changed)",
              commands=["systemctl daemon-reload"], gates=[seed_conf, seed_unit],
              reason="seeding unit unchanged")
    root_put(name="Cache seeding script", src=str(project_file("files/rigfleet-cache-seed.py")),
             dest=SEED_SCRIPT, mode="0755")
    for path, digest in host.loop(ctx.images):
        image_warm(name=f"Seed {path}@{digest[:19]} into the cache (each blob fetched once)",
                   path=path, digest=digest, upstream=s.registry_upstream)
    token_file = fetcher(s.model_dir, ctx.hf_hub_version, s.pip_index_url, ctx.hf_token)
    for model in host.loop(ctx.models):
        dest = model_path(s.model_dir, model.repo, model.revision)
        root_dir(name=f"Directory {dest.rsplit('/', 1)[0]}", path=dest.rsplit("/", 1)[0])
        fetch_weights(name=f"Fetch and verify {model.repo}@{model.revision[:12]} into the cache",
                      repo=model.repo, revision=model.revision, local_dir=dest,
                      token_file=token_file, endpoint=s.hf_endpoint)
    gates = [] if ctx.gpu_host else [  # a GPU host's front owns nginx's sites
        site_disabled(name=f"Disable nginx's default site {DEFAULT_SITE}", path=DEFAULT_SITE)]
    site = root_put(name=f"Model cache site {NGINX_SITE} (port {s.model_port})",
                    src=io.StringIO(render_nginx_site(s)), dest=NGINX_SITE)
    enabled_running(name="nginx enabled and running", service="nginx")
    on_change(name="Test and reload nginx (model cache changed)",
              commands=["nginx -t -q", "systemctl reload nginx"], gates=[site, *gates],
              reason="model cache unchanged")

