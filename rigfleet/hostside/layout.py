"""Every path rigfleet keeps on a host, in one place: ``Layout``, one per filesystem root.

This is the only module that spells rigfleet's host directories. The host-side tool, the
roles, ``rigfleet status``, the bump and the host checks all take their paths from here, so a
path is renamed once and the unit tests run the real code against a temporary directory
(``Layout(tmp_path)``) while hosts use ``/`` (``HOST``)::

    from rigfleet.hostside.layout import HOST, Layout

    HOST.lock_dir                      # PosixPath('/var/lib/rigfleet/lock')
    HOST.compose_file("int8")          # PosixPath('/opt/rigfleet/stacks/int8/compose.yaml')
    Layout(tmp_path).state_file        # tmp_path / 'var/lib/rigfleet/state.json'

Stdlib only: it ships inside the host-side bundle. Where each record lives and who writes and
reads it: docs/architecture.md ("Where each record lives"); the schemas are in
``rigfleet.hostside.records``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

STATE_ROOT = "/var/lib/rigfleet"
OPT_ROOT = "/opt/rigfleet"
ETC_ROOT = "/etc/rigfleet"
CACHE_ROOT = "/var/cache/rigfleet"
LIB_ROOT = "/usr/local/lib/rigfleet"

BUNDLE_NAME = "rigfleet-host.pyz"
# The zipapp's place on a host (roles/swap.py uploads it there).
BUNDLE_PATH = f"{LIB_ROOT}/{BUNDLE_NAME}"
CONFIG_HASH_LABEL = "io.rigfleet.config-hash"
STACK_LABEL = "io.rigfleet.stack"
# On an image rigfleet derived from a pinned one (rigfleet.runtime_image): the base's digest.
BASE_DIGEST_LABEL = "io.rigfleet.base-digest"
# The first line of the front's route include: "# rigfleet route: <stack>/<config hash>".
ROUTE_MARK = "# rigfleet route: "
# Written next to verified weights by the fetcher (files/rigfleet-fetch-weights.py).
MANIFEST_NAME = ".rigfleet-manifest.json"
# The files of a throughput directory (``Layout.throughput_dir``; the gate is given the
# directory): the verified history and the last gate's figures.
THROUGHPUT_HISTORY_NAME = "history.jsonl"
THROUGHPUT_LAST_NAME = "last.json"
# A model revision's directory: ``<local_dir>@<its first 12 hex>`` (``Layout.weights_dir``; a
# pinned ``local_dir`` never holds an '@', rigfleet/pins.py).
WEIGHTS_REVISION_MARK = "@"
WEIGHTS_REVISION_CHARS = 12
# The systemd units roles/swap.py installs: the active stack across reboots (ensure at start,
# shutdown at stop) and the supervisor that recreates it when its engine dies.
STACK_UNIT = "rigfleet-stack.service"
SUPERVISE_UNIT = "rigfleet-supervise.service"


@dataclass(frozen=True)
class Layout:
    """Host paths below ``root`` (``/`` on a host, a temporary directory in tests)."""

    root: Path = Path("/")

    def _p(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    # --- /var/lib/rigfleet: records ------------------------------------------------------

    @property
    def state_dir(self) -> Path:
        return self._p(STATE_ROOT)

    @property
    def lock_dir(self) -> Path:
        """``mkdir`` of this directory is the lock; ``holder.json`` inside says who."""
        return self.state_dir / "lock"

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def ledger_file(self) -> Path:
        return self.state_dir / "ledger.jsonl"

    @property
    def active_dir(self) -> Path:
        """The stack that serves (or served last): ``active.json`` and ``compose.yaml``, a
        snapshot of exactly what was verified, so a rollback restarts that and nothing else."""
        return self.state_dir / "active"

    @property
    def active_json(self) -> Path:
        return self.active_dir / "active.json"

    @property
    def active_compose(self) -> Path:
        """A link to the verified snapshot ``active.json`` names (for people and units); the
        record's own ``ref.compose_file`` is the truth (``active_snapshot``)."""
        return self.active_dir / "compose.yaml"

    def active_snapshot(self, config_hash: str) -> Path:
        """The snapshot of one verified config, named by its hash: written before
        ``active.json`` names it, so the pair changes with one rename (``active.write_active``)."""
        return self.active_dir / f"compose-{config_hash}.yaml"

    @property
    def swaps_dir(self) -> Path:
        return self.state_dir / "swap"

    def swap_dir(self, swap_id: str) -> Path:
        """One transaction: ``plan.json``, ``events.jsonl``, ``result.json``, kept logs."""
        return self.swaps_dir / swap_id

    def plan_file(self, swap_id: str) -> Path:
        return self.swap_dir(swap_id) / "plan.json"

    @property
    def reports_dir(self) -> Path:
        """Gate reports (``verify-<ts>.json`` / ``.md``), flat, as ``rigfleet status`` reads."""
        return self.state_dir / "reports"

    @property
    def supervise_dir(self) -> Path:
        """The supervisor's records: ``state.json`` (what it sees and did), ``reset.json`` (a
        reset request: a deploy, ``ensure`` or a person), kept logs of engines that died."""
        return self.state_dir / "supervise"

    @property
    def supervise_state(self) -> Path:
        return self.supervise_dir / "state.json"

    @property
    def supervise_reset(self) -> Path:
        return self.supervise_dir / "reset.json"

    @property
    def throughput_dir(self) -> Path:
        """The throughput records (``rigfleet.hostside.records.ThroughputRecord``): the
        baseline the gate judges a stack's decode speed against, and the last measurement."""
        return self.state_dir / "throughput"

    @property
    def throughput_history(self) -> Path:
        """One JSON line per verified gate (and per accepted baseline), oldest first."""
        return self.throughput_dir / THROUGHPUT_HISTORY_NAME

    @property
    def throughput_last(self) -> Path:
        """The last gate's throughput (passed or not): what ``rigfleet status`` shows."""
        return self.throughput_dir / THROUGHPUT_LAST_NAME

    @property
    def timings_file(self) -> Path:
        """This host's measured window times (boot, gate, overhead, drain): what Retry-After
        says during a window (``rigfleet.hostside.timings``)."""
        return self.state_dir / "timings.json"

    @property
    def maintenance_dir(self) -> Path:
        """The maintenance window (``window.json``) and the plans deploys hand it."""
        return self.state_dir / "maintenance"

    @property
    def window_file(self) -> Path:
        """The current (or last) maintenance window (``rigfleet.hostside.maintenance``)."""
        return self.maintenance_dir / "window.json"

    def window_plan(self, window_id: str) -> Path:
        """The plan a deploy uploads for its window (gate profile, time limits, who)."""
        return self.maintenance_dir / f"plan-{window_id}.json"

    @property
    def locks_dir(self) -> Path:
        """``flock`` files of long host jobs (the weight fetcher)."""
        return self.state_dir / "locks"

    @property
    def version_cache_dir(self) -> Path:
        return self.state_dir / "vllm-versions"

    def version_cache(self, digest: str) -> Path:
        """Where an image's vLLM version is cached, keyed by its (immutable) digest."""
        return self.version_cache_dir / digest.removeprefix("sha256:")

    @property
    def loaded_images_dir(self) -> Path:
        """One file per pinned digest holding the image id a checked ``docker load`` (from a
        peer) gave: such an image has no RepoDigests, so this names the digest it stands for."""
        return self.state_dir / "images-loaded"

    def loaded_image(self, digest: str) -> Path:
        return self.loaded_images_dir / digest.removeprefix("sha256:")

    # --- /opt/rigfleet: what the deploy stages ---------------------------------------------

    @property
    def opt_dir(self) -> Path:
        return self._p(OPT_ROOT)

    @property
    def stacks_dir(self) -> Path:
        return self.opt_dir / "stacks"

    def stack_dir(self, stack: str) -> Path:
        """The compose project directory of ``stack``."""
        return self.stacks_dir / stack

    def compose_file(self, stack: str) -> Path:
        """The staged compose file of ``stack``."""
        return self.stack_dir(stack) / "compose.yaml"

    @property
    def genesis_checkout(self) -> Path:
        """The Genesis git checkout (HEAD = the pin); never mounted into a container."""
        return self.opt_dir / "genesis"

    @property
    def genesis_trees_dir(self) -> Path:
        return self.opt_dir / "genesis-trees"

    def genesis_tree(self, commit: str) -> Path:
        """The immutable export of Genesis ``commit`` (what a stack mounts): a pin bump checks
        out a new commit, and a rollback restarts a snapshot that still names the old tree."""
        return self.genesis_trees_dir / commit

    def image_build_dir(self, name: str) -> Path:
        """Where the deploy builds a derived image (its Dockerfile)."""
        return self.opt_dir / "images" / name

    @property
    def hf_venv(self) -> Path:
        """The virtual environment with the pinned huggingface_hub (the weight fetcher's)."""
        return self.opt_dir / "hf-venv"

    # --- <model_dir> (host data ``model_dir``): the weights -----------------------------------

    def weights_dir(self, model_dir: str, local_dir: str, revision: str) -> Path:
        """One model revision's own directory, ``<model_dir>/<local_dir>@<revision[:12]>``.

        The fetcher renames it into place only once every file is verified, and nothing writes
        it after; the compose file mounts it read-only, so the active snapshot names the
        revision it served and a rollback mounts exactly those files."""
        name = f"{local_dir}{WEIGHTS_REVISION_MARK}{revision[:WEIGHTS_REVISION_CHARS]}"
        return self._p(model_dir) / name

    def weights_legacy_dir(self, model_dir: str, local_dir: str) -> Path:
        """``<model_dir>/<local_dir>``: where weights lived before per-revision directories.
        The deploy adopts it (renamed to its revision's directory, this name left as a link to
        it while a compose snapshot still names it)."""
        return self._p(model_dir) / local_dir

    # --- /etc/rigfleet: secrets ----------------------------------------------------------------

    @property
    def etc_dir(self) -> Path:
        return self._p(ETC_ROOT)

    @property
    def secrets_dir(self) -> Path:
        return self.etc_dir / "secrets"

    @property
    def api_key_file(self) -> Path:
        """The API key alone (root 0600), for the gate and the host's own probes."""
        return self.secrets_dir / "api-key"

    @property
    def vllm_env_file(self) -> Path:
        """``VLLM_API_KEY=...``: the stacks' ``env_file``."""
        return self.secrets_dir / "vllm.env"

    @property
    def auth_header_file(self) -> Path:
        """``Authorization: Bearer ...``: for probes that send a header line."""
        return self.secrets_dir / "api-auth-header"

    @property
    def hf_token_file(self) -> Path:
        return self.secrets_dir / "hf-token"

    # --- /var/cache/rigfleet: compile caches ---------------------------------------------------

    @property
    def cache_dir(self) -> Path:
        return self._p(CACHE_ROOT)

    def stack_cache_dir(self, stack: str) -> Path:
        """One stack's compile caches: vLLM's AOT cache key ignores the GPU architecture and
        the quantisation kernel (club-3090 #548), so caches are never shared between stacks."""
        return self.cache_dir / stack

    # --- /usr/local/lib/rigfleet: programs ------------------------------------------------------

    @property
    def lib_dir(self) -> Path:
        return self._p(LIB_ROOT)

    @property
    def bundle(self) -> Path:
        return self.lib_dir / BUNDLE_NAME

    def script(self, name: str) -> Path:
        """A helper script the deploy installs (``rigfleet-fetch-weights.py``, ...)."""
        return self.lib_dir / name

    # --- the front (nginx) -------------------------------------------------------------------------

    @property
    def front_dir(self) -> Path:
        return self._p("/etc/nginx/rigfleet")

    @property
    def front_route(self) -> Path:
        """The include the front's ``location /`` ends with: proxy to a stack, or 503."""
        return self.front_dir / "route.conf"


# The host itself: what the control side names in commands and uploads.
HOST = Layout()
