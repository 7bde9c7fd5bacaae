"""Render one stack's compose file from the catalog, the pins and the host's settings: a
deterministic text (its config-hash label and weights mount: docs/converge.md)::

    text = render_document(compose_document(builtin_catalog().get("int8"), pins, settings))
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import yaml

from rigfleet.catalog import VLLM_PORT_IN_CONTAINER, StackSpec
from rigfleet.genesis_inspect import GENERATIONS
from rigfleet.hostdata import HostSettings
from rigfleet.hostside.layout import (
    CONFIG_HASH_LABEL,
    HOST,
    WEIGHTS_REVISION_CHARS,
    WEIGHTS_REVISION_MARK,
)
from rigfleet.pins import LOCK_HINT, UNRESOLVED, Pins, PinsError
from rigfleet.runtime_image import RuntimeImage

SERVICE = "vllm"
LABEL_PREFIX = "io.rigfleet"

_HEADER = (
    "# Managed by rigfleet (rigfleet/compose.py): rendered from the stack catalog, pins.yaml\n"
    "# and this host's inventory data. Local edits are overwritten by the next deploy.\n"
    "# Secrets come from env_file only. '$$' is a literal '$' (Compose interpolation).\n"
)


def compose_document(spec: StackSpec, pins: Pins, host: HostSettings) -> dict[str, Any]:
    """The compose file as data (escaped, labelled, hashed); ``render_document`` dumps it."""
    stack_pins = pins.stack(spec.name)
    if stack_pins.digest == UNRESOLVED:
        raise PinsError(f"{pins.path}: stacks.{spec.name}.digest: is {UNRESOLVED!r}; {LOCK_HINT}")
    model = pins.model_for(spec.model)
    if model.revision == UNRESOLVED:
        raise PinsError(f"{pins.path}: {model.key}.revision: is {UNRESOLVED!r}; {LOCK_HINT}")
    if spec.genesis is not None and stack_pins.genesis is None:
        raise PinsError(f"{pins.path}: stacks.{spec.name}.genesis: missing; the stack needs it")

    generation = stack_pins.genesis.layout if stack_pins.genesis is not None else None
    layout = GENERATIONS[generation] if generation else None
    environment = spec.environment(generation)
    # Host extras last: they may override catalog values (the testbed injects faults so).
    environment.update(sorted(host.env_for(spec.name).items()))

    local_dir = model.local_dir
    weights = HOST.weights_dir(host.model_dir, local_dir, model.revision)
    volumes = [f"{weights}:{spec.model_path(local_dir)}:ro"]
    volumes += [f"{src}:{dst}" for src, dst in spec.cache_dirs.items()]
    if spec.genesis is not None and stack_pins.genesis is not None and layout is not None:
        tree = str(HOST.genesis_tree(stack_pins.genesis.commit))
        volumes.append(f"{layout.mount_source(tree)}:{layout.mount_target}:ro")

    labels = {
        f"{LABEL_PREFIX}.stack": spec.name,
        f"{LABEL_PREFIX}.image-digest": stack_pins.digest,
        f"{LABEL_PREFIX}.vllm-version": stack_pins.vllm_version,
        f"{LABEL_PREFIX}.model-revision": model.revision,
    }
    if stack_pins.genesis is not None:
        # A Genesis bump must recreate the container (patches live in its writable layer).
        labels[f"{LABEL_PREFIX}.genesis-commit"] = stack_pins.genesis.commit

    runtime = RuntimeImage.for_stack(spec, stack_pins)
    service: dict[str, Any] = {
        # As the deploy staged and verified it; never pulled here (docs/swap.md).
        "image": runtime.ref if runtime else stack_pins.image,
        "container_name": spec.container_name,
        # Never restarted in place: the supervisor recreates a dead engine (docs/swap.md).
        "restart": "no",
        "entrypoint": list(spec.entrypoint(layout if spec.genesis else None)),
        "command": spec.command(local_dir),
        "environment": environment,
        "env_file": [str(HOST.vllm_env_file)],
        "ports": [f"127.0.0.1:{spec.port}:{VLLM_PORT_IN_CONTAINER}"],
        "volumes": volumes,
        "shm_size": "16gb",
        "ipc": "host",
        "deploy": {"resources": {"reservations": {
            "devices": [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]}}},
        "labels": labels,
        "pull_policy": "never",
    }
    doc = _escape({"name": spec.compose_project, "services": {SERVICE: service}})
    doc["services"][SERVICE]["labels"][CONFIG_HASH_LABEL] = config_hash(doc)
    return doc


def render_document(doc: Mapping[str, Any]) -> str:
    """A compose document (``compose_document``) as the YAML text the deploy writes."""
    return _HEADER + yaml.dump(dict(doc), Dumper=_Dumper, sort_keys=False,
                               default_flow_style=False, allow_unicode=True, width=100)


def config_hash(doc: dict[str, Any]) -> str:
    """A short, stable hash of a ``compose_document``, without its own label and the weights
    volume's ``@<revision>`` suffix (the revision's label is hashed)."""
    copy = json.loads(json.dumps(doc))
    for service in copy["services"].values():
        labels = service["labels"]
        labels.pop(CONFIG_HASH_LABEL, None)
        revision = labels[f"{LABEL_PREFIX}.model-revision"]
        suffix = WEIGHTS_REVISION_MARK + revision[:WEIGHTS_REVISION_CHARS]
        for i, (source, sep, rest) in enumerate(v.partition(":") for v in service["volumes"]):
            if sep and source.endswith(suffix):
                service["volumes"][i] = f"{source.removesuffix(suffix)}:{rest}"
    canonical = json.dumps(copy, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _escape(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("$", "$$")
    if isinstance(value, dict):
        return {k: _escape(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_escape(v) for v in value]
    return value


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, no anchors/aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True

    def represent_str(self, data: str) -> yaml.ScalarNode:
        return self.represent_scalar("tag:yaml.org,2002:str", data,
                                     style="|" if "\n" in data else None)


_Dumper.add_representer(str, _Dumper.represent_str)
