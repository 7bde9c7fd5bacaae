"""``rigfleet pins lock``: fill in what a pins file cannot know by hand.

Image digests come from the registry's v2 API (what the tag points at now), the model's full
commit from the hub's revision API. Everything else in the file is left as written::

    rigfleet pins lock --pins pins.yaml            # Docker Hub and huggingface.co
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

from rigfleet.pins import UNRESOLVED, GenesisPin, Pins, load_pins, save_pins, with_resolved
from rigfleet.registry import Registry


def hub_revision(hub_url: str, repo: str, ref: str = "main", timeout: float = 15) -> str:
    """The full commit that ``ref`` of model ``repo`` points at on the hub."""
    url = f"{hub_url.rstrip('/')}/api/models/{repo}/revision/{ref}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            sha = json.load(resp).get("sha", "")
    except urllib.error.URLError as exc:
        raise RuntimeError(f"{url}: cannot resolve the model revision ({exc})") from None
    if len(sha) != 40:
        raise RuntimeError(f"{url}: the hub answered no full commit (sha={sha!r})")
    return sha


def resolve(pins: Pins, registry: Registry, hub_url: str, refresh: bool = False) -> Pins:
    """``pins`` with unresolved (or, with ``refresh``, all) digests and revision looked up."""
    digests = {
        name: registry.digest(stack.repository, stack.tag)
        for name, stack in pins.stacks.items()
        if refresh or stack.digest == UNRESOLVED
    }
    revision = None
    if refresh or pins.model.revision == UNRESOLVED:
        revision = hub_revision(hub_url, pins.model.repo)
    return with_resolved(pins, digests, revision)


def lock(path: str | Path, registry_url: str, hub_url: str) -> list[str]:
    """Resolve and save; returns one line per change (empty when nothing was unresolved)."""
    pins = load_pins(path, allow_unresolved=True)
    if not pins.unresolved():
        return []
    new = resolve(pins, Registry(registry_url), hub_url)
    changes = [f"{k}: {UNRESOLVED} -> resolved" for k in pins.unresolved()]
    save_pins(new, {"action": "lock", "changes": changes})
    return changes


def with_genesis(pins: Pins, repo: str, commit: str) -> Pins:
    """``pins`` with every Genesis-using stack pointed at ``repo`` at ``commit``."""
    stacks = {
        name: replace(s, genesis=GenesisPin(repo, commit)) if s.genesis else s
        for name, s in pins.stacks.items()
    }
    return replace(pins, stacks=stacks)
