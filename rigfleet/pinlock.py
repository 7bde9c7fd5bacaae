"""``rigfleet pins lock``: fill in what a pins file cannot know by hand: digests and image ids
from the registry, model revisions from the hub, Genesis layouts and versions from the commit
(docs/pins.md). Nothing is written unless every lookup succeeds::

    rigfleet pins lock --pins pins.yaml            # Docker Hub and huggingface.co
    rigfleet pins lock --refresh                   # re-resolve every digest from its tag
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from rigfleet.bump.genesis import lock_genesis
from rigfleet.bump.journal import load_journal
from rigfleet.catalog import Catalog
from rigfleet.hub import Hub, HubError
from rigfleet.pins import UNRESOLVED, Pins, PinsError, StackPins, load_pins, save_pins
from rigfleet.registry import DOCKER_HUB, Registry, RegistryError, RegistryNotFound, registry_of
from rigfleet.vllm_versions import NIGHTLY_TAG

NIGHTLY_RETENTION = ("vLLM keeps only the 14 newest nightly-* tags on Docker Hub; release tags "
                     "stay")
SAVED_COPY = ("a release tag (vX.Y.Z), or import a saved copy (`rigfleet images import FILE`) "
              "and pin its digest and image id")


class LockError(PinsError):
    """A lookup for the pins failed; one line per key: what, where, and what to do."""


@dataclass
class _Resolver:
    """One lock run's registry lookups, each asked once (a tag never holds a digest's ':')."""

    registry: Registry
    file: str
    asked: dict[tuple[str, str, str], str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def ask(self, key: tuple[str, str, str], read: Callable[[], str], missing: str,
            failed: str) -> str | None:
        """``read()``'s answer, asked once per ``key``; None when it failed (the problem listed)."""
        try:
            if key not in self.asked:
                self.asked[key] = read()
            return self.asked[key]
        except RegistryNotFound:
            self.problems.append(missing)
        except RegistryError as e:
            self.problems.append(f"{failed}: {e}")
        return None

    def client(self, repository: str) -> tuple[Registry, str]:
        host, path = registry_of(repository)
        if host is None or self.registry.where != DOCKER_HUB:
            return self.registry, path
        return Registry(f"https://{host}", self.registry.timeout), path

    def stack(self, key: str, p: StackPins, refresh: bool) -> StackPins:
        """``p`` with its digest (when unresolved or ``refresh``) and image id filled in."""
        reg, path = self.client(p.repository)
        retention = f" ({NIGHTLY_RETENTION})" if NIGHTLY_TAG.fullmatch(p.tag) else ""
        digest: str | None = p.digest
        if refresh or digest == UNRESOLVED:
            digest = self.ask((reg.where, path, p.tag), lambda: reg.digest(path, p.tag),
                              f"{self.file}: {key}.image: {p.image} is not in "
                              f"{reg.where}{retention}; allowed: {SAVED_COPY}",
                              f"{self.file}: {key}.digest: cannot resolve {p.image}")
        image_id = p.image_id
        if digest is not None and (refresh or image_id is None or digest != p.digest):
            image_id = self.ask(
                (reg.where, path, digest), lambda: reg.resolve(path, digest).image_id,
                f"{self.file}: {key}.image_id: cannot be read: {p.repository}@{digest} is "
                f"not in {reg.where}{retention}; allowed: the image id of a saved "
                "copy (`rigfleet images import FILE` prints it), or " + SAVED_COPY,
                f"{self.file}: {key}.image_id: cannot read it for {p.repository}@{digest}")
        if digest is None or image_id is None:
            return p
        return replace(p, digest=digest, image_id=image_id)


def resolve(pins: Pins, registry: Registry, hub_url: str, refresh: bool = False,
            token_file: str | None = None) -> Pins:
    """``pins`` with unresolved (or, with ``refresh``, all) digests, every missing image id and
    the model revision looked up; raises ``LockError`` listing every lookup that failed."""
    r = _Resolver(registry, pins.path)
    stacks = {n: r.stack(f"stacks.{n}", p, refresh) for n, p in pins.stacks.items()}
    hosts = {h: {n: r.stack(f"hosts.{h}.stacks.{n}", p, refresh) for n, p in entries.items()}
             for h, entries in pins.hosts.items()}
    models = pins.all_models
    hub = Hub(hub_url, token_file)
    for repo, model in models.items():
        if refresh or model.revision == UNRESOLVED:
            try:
                models[repo] = replace(model, revision=hub.revision(repo, "main"))
            except HubError as e:
                r.problems.append(f"{pins.path}: {model.key}.revision: cannot resolve the "
                                  f"model revision: {e}")
    if r.problems:
        raise LockError(r.problems)
    return replace(pins, stacks=stacks, hosts=hosts, model=models[pins.model.repo],
                   models={repo: models[repo] for repo in pins.models})


def changes(old: Pins, new: Pins) -> list[str]:
    """One line per value ``resolve`` changed (``stacks.int8.digest: unresolved -> sha256:...``)."""
    entries = [(f"stacks.{n}", p, new.stacks[n]) for n, p in old.stacks.items()]
    entries += [(f"hosts.{h}.stacks.{n}", p, new.hosts[h][n])
                for h, stacks in old.hosts.items() for n, p in stacks.items()]
    out = [f"{key}.{attr}: {getattr(before, attr) or '(none)'} -> {getattr(after, attr)}"
           for key, before, after in entries for attr in ("digest", "image_id")
           if getattr(before, attr) != getattr(after, attr)]
    for repo, m in old.all_models.items():
        if m.revision != new.all_models[repo].revision:
            out.append(f"{m.key}.revision: {m.revision} -> {new.all_models[repo].revision}")
    return out


def lock(path: str | Path, registry_url: str, hub_url: str, refresh: bool = False,
         genesis_url: str | None = None, token_file: str | None = None,
         verify: Callable[[Pins], list[str]] | None = None,
         catalog: Catalog | None = None) -> list[str]:
    """Resolve and save (``verify``'s refusals stop it); one line per change. ``catalog``: the
    stacks the pins may name (the inventory's ``stacks_dir``; None: the built-in ones)."""
    pins = load_pins(path, allow_unresolved=True, catalog=catalog)
    journal = load_journal(pins, catalog)
    if journal is not None and journal.state == "open":  # saving would make it stale
        raise PinsError(
            f"{pins.path}: bump {journal.id} (started {journal.started} by {journal.by}) is "
            f"unfinished ({journal.path}); allowed: finish it (`rigfleet bump --yes`) or "
            "abandon it (`rigfleet bump --abandon`), then lock the pins")
    new = resolve(pins, Registry(registry_url), hub_url, refresh=refresh,
                  token_file=token_file)
    new, genesis_lines = lock_genesis(new, catalog, fetch_url=genesis_url)
    lines = changes(pins, new) + genesis_lines
    if verify is not None and (refusals := verify(new)):
        raise LockError([f"{pins.path}: {line}" for line in refusals]
                        + ["nothing written: every pinned thing must be there"])
    if lines:
        save_pins(new, {"action": "lock", "changes": lines})
    return lines
