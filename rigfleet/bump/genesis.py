"""Genesis compatibility of a candidate vLLM: the pinned commit's allowlist, or a newer commit's.

Genesis patches refuse (strict) or warn about a vLLM whose full ``__version__`` is not in
``KNOWN_GOOD_VLLM_PINS`` (``vllm/_genesis/guards.py``); the 1acd67a79 episode showed that an
unlisted vLLM with Genesis can die at boot. The bump therefore checks the candidate's version
before any host changes: at the pinned commit first, then at each newer commit of the default
branch (oldest first), and proposes the first commit that lists it.

The repository is cloned once into a control-side cache (``git clone --mirror``) and fetched
on each use; files are read with ``git show <commit>:<path>`` and parsed with ``ast`` by the
same helper the hosts run (``files/rigfleet-genesis-allowlist.py``), never imported::

    repo = GenesisRepo("https://github.com/Sandermage/genesis-vllm-patches.git")
    repo.sync()
    choice = choose_genesis(repo, pinned="1f9bfb9e...", version="0.20.2rc1.dev212+g3f9c2a7e5")
    choice.commit, choice.proposed     # ("1e79e838...", True): a newer commit lists it
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import re
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType

from rigfleet.errors import RigfleetError

ALLOWLIST_HELPER = Path(__file__).resolve().parents[2] / "files" / "rigfleet-genesis-allowlist.py"
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "rigfleet"
_RELEASE = re.compile(r"release\((?P<version>v[0-9][^)]*)\)")
_LOCAL_GIT = re.compile(r"\+g([0-9a-f]{7,40})\b")


class GenesisError(RigfleetError, RuntimeError):
    """The Genesis repository could not be read (clone, fetch, commit, guards file)."""


class GenesisRefused(RigfleetError, ValueError):
    """No Genesis commit allows the candidate vLLM; the message names both versions."""


@cache
def _helper() -> ModuleType:
    # One parser for the allowlist, shared with the hosts' gate (roles/stacks.py installs it).
    spec = importlib.util.spec_from_file_location("rigfleet_genesis_allowlist", ALLOWLIST_HELPER)
    if spec is None or spec.loader is None:
        raise GenesisError(f"cannot load {ALLOWLIST_HELPER}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_allowlist(source: str, where: str = "guards.py") -> tuple[str, ...] | None:
    """``KNOWN_GOOD_VLLM_PINS`` from guards source text (None when it has no such literal)."""
    helper = _helper()
    try:
        values = helper.literal_assignments(ast.parse(source, where))
    except SyntaxError as e:
        raise GenesisError(f"{where}: not valid Python: {e}") from None
    if helper.KNOWN_GOOD not in values:
        return None
    return tuple(helper.versions(values[helper.KNOWN_GOOD]))


@dataclass(frozen=True)
class GenesisCommit:
    """One commit and what its guards allow."""

    sha: str
    subject: str
    allowlist: tuple[str, ...]

    @property
    def label(self) -> str:
        """``1f9bfb9ecf0b (v7.72.2)``: short sha and release when the subject names one."""
        m = _RELEASE.search(self.subject)
        return f"{self.sha[:12]} ({m.group('version')})" if m else self.sha[:12]


class GenesisRepo:
    """A control-side mirror of the Genesis repository.

    + url: the repository as pinned (``stacks.<s>.genesis.repo``)
    + fetch_url: where the control machine reaches it, when that differs (a mirror, or the
      testbed's published port); default ``url``
    + cache_dir: where mirrors live (``~/.cache/rigfleet/genesis``)
    """

    def __init__(self, url: str, fetch_url: str | None = None, cache_dir: Path | None = None):
        self.url = url
        self.fetch_url = fetch_url or url
        root = (cache_dir or DEFAULT_CACHE) / "genesis"
        key = hashlib.sha256(self.fetch_url.encode()).hexdigest()[:16]
        self.path = root / f"{key}.git"

    def _git(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_CONFIG_NOSYSTEM": "1",
            "LC_ALL": "C",
        }
        proc = subprocess.run(
            ["git", "--git-dir", str(self.path), *args],
            capture_output=True, text=True, env=env, timeout=600, check=False,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise GenesisError(
                f"git {' '.join(args)} ({self.fetch_url}): {proc.stderr.strip()[-500:]}"
            )
        return proc

    def sync(self) -> None:
        """Clone on first use, fetch (with prune) afterwards."""
        if not (self.path / "HEAD").exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            proc = subprocess.run(
                ["git", "clone", "--quiet", "--mirror", self.fetch_url, str(self.path)],
                capture_output=True, text=True, timeout=600, check=False,
                env={**os.environ, "GIT_TERMINAL_PROMPT": "0"},
            )  # fmt: skip
            if proc.returncode != 0:
                raise GenesisError(
                    f"cannot clone Genesis from {self.fetch_url}: {proc.stderr.strip()[-500:]}"
                )
            return
        self._git("fetch", "--quiet", "--prune", "origin")

    def resolve(self, ref: str) -> str:
        """A full 40-hex commit for ``ref`` (a full or short sha, a branch, a tag)."""
        proc = self._git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
        sha = proc.stdout.strip()
        if proc.returncode != 0 or len(sha) != 40:
            raise GenesisError(f"Genesis {self.url}: no commit {ref!r}")
        return sha

    def default_branch(self) -> str:
        """The branch the repository's HEAD names (``main``)."""
        proc = self._git("symbolic-ref", "--short", "HEAD", check=False)
        return proc.stdout.strip() or "main"

    def commit(self, sha: str) -> GenesisCommit:
        """The commit's subject and ``KNOWN_GOOD_VLLM_PINS`` (empty when it has none)."""
        subject = self._git("log", "-1", "--format=%s", sha).stdout.strip()
        helper = _helper()
        for rel in helper.GUARDS:
            proc = self._git("show", f"{sha}:{rel}", check=False)
            if proc.returncode == 0:
                allow = parse_allowlist(proc.stdout, f"{sha[:12]}:{rel}")
                return GenesisCommit(sha, subject, allow or ())
        return GenesisCommit(sha, subject, ())

    def newer(self, sha: str) -> list[str]:
        """Commits of the default branch after ``sha``, oldest first (first-parent line)."""
        branch = self.default_branch()
        out = self._git("rev-list", "--first-parent", "--reverse", f"{sha}..{branch}").stdout
        return out.split()


@dataclass(frozen=True)
class GenesisChoice:
    """The Genesis commit to pair with the candidate vLLM.

    + commit: the full sha to pin
    + proposed: True when it is newer than the pin (a Genesis bump comes with the image)
    + rollback_safe: the chosen commit also allows the vLLM the fleet runs now; when False, a
      host that rolls back runs the old image against the new Genesis checkout
    """

    commit: str
    label: str
    proposed: bool
    allowlist: tuple[str, ...]
    rollback_safe: bool
    checked: int = 1


def choose_genesis(
    repo: GenesisRepo,
    pinned: str,
    version: str,
    current_version: str | None = None,
    explicit: str | None = None,
) -> GenesisChoice:
    """Pick the Genesis commit for vLLM ``version``; raises ``GenesisRefused`` when none fits.

    + repo: a synced ``GenesisRepo``
    + pinned: the Genesis commit in the pins now
    + version: the candidate image's ``vllm.__version__``
    + current_version: the version the fleet runs now (rollback safety is reported)
    + explicit: ``--genesis COMMIT``: only that commit is considered
    """
    if explicit is not None:
        sha = repo.resolve(explicit)
        c = repo.commit(sha)
        if version not in c.allowlist:
            raise GenesisRefused(refusal(version, [c], explicit=True))
        return _choice(c, sha != pinned, current_version)
    base = repo.commit(repo.resolve(pinned))
    if version in base.allowlist:
        return _choice(base, False, current_version)
    checked = [base]
    for sha in repo.newer(base.sha):
        c = repo.commit(sha)
        checked.append(c)
        if version in c.allowlist:
            return _choice(c, True, current_version, checked=len(checked))
    raise GenesisRefused(refusal(version, checked, branch=repo.default_branch()))


def _choice(
    c: GenesisCommit, proposed: bool, current: str | None, checked: int = 1
) -> GenesisChoice:
    safe = current is None or current in c.allowlist
    return GenesisChoice(c.sha, c.label, proposed, c.allowlist, safe, checked)


def refusal(
    version: str, checked: list[GenesisCommit], *, explicit: bool = False, branch: str = "main"
) -> str:
    """The refusal text: the candidate vLLM, the Genesis pin and what it allows, what was tried."""
    first = checked[0]
    lines = [
        f"vLLM {version} is not on Genesis {first.label}'s KNOWN_GOOD_VLLM_PINS "
        f"({', '.join(first.allowlist) or 'empty'})"
    ]
    if explicit:
        lines.append("(the commit given with --genesis)")
    elif len(checked) > 1:
        newer = ", ".join(c.label for c in checked[1:])
        lines.append(f"nor on any newer Genesis commit on {branch} (checked {newer})")
    else:
        lines.append(f"and no newer Genesis commit exists on {branch}")
    lines.append(
        "refusing before any host changes: pick an image Genesis lists, wait for a Genesis "
        "release that validates this vLLM, or bump only the stacks without Genesis (--stack)"
    )
    return "; ".join(lines)


def names_commit(version: str, commit: str) -> bool:
    """An allowlist entry such as ``0.20.2rc1.dev212+g3f9c2a7e5`` names vLLM ``commit``."""
    m = _LOCAL_GIT.search(version)
    return m is not None and commit.startswith(m.group(1))


def infer_version(repo: GenesisRepo, pinned: str, commit: str) -> str | None:
    """The allowlisted version that names vLLM ``commit`` (at the pin or a newer commit).

    ``--dry`` does not pull the candidate, so its ``vllm.__version__`` is unknown; but every
    nightly version carries its commit (``+g<abbrev>``), so an allowlist entry naming the
    tag's commit tells what it will report, and no such entry means Genesis refuses it.
    """
    for sha in (repo.resolve(pinned), *repo.newer(repo.resolve(pinned))):
        for version in repo.commit(sha).allowlist:
            if names_commit(version, commit):
                return version
    return None
