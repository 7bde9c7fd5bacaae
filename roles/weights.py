"""Each staged model's revision in its own directory, fetched and verified (docs/converge.md)."""

from __future__ import annotations

from functools import partial

from pyinfra import host
from pyinfra.api import FunctionCommand, deploy, operation

from rigfleet.commands import weights as weights_commands
from rigfleet.desired import DesiredHost
from rigfleet.facts import VenvPackageVersion, WeightsManifest, read_fact, read_paths
from rigfleet.fleetcache import model_mirrors
from rigfleet.hostside.layout import HOST
from rigfleet.pins import HEX40, ModelPin
from rigfleet.resources import project_file
from rigfleet.weights import WeightsDirs, prunable
from roles.ops import Secret, WarnedCommand, executing, root_dir, root_put, secret_file
from roles.peers import Peer, peer_for, start_seed
from roles.preflight import HostContext

# The fetcher's stderr lines shown as this host's warnings (a cache skipped, a bad file).
WARNING_MARK = "[rigfleet-weights] WARNING: "


@operation()
def hf_hub_venv(version: str, index_url: str | None = None):
    """``Layout.hf_venv`` with exactly ``huggingface_hub==<version>`` (from ``index_url``)."""
    current = read_fact(VenvPackageVersion, venv=weights_commands.HF_VENV, dist="huggingface_hub")
    if current == version:
        host.noop(f"huggingface_hub {version} in {weights_commands.HF_VENV}")
        return
    yield weights_commands.venv_install(version, index_url)


@operation()
def fetch_weights(repo: str, revision: str, local_dir: str, token_file: str | None = None,
                  endpoint: str | None = None, adopt_from: str | None = None,
                  mirrors: tuple[str, ...] = (), peer: Peer | None = None,
                  after_seed: bool = False):
    """Run the fetcher unless the manifest (or ``adopt_from``'s) records this pin; a seed's peer
    (``roles.peers``) fetches only in the second call (``after_seed``), from the seed."""
    if read_fact(WeightsManifest, local_dir=local_dir).holds(repo, revision):
        if not after_seed:
            host.noop(f"{repo}@{revision[:12]} verified in {local_dir}")
        return
    if (peer is None) == after_seed:
        if peer is not None:
            host.noop(f"{repo}@{revision[:12]}: from peer {peer.seed} once it has them")
        return
    if peer is not None:
        yield FunctionCommand(start_seed, (peer,), {})
        mirrors = (*mirrors, f"{peer.url}/models")
    if adopt_from is not None and not executing() and read_fact(
            WeightsManifest, local_dir=adopt_from).holds(repo, revision):
        host.noop(f"{repo}@{revision[:12]} verified in {adopt_from} (adopted first)")
        return
    yield WarnedCommand(WARNING_MARK, weights_commands.fetch(repo, revision, local_dir,
                                                             token_file, endpoint, mirrors))


@operation()
def adopt_weights(model_dir: str, local_dir: str, compose_files: tuple[str, ...]):
    """Rename pre-revision ``<model_dir>/<local_dir>`` to its manifest's revision, linked back."""
    old = str(HOST.weights_legacy_dir(model_dir, local_dir))
    dirs = read_fact(WeightsDirs, model_dir=model_dir, compose_files=compose_files)
    if (entry := dirs.entries.get(local_dir)) is None or entry.kind != "dir":
        host.noop(f"{old} links to {entry.target} (adopted)" if entry is not None
                  else f"no weights in {old} (every revision has its own directory)")
        return
    state = read_fact(WeightsManifest, local_dir=old)
    if state.repo is None or state.revision is None or not HEX40.fullmatch(state.revision):
        host.noop(f"{old} has no readable manifest (never verified): left as it is")
        return
    new = HOST.weights_dir(model_dir, local_dir, state.revision)
    if new.name in dirs.entries:
        host.noop(f"{new} exists: {old} left as it is")
        return
    yield weights_commands.adopt(state.repo, state.revision, old, str(new))


@operation()
def prune_weights(model_dir: str, pinned: tuple[tuple[str, str], ...],
                  compose_files: tuple[str, ...], released: bool = False):
    """Remove what neither a pin (``pinned``: each staged model's local_dir and revision) nor
    ``compose_files`` name. ``released`` (after a swap): what only the stack it replaced mounted,
    read when the deploy runs (a swap that rolled back keeps what serves again)."""
    dirs = partial(read_fact, WeightsDirs, model_dir=model_dir)
    if not released or executing():  # released: read again, the swap rewrote the active snapshot
        names = prunable(dirs(fresh=released, compose_files=compose_files), pinned)
    else:  # what goes once the active snapshot no longer mounts it, less the first prune's own
        projects = tuple(f for f in compose_files if f != str(HOST.active_compose))
        before = prunable(dirs(compose_files=compose_files), pinned)
        names = [n for n in prunable(dirs(compose_files=projects), pinned) if n not in before]
    if not names:
        host.noop(f"the swap released no weights in {model_dir}" if released
                  else f"no stale weights in {model_dir}")
        return
    yield weights_commands.remove([f"{model_dir.rstrip('/')}/{n}" for n in names])


def prune(ctx: HostContext, released: bool = False) -> None:
    """``prune_weights`` of this host (``released``: after its swap, see there)."""
    model_dir = ctx.want.settings.model_dir
    prune_weights(name=f"Prune weights only the replaced stack mounted ({model_dir})" if released
                  else f"Prune weights no pin and no compose file names ({model_dir})",
                  model_dir=model_dir, compose_files=compose_files(ctx), released=released,
                  pinned=tuple((m.local_dir, m.revision) for m in ctx.want.models))


def compose_files(ctx: HostContext) -> tuple[str, ...]:
    """Every compose file on the host that may mount a revision or a Genesis tree."""
    return (*(f for _, f in ctx.want.projects), str(HOST.active_compose))


def _serves(model: ModelPin, want: DesiredHost) -> bool:
    return any((m.repo, m.revision) == (model.repo, model.revision) for m in want.models)


def fetcher_dirs(model_dir: str) -> tuple[tuple[str, str], ...]:
    return tuple((str(path), "0700" if path == HOST.secrets_dir else "0755")
                 for path in (HOST.opt_dir, HOST.lib_dir, HOST.etc_dir, HOST.secrets_dir,
                              HOST.state_dir, model_dir))


def fetcher(model_dir: str, hf_hub_version: str, index_url: str | None,
            hf_token: Secret | None) -> str | None:
    """The fetcher's directories, venv, script and token file (returned, when there is one)."""
    for path, mode in host.loop(fetcher_dirs(model_dir)):
        root_dir(name=f"Directory {path}", path=path, mode=mode)
    hf_hub_venv(name=f"huggingface_hub {hf_hub_version} venv", version=hf_hub_version,
                index_url=index_url)
    root_put(name="Weights fetcher script",
             src=str(project_file("files/rigfleet-fetch-weights.py")),
             dest=weights_commands.FETCH_SCRIPT, mode="0755")
    if hf_token is None:
        return None
    secret_file(name="Hugging Face token (root-only)", dest=str(HOST.hf_token_file),
                content=Secret(hf_token.reveal() + "\n"))
    return str(HOST.hf_token_file)


@deploy("Model weights")
def weights(ctx: HostContext) -> None:
    model_dir = ctx.want.settings.model_dir
    read_paths([*(path for path, _ in fetcher_dirs(model_dir)), weights_commands.FETCH_SCRIPT,
                *([str(HOST.hf_token_file)] if ctx.hf_token is not None else [])])
    token_file = fetcher(model_dir, ctx.want.pins.hf_hub_version, ctx.want.settings.pip_index_url,
                         ctx.hf_token)
    for model in host.loop(ctx.want.models):
        adopt_weights(
            name=f"Adopt {model_dir}/{model.local_dir} as its revision's directory (no download)",
            model_dir=model_dir, local_dir=model.local_dir, compose_files=compose_files(ctx))
    # Before any fetch, so what goes frees its space for the download.
    prune(ctx)
    peers = {}
    for model in ctx.want.models:
        held = read_fact(WeightsManifest, local_dir=ctx.want.weights_path(model)).holds(
            model.repo, model.revision)
        peers[model] = None if held else peer_for(partial(_serves, model))  # (the fetch's read)
    # Every host's own fetches before any peer's fetch from its seed: operations are ordered by
    # loop position, and hosts serving other models hold a shared one at other positions.
    for after_seed in host.loop((False, True)):
        for model in host.loop(ctx.want.models):
            fetch_weights(
                name=f"Fetch and verify {model.repo}@{model.revision[:12]}"
                     + (" from a peer" if after_seed else ""),
                repo=model.repo, revision=model.revision, local_dir=ctx.want.weights_path(model),
                token_file=token_file, endpoint=ctx.want.settings.hf_endpoint,
                adopt_from=None if after_seed else str(
                    HOST.weights_legacy_dir(model_dir, model.local_dir)),
                mirrors=model_mirrors(host.inventory), peer=peers[model], after_seed=after_seed)
