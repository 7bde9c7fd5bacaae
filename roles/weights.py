"""Model weights: a pinned huggingface_hub venv, the host-side fetcher, a verified download.

The fetcher (``files/rigfleet-fetch-weights.py``) does the work on the host: per-repo lock,
free-disk check, the fleet caches first (group ``caches``: ``rigfleet.fleetcache``), then a
resumable ``snapshot_download`` at the pinned revision, sha256 of every LFS
file against the hub, manifest written last, then the download renamed to the revision's own
directory (``Layout.weights_dir``: ``<model_dir>/<local_dir>@<revision[:12]>``), which nothing
writes after. The deploy decides whether to run it from the manifest (``WeightsManifest``:
revision + size/mtime of every file), so a converged host shows no change under ``--dry`` and
no download or hashing happens on a re-run.

Before that, in order:

1. **adopt**: weights of before per-revision directories (``<model_dir>/<local_dir>``, with a
   manifest for revision R) become R's directory by a rename, the old name left as a link for
   the compose snapshot that still names it; no download, and no swap (the config hash sees
   the weights by revision, ``rigfleet.compose.config_hash``; docs/converge.md);
2. **prune**: revision directories, partial downloads and the old link that no compose file on
   the host names (the staged stacks' files, the active snapshot) and that are not pinned go
   (``rigfleet.weights.stale_weights``: Genesis trees' rule, keeping no extra revision).

Example::

    weights(ctx)
"""

from __future__ import annotations

import re
from functools import partial

from pyinfra import host
from pyinfra.api import FunctionCommand, deploy, operation
from pyinfra.operations import files

from rigfleet.commands import weights as weights_commands
from rigfleet.desired import DesiredHost
from rigfleet.facts import VenvPackageVersion, WeightsManifest, read_fact, read_paths
from rigfleet.fleetcache import model_mirrors
from rigfleet.hostside.layout import HOST
from rigfleet.pins import ModelPin
from rigfleet.resources import project_file
from rigfleet.weights import WeightsDirs, WeightsSpace, stale_weights, weights_space
from roles.ops import Secret, WarnedCommand, executing, secret_file
from roles.peers import Peer, peer_for, start_seed
from roles.preflight import HostContext

# The fetcher's stderr lines the deploy shows as this host's warnings (a cache skipped, a
# bad file from it).
WARNING_MARK = "[rigfleet-weights] WARNING: "


@operation()
def hf_hub_venv(version: str, index_url: str | None = None):
    """``Layout.hf_venv`` with exactly ``huggingface_hub==<version>``.

    + version: the pinned huggingface_hub version
    + index_url: a PyPI mirror (host data ``pip_index_url``), else PyPI
    """
    current = read_fact(
        VenvPackageVersion, venv=weights_commands.HF_VENV, dist="huggingface_hub"
    )
    if current == version:
        host.noop(f"huggingface_hub {version} in {weights_commands.HF_VENV}")
        return
    yield weights_commands.venv_install(version, index_url)


@operation()
def fetch_weights(
    repo: str,
    revision: str,
    local_dir: str,
    token_file: str | None = None,
    endpoint: str | None = None,
    adopt_from: str | None = None,
    mirrors: tuple[str, ...] = (),
    peer: Peer | None = None,
    after_seed: bool = False,
):
    """Run the fetcher unless the manifest already records this pin and the files match.

    + repo, revision: the model pin (revision is a full commit)
    + local_dir: the revision's directory (``Layout.weights_dir``)
    + token_file: the host's root-only token file, when a token is configured
    + endpoint: ``HF_ENDPOINT`` (a mirror or the testbed hub), else huggingface.co
    + adopt_from: the directory ``adopt_weights`` renames to ``local_dir`` first when it holds
      this pin (then ``--dry`` shows no download: none happens)
    + mirrors: the fleet caches' model URLs, tried before ``endpoint`` (files verified either
      way; a cache down or a bad file: a warning, and the hub)
    + peer, after_seed: with no cache, a host whose seed (``roles.peers``) fetches first
      does nothing in the first call and fetches from the seed in the second (``after_seed``)
    """
    state = read_fact(WeightsManifest, local_dir=local_dir)
    if state.holds(repo, revision):
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
    if adopt_from is not None and not executing():
        old = read_fact(WeightsManifest, local_dir=adopt_from)
        if old.holds(repo, revision):
            host.noop(f"{repo}@{revision[:12]} verified in {adopt_from} (adopted first)")
            return
    yield WarnedCommand(WARNING_MARK, weights_commands.fetch(repo, revision, local_dir, token_file, endpoint,
                                               mirrors))


_HEX40 = re.compile(r"[0-9a-f]{40}")


@operation()
def adopt_weights(model_dir: str, local_dir: str, compose_files: tuple[str, ...]):
    """Adopt ``<model_dir>/<local_dir>`` (weights of before per-revision directories) as the
    directory of the revision its manifest names: renamed, the old name left as a link.

    + model_dir, local_dir: host data ``model_dir``, the pin's ``local_dir``
    + compose_files: as ``prune_weights`` (the same read answers both)
    """
    old = str(HOST.weights_legacy_dir(model_dir, local_dir))
    dirs = read_fact(WeightsDirs, model_dir=model_dir, local_dir=local_dir,
                     compose_files=compose_files)
    entry = dirs.entries.get(local_dir)
    if entry is None or entry.kind != "dir":
        host.noop(f"{old} links to {entry.target} (adopted)" if entry is not None
                  else f"no weights in {old} (every revision has its own directory)")
        return
    state = read_fact(WeightsManifest, local_dir=old)
    if state.repo is None or state.revision is None or not _HEX40.fullmatch(state.revision):
        host.noop(f"{old} has no readable manifest (never verified): left as it is")
        return
    new = HOST.weights_dir(model_dir, local_dir, state.revision)
    if new.name in dirs.entries:
        host.noop(f"{new} exists: {old} left as it is")
        return
    yield weights_commands.adopt(state.repo, state.revision, old, str(new))


@operation()
def prune_weights(model_dir: str, local_dir: str, revision: str, compose_files: tuple[str, ...]):
    """Remove the revision directories, partial downloads and the old link that neither the
    pin nor any compose file on the host names (``rigfleet.weights.stale_weights``).

    + model_dir, local_dir, revision: host data ``model_dir`` and the model pin
    + compose_files: every compose file on the host (the staged stacks', the active snapshot)
    """
    dirs = read_fact(WeightsDirs, model_dir=model_dir, local_dir=local_dir,
                     compose_files=compose_files)
    names = stale_weights(dirs, local_dir, revision)
    if not names:
        host.noop(f"no stale weights in {model_dir}")
        return
    yield weights_commands.remove([f"{model_dir.rstrip('/')}/{n}" for n in names])


def compose_files(ctx: HostContext) -> tuple[str, ...]:
    """Every compose file on the host that may mount a revision: the staged stacks' (what may
    run next) and the active snapshot (what a rollback restarts)."""
    return (*(f for _, f in ctx.want.projects), str(HOST.active_compose))


def weights_disk(ctx: HostContext) -> WeightsSpace:
    """What the weights keep on this host after pruning and what the pinned revision still
    needs (``rigfleet.weights.weights_space``), for a disk check before anything changes.

    **Example:**

    .. code:: python

        space = weights_disk(ctx)
        space.kept, space.need      # bytes; need is None when it cannot be estimated
    """
    model, model_dir = ctx.want.model, ctx.want.settings.model_dir
    dirs = read_fact(WeightsDirs, model_dir=model_dir, local_dir=model.local_dir,
                     compose_files=compose_files(ctx))
    old = dirs.entries.get(model.local_dir)
    old_revision = None
    if old is not None and old.kind == "dir":
        old_revision = read_fact(WeightsManifest,
                                 local_dir=str(HOST.weights_legacy_dir(model_dir,
                                                                       model.local_dir))).revision
    return weights_space(dirs, model.local_dir, model.revision, old_revision=old_revision)


def _serves(model: ModelPin, want: DesiredHost) -> bool:
    """Does ``want`` stage a stack that serves ``model`` at its revision?"""
    return any((m.repo, m.revision) == (model.repo, model.revision) for m in want.models)


@deploy("Model weights")
def weights(ctx: HostContext) -> None:
    """Install the fetcher and its venv, then fetch and verify the pinned weights."""
    directories = (
        (str(HOST.opt_dir), "0755"),
        (str(HOST.lib_dir), "0755"),
        (str(HOST.etc_dir), "0755"),
        (str(HOST.secrets_dir), "0700"),
        (str(HOST.state_dir), "0755"),
        (ctx.want.settings.model_dir, "0755"),
    )
    read_paths([*(path for path, _ in directories), weights_commands.FETCH_SCRIPT,
                *([weights_commands.HF_TOKEN_FILE] if ctx.hf_token is not None else [])])
    for path, mode in host.loop(directories):
        files.directory(name=f"Directory {path}", path=path, user="root", group="root", mode=mode)
    hf_hub_venv(
        name=f"huggingface_hub {ctx.want.pins.hf_hub_version} venv",
        version=ctx.want.pins.hf_hub_version,
        index_url=ctx.want.settings.pip_index_url,
    )
    files.put(
        name="Weights fetcher script",
        src=str(project_file("files/rigfleet-fetch-weights.py")),
        dest=weights_commands.FETCH_SCRIPT,
        user="root",
        group="root",
        mode="0755",
    )
    token_file = None
    if ctx.hf_token is not None:
        token_file = weights_commands.HF_TOKEN_FILE
        secret_file(
            name="Hugging Face token (root-only)",
            dest=token_file,
            content=Secret(ctx.hf_token.reveal() + "\n"),
        )
    model_dir = ctx.want.settings.model_dir
    # Every model a staged stack serves, each in its own directories (``local_dir``).
    for model in host.loop(ctx.want.models):
        adopt_weights(
            name=f"Adopt {model_dir}/{model.local_dir} as its revision's directory (no download)",
            model_dir=model_dir,
            local_dir=model.local_dir,
            compose_files=compose_files(ctx),
        )
        prune_weights(
            name=f"Prune {model.local_dir} revisions no compose file names ({model_dir})",
            model_dir=model_dir,
            local_dir=model.local_dir,
            revision=model.revision,
            compose_files=compose_files(ctx),
        )
        local_dir = ctx.want.weights_path(model)
        held = read_fact(WeightsManifest, local_dir=local_dir).holds(model.repo, model.revision)
        peer = None if held else peer_for(partial(_serves, model))  # (the fetch's own read)
        # A peer of a seed (roles.peers) fetches in the second call, once the seed has them.
        for after_seed in host.loop((False, True)):
            fetch_weights(
                name=f"Fetch and verify {model.repo}@{model.revision[:12]}"
                     + (" from a peer" if after_seed else ""),
                repo=model.repo,
                revision=model.revision,
                local_dir=local_dir,
                token_file=token_file,
                endpoint=ctx.want.settings.hf_endpoint,
                adopt_from=None if after_seed else str(HOST.weights_legacy_dir(
                    model_dir, model.local_dir)),
                mirrors=model_mirrors(host.inventory),
                peer=peer,
                after_seed=after_seed,
            )
