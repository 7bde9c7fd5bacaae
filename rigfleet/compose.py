"""Render one stack's compose file from the catalog, the pins and the host's settings.

Each stack is its own compose project (``rigfleet-<stack>``) in
``Layout.compose_file(<stack>)`` on the host. The text is deterministic: the same inputs give
byte-identical output, so the deploy detects a change by comparing content, and the
``io.rigfleet.config-hash`` label lets it tell whether a *running* container was started from
the current file.

Choices that matter:

- ``image: <repo>:<tag>@<digest>``: Docker pulls by digest and ignores the tag, so the running
  container is provably the pinned build; the tag stays for people reading ``docker ps``.
- Loopback-only port (``127.0.0.1:<stack port>:8000``): the front proxy is the only way in.
- Secrets only through ``env_file`` (``Layout.vllm_env_file`` holds VLLM_API_KEY);
  nothing secret is ever in this file, so it can be logged, diffed and hashed.
- Every ``$`` is written ``$$``: Compose interpolates entrypoint, command and environment at
  parse time, which silently broke club-3090's entrypoints (#436).
- The weights are mounted read-only from the pinned revision's own directory
  (``Layout.weights_dir``), so a rollback's snapshot mounts the revision it served; caches
  per stack (never shared).

Example::

    from rigfleet.catalog import get_stack
    from rigfleet.compose import render_compose

    text = render_compose(get_stack("int8"), pins, settings)
    files.put(src=io.StringIO(text), dest=str(HOST.compose_file("int8")), mode="0644")
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import yaml

from rigfleet.catalog import VLLM_PORT_IN_CONTAINER, StackSpec
from rigfleet.genesis_layout import LAYOUTS, GenesisLayout
from rigfleet.hostdata import HostSettings
from rigfleet.hostside.layout import (
    CONFIG_HASH_LABEL,
    HOST,
    WEIGHTS_REVISION_CHARS,
    WEIGHTS_REVISION_MARK,
)
from rigfleet.pins import LOCK_HINT, UNRESOLVED, GenesisPin, Pins, PinsError
from rigfleet.runtime_image import RuntimeImage

SERVICE = "vllm"
LABEL_PREFIX = "io.rigfleet"

_HEADER = (
    "# Managed by rigfleet (rigfleet/compose.py): rendered from the stack catalog, pins.yaml\n"
    "# and this host's inventory data. Local edits are overwritten by the next deploy.\n"
    "# Secrets come from env_file only. '$$' is a literal '$' (Compose interpolation).\n"
)


def genesis_layout(pin: GenesisPin) -> GenesisLayout:
    """The layout of the pinned Genesis (v7.x: ``vllm/_genesis``; v12.x: ``sndr``)."""
    return LAYOUTS[pin.layout]


def compose_document(spec: StackSpec, pins: Pins, host: HostSettings) -> dict[str, Any]:
    """The compose file as data (escaped, labelled, hashed); ``render_compose`` dumps it.

    + spec: the stack (``rigfleet.catalog.get_stack``)
    + pins: validated, resolved pins (``rigfleet.pins.load_pins``)
    + host: the host's settings (``rigfleet.hostdata.validate_host``)

    **Example:**

    .. code:: python

        doc = compose_document(get_stack("int8"), pins, settings)
        doc["services"]["vllm"]["labels"]["io.rigfleet.config-hash"]
    """
    stack_pins = pins.stack(spec.name)
    if stack_pins.digest == UNRESOLVED:
        raise PinsError(f"{pins.path}: stacks.{spec.name}.digest: is {UNRESOLVED!r}; {LOCK_HINT}")
    model = pins.model_for(spec.model)
    if model.revision == UNRESOLVED:
        raise PinsError(f"{pins.path}: {model.key}.revision: is {UNRESOLVED!r}; {LOCK_HINT}")
    if spec.needs_genesis and stack_pins.genesis is None:
        raise PinsError(f"{pins.path}: stacks.{spec.name}.genesis: missing; the stack needs it")

    layout = genesis_layout(stack_pins.genesis) if stack_pins.genesis is not None else None
    environment = spec.environment(layout.generation if layout else None)
    # Host extras last: they may override catalog values (the testbed injects faults so).
    for name in sorted(host.env_for(spec.name)):
        environment[name] = host.env_for(spec.name)[name]

    local_dir = model.local_dir
    # The revision's own directory (never written once verified), not a moving path: the
    # active snapshot names the revision it served, so a rollback mounts the old files.
    weights = HOST.weights_dir(host.model_dir, local_dir, model.revision)
    volumes = [f"{weights}:{spec.model_path(local_dir)}:ro"]
    volumes += [f"{src}:{dst}" for src, dst in spec.cache_dirs.items()]
    if spec.needs_genesis and stack_pins.genesis is not None and layout is not None:
        tree = str(HOST.genesis_tree(stack_pins.genesis.commit))
        volumes.append(f"{layout.mount_source(tree)}:{layout.mount_target}:ro")

    labels = {
        f"{LABEL_PREFIX}.stack": spec.name,
        f"{LABEL_PREFIX}.image-digest": stack_pins.digest,
        f"{LABEL_PREFIX}.vllm-version": stack_pins.vllm_version,
        f"{LABEL_PREFIX}.model-revision": model.revision,
    }
    if stack_pins.genesis is not None:
        # In the label so a Genesis bump changes the file and the container is recreated:
        # patches live in the container's writable layer and must be re-applied from scratch.
        labels[f"{LABEL_PREFIX}.genesis-commit"] = stack_pins.genesis.commit

    runtime = RuntimeImage.for_stack(spec, stack_pins)
    service: dict[str, Any] = {
        # The image as the deploy staged and verified it (a Genesis stack: its derived image,
        # the pinned packages baked into the pinned image on the host); never pulled here: a
        # pull could fetch something else, and a loaded archive has no registry behind it.
        "image": runtime.ref if runtime else stack_pins.local_image,
        "container_name": spec.container_name,
        # Never restarted in place: Genesis text-patches vLLM in the container's writable
        # layer, so a restarted container fails to re-patch and one crash becomes a restart
        # loop. The host's supervisor (rigfleet/hostside/supervise.py) recreates a dead
        # engine from the verified snapshot instead, with a backoff and a limit.
        "restart": "no",
        "entrypoint": list(spec.entrypoint(layout if spec.needs_genesis else None)),
        "command": spec.command(local_dir),
        "environment": environment,
        "env_file": [str(HOST.vllm_env_file)],
        "ports": [f"127.0.0.1:{spec.port}:{VLLM_PORT_IN_CONTAINER}"],
        "volumes": volumes,
        "shm_size": "16gb",
        "ipc": "host",
        "deploy": {
            "resources": {
                "reservations": {
                    "devices": [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
                }
            }
        },
        "labels": labels,
    }
    service["pull_policy"] = "never"
    doc = _escape({"name": spec.compose_project, "services": {SERVICE: service}})
    labels = doc["services"][SERVICE]["labels"]
    labels[CONFIG_HASH_LABEL] = config_hash(doc)
    return doc


def render_compose(spec: StackSpec, pins: Pins, host: HostSettings) -> str:
    """Render the compose file of ``spec`` for ``host`` as YAML text (deterministic).

    + spec: the stack (``rigfleet.catalog.get_stack``)
    + pins: validated, resolved pins (``rigfleet.pins.load_pins``)
    + host: the host's settings (``rigfleet.hostdata.validate_host``)

    **Example:**

    .. code:: python

        text = render_compose(get_stack("tq3-mtp-genesis"), pins, settings)
        assert text == render_compose(get_stack("tq3-mtp-genesis"), pins, settings)
    """
    return render_document(compose_document(spec, pins, host))


def render_document(doc: Mapping[str, Any]) -> str:
    """A compose document (``compose_document``) as the YAML text the deploy writes."""
    body = yaml.dump(
        dict(doc),
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=100,
    )
    return _HEADER + body


def config_hash(doc: dict[str, Any]) -> str:
    """A short, stable hash of a compose document, ignoring its own config-hash label.

    The weights volume is hashed without its revision suffix (``weights_identity``): the
    revision's directory is a function of the model dir, the local dir and the revision, all
    of which the hash covers anyway (the volume's other parts, ``--model``, the
    ``model-revision`` label), so no change goes unseen; and a container started from a compose
    file of before per-revision directories (``<model_dir>/<local_dir>``, same revision) has
    this same hash, so adopting its directory swaps nothing (docs/converge.md).
    """
    copy = json.loads(json.dumps(doc))
    for service in copy.get("services", {}).values():
        labels = service.get("labels", {})
        labels.pop(CONFIG_HASH_LABEL, None)
        revision = labels.get(f"{LABEL_PREFIX}.model-revision")
        if isinstance(revision, str) and isinstance(service.get("volumes"), list):
            service["volumes"] = [weights_identity(v, revision) for v in service["volumes"]]
    canonical = json.dumps(copy, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def weights_identity(volume: Any, revision: str) -> Any:
    """``<dir>/<local_dir>@<revision[:12]>:<target>:ro`` as ``<dir>/<local_dir>:<target>:ro``
    (what the config hash sees); any other volume as it is."""
    if not isinstance(volume, str):
        return volume
    source, sep, rest = volume.partition(":")
    suffix = WEIGHTS_REVISION_MARK + revision[:WEIGHTS_REVISION_CHARS]
    if sep and source.endswith(suffix):
        return f"{source.removesuffix(suffix)}:{rest}"
    return volume


def _escape(value: Any) -> Any:
    # Compose interpolates ${VAR} and $VAR in every string value; '$$' is a literal '$'.
    if isinstance(value, str):
        return value.replace("$", "$$")
    if isinstance(value, dict):
        return {k: _escape(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_escape(v) for v in value]
    return value


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks (the entrypoint script stays readable), no
    anchors/aliases (Compose would accept them, people reading the file would not)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)
