"""Genesis on the control side (docs/genesis.md): a ``git clone --mirror`` in a cache, commits read
with the hosts' ``genesis_inspect``, the commit for a candidate vLLM, what ``pins lock`` records::

    repo = GenesisRepo("https://github.com/Sandermage/sndr_core_engine.git").sync()
    choice = choose_genesis(repo, pinned="7b9fd319...", version="0.21.0")
    choice.commit, choice.label, choice.proposed   # ("66e37841...", "66e37841a18f (v12.1.0)", True)
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from functools import cache, cached_property
from pathlib import Path

from rigfleet import genesis_inspect
from rigfleet.catalog import Catalog, StackSpec, builtin_catalog
from rigfleet.errors import RigfleetError
from rigfleet.genesis import (
    StackUse,
    TreeReport,
    allowlist_problem,
    decision_problems,
    pairing_problems,
    read_entries,
)
from rigfleet.pins import GenesisPin, Pins, StackPins

DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "rigfleet"
_RELEASE = re.compile(r"release\((?P<version>v[0-9][^)]*)\)")
_LOCAL_GIT = re.compile(r"\+g([0-9a-f]{7,40})\b")
_VERSION_TAG = re.compile(r"v?[0-9]+(?:\.[0-9]+){1,3}(?:[.-][A-Za-z0-9]+)*")
_LISTED = 5


class GenesisError(RigfleetError, RuntimeError):
    """The Genesis repository could not be read (clone, fetch, commit, files)."""


class GenesisRefused(RigfleetError, ValueError):
    """No Genesis commit suits the candidate (allowlist, switches); the message says why."""


def _git(argv: list[str], failed: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``git <argv>``; ``GenesisError`` starting with ``failed`` when it fails and ``check``."""
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"}
    try:
        proc = subprocess.run(["git", *argv], capture_output=True, text=True, env=env,
                              timeout=600, check=False)
    except subprocess.TimeoutExpired:
        raise GenesisError(f"{failed}: git gave no answer in 600 s") from None
    except OSError as e:  # no git on this machine
        raise GenesisError(f"{failed}: cannot run git ({e.strerror or e})") from None
    if check and proc.returncode != 0:
        raise GenesisError(f"{failed}: {proc.stderr.strip()[-500:]}")
    return proc


@dataclass(frozen=True)
class GitSource:
    """One commit of a ``GenesisRepo``, as a ``genesis_inspect.Source``."""

    repo: GenesisRepo
    sha: str

    def markers(self) -> frozenset[str]:
        return frozenset(self.repo.git("ls-tree", "--name-only", self.sha, "--",
                                       *genesis_inspect.MARKERS).stdout.split())

    def read(self, rel: str) -> str | None:
        proc = self.repo.git("show", f"{self.sha}:{rel}", check=False)
        return proc.stdout if proc.returncode == 0 else None


@dataclass(frozen=True)
class GenesisCommit:
    """One commit: its release (a version tag, else a ``release(vX)`` subject: v7.x had no
    tags), date and light tree report (no registry)."""

    sha: str
    release: str | None
    date: int
    tree: TreeReport

    @property
    def label(self) -> str:
        return f"{self.sha[:12]} ({self.release})" if self.release else self.sha[:12]


class GenesisRepo:
    """A control-side mirror of the Genesis repository ``url``, fetched from ``fetch_url``."""

    def __init__(self, url: str, fetch_url: str | None = None, cache_dir: Path | None = None):
        self.url = url
        self.fetch_url = fetch_url or url
        key = hashlib.sha256(self.fetch_url.encode()).hexdigest()[:16]
        self.path = (cache_dir or DEFAULT_CACHE) / "genesis" / f"{key}.git"
        self._reports: dict[str, TreeReport] = {}
        self._commits: dict[str, GenesisCommit] = {}

    def git(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``git --git-dir <mirror> <args>``; ``GenesisError`` when it fails and ``check``."""
        return _git(["--git-dir", str(self.path), *args],
                    f"git {' '.join(args)} ({self.fetch_url})", check)

    def sync(self) -> GenesisRepo:
        """Clone on first use, fetch (with prune) afterwards: every ref, the mirror way."""
        if not (self.path / "HEAD").exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _git(["clone", "--quiet", "--mirror", self.fetch_url, str(self.path)],
                 f"cannot clone Genesis from {self.fetch_url}")
        else:
            self.git("fetch", "--quiet", "--prune", "origin")
        self.__dict__.pop("tags", None)
        self._commits.clear()
        return self

    def resolve(self, ref: str) -> str:
        """A full 40-hex commit for ``ref`` (a full or short sha, a branch, a tag)."""
        proc = self.git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
        sha = proc.stdout.strip()
        if proc.returncode != 0 or len(sha) != 40:
            raise GenesisError(f"Genesis {self.url}: no commit {ref!r}")
        return sha

    @cached_property
    def tags(self) -> dict[str, tuple[str, ...]]:
        """Commit -> the tags that point at it (annotated tags peeled), release-like first."""
        out = self.git("for-each-ref", "refs/tags",
                       "--format=%(objectname) %(*objectname) %(refname:short)").stdout
        found: dict[str, list[str]] = {}
        for parts in (line.split() for line in out.splitlines()):
            if len(parts) in (2, 3):  # <sha> [<peeled commit of an annotated tag>] <name>
                found.setdefault(parts[-2], []).append(parts[-1])
        return {sha: tuple(sorted(names, key=lambda n: (not _VERSION_TAG.fullmatch(n), n)))
                for sha, names in found.items()}  # fmt: skip

    def commit(self, sha: str) -> GenesisCommit:
        if sha not in self._commits:
            line = self.git("log", "-1", "--format=%ct %s", sha).stdout.strip()
            date, _, subject = line.partition(" ")
            tag = next((t for t in self.tags.get(sha, ()) if _VERSION_TAG.fullmatch(t)), None)
            release = tag or (m.group("version") if (m := _RELEASE.search(subject)) else None)
            tree = TreeReport.from_json(genesis_inspect.inspect(GitSource(self, sha),
                                                                registry=False))
            self._commits[sha] = GenesisCommit(sha, release, int(date or 0), tree)
        return self._commits[sha]

    def report(self, sha: str) -> TreeReport:
        """The full tree report of ``sha`` (registry included), as the hosts' gate reads it."""
        if sha not in self._reports:
            self._reports[sha] = TreeReport.from_json(genesis_inspect.inspect(GitSource(self, sha)))
        return self._reports[sha]

    def reached_by(self, commit: str) -> list[str] | None:
        """The branches and tags that reach ``commit``; None when the mirror lacks it."""
        if self.git("cat-file", "-e", f"{commit}^{{commit}}", check=False).returncode != 0:
            return None
        return self.git("for-each-ref", "--contains", commit, "--format=%(refname:short)",
                        "refs/heads", "refs/tags").stdout.split()

    def decisions(self, spec: StackSpec, sha: str, layout: str, vllm_version: str | None,
                  label: str) -> list[str]:  # fmt: skip
        """``decision_problems`` of ``spec`` against the patch registry of ``sha``."""
        try:
            entries = read_entries(GitSource(self, sha), layout)
        except genesis_inspect.InspectError as e:
            raise GenesisError(f"Genesis {self.url} {sha[:12]}: {e}") from None
        return decision_problems(spec, entries, vllm_version, label=label, generation=layout)

    def version(self, sha: str) -> str | None:
        """Its release, else ``git describe``, else the version the tree declares."""
        c = self.commit(sha)
        if c.release:
            return c.release
        proc = self.git("describe", "--tags", "--abbrev=12", sha, check=False)
        described = proc.stdout.strip()
        if proc.returncode == 0 and _VERSION_TAG.fullmatch(described):
            return described
        return c.tree.version

    def newer(self, sha: str) -> list[str]:
        """Commits any branch or tag reaches that were made after ``sha``, newest first."""
        since = self.commit(sha).date
        # Every branch and every tag; never refs/pull/* (a mirror of GitHub has those too).
        out = self.git("log", "--branches", "--tags", "--format=%ct %H").stdout
        dated = [(int(d), h) for d, _, h in (line.partition(" ") for line in out.splitlines())
                 if h and h != sha]  # fmt: skip
        return [h for d, h in sorted(dated, key=lambda x: (-x[0], x[1])) if d > since]

    def lineage(self, ref: str) -> Iterator[GenesisCommit]:
        """The commit ``ref`` names, then the ``newer`` ones (read as they are asked for)."""
        base = self.commit(self.resolve(ref))
        yield base
        yield from (self.commit(sha) for sha in self.newer(base.sha))


@dataclass(frozen=True)
class GenesisChoice:
    """The Genesis commit to pair with the candidate vLLM; ``proposed``: not the pin;
    ``rollback_safe``: it also lists the vLLM the fleet runs now; ``newer``: than the pin."""

    commit: str
    label: str
    proposed: bool
    rollback_safe: bool
    layout: str
    version: str | None = None
    newer: bool = True

    def pin(self, repo: str) -> GenesisPin:
        return GenesisPin(repo, self.commit, layout=self.layout, version=self.version)


def choose_genesis(repo: GenesisRepo, pinned: str, version: str,
                   current_version: str | None = None, explicit: str | None = None
                   ) -> GenesisChoice:
    """The pin if it lists vLLM ``version``, else the newest newer commit that does
    (``explicit``: only that commit)."""
    checked: list[GenesisCommit] = []
    commits = repo.lineage(pinned) if explicit is None else [repo.commit(repo.resolve(explicit))]
    for c in commits:
        checked.append(c)
        if c.tree.layout and c.tree.lists(version):  # no layout: no allowlist to list it
            safe = current_version is None or c.tree.lists(current_version)
            # --genesis may name an older commit, or the pin may be gone from the repository
            pinned_at = repo.git("log", "-1", "--format=%ct", pinned, check=False).stdout.strip()
            newer = not pinned_at.isdigit() or c.date > int(pinned_at)
            return GenesisChoice(c.sha, c.label, c.sha != pinned, safe, c.tree.layout,
                                 repo.version(c.sha), newer)
    raise GenesisRefused(refusal(version, checked, explicit=explicit is not None))


def refusal(version: str, checked: list[GenesisCommit], *, explicit: bool = False) -> str:
    first = checked[0]
    lines = [allowlist_problem(first.tree, version, label=first.label)
             or f"vLLM {version}: Genesis {first.label}"]  # fmt: skip
    if explicit:
        lines.append("(the commit given with --genesis)")
    elif len(checked) > 1:
        newer = [c.label for c in checked[1:]]
        shown = ", ".join(newer[:_LISTED]) + (
            f" and {len(newer) - _LISTED} older" if len(newer) > _LISTED else "")
        lines.append(f"nor on any newer Genesis commit of any branch or tag (checked "
                     f"{len(newer)}, newest first: {shown})")  # fmt: skip
    else:
        lines.append("and no newer Genesis commit exists on any branch or tag")
    lines.append("refusing before any host changes: pick an image Genesis lists, wait for a "
                 "Genesis release that validates this vLLM, or bump only the stacks without "
                 "Genesis (--stack)")
    return "; ".join(lines)


def names_commit(version: str, commit: str) -> bool:
    """An allowlist entry such as ``0.20.2rc1.dev212+g3f9c2a7e5`` names vLLM ``commit``."""
    m = _LOCAL_GIT.search(version)
    return m is not None and commit.startswith(m.group(1))


def infer_version(repo: GenesisRepo, pinned: str, commit: str) -> str | None:
    """The allowlisted version (at the pin or newer) naming vLLM ``commit`` (``--dry``)."""
    return next((version for c in repo.lineage(pinned) for version in c.tree.allowed
                 if names_commit(version, commit)), None)


def check_switches(repo: GenesisRepo, pin: GenesisPin, uses: Mapping[str, StackUse], *,
                   stack: str, spec: StackSpec | None = None,
                   vllm_version: str | None = None) -> None:
    """``GenesisRefused`` when ``pin`` does not suit one of ``uses`` (key ``""``: the stack file;
    else a host), or ``spec`` leaves a correctness patch undecided."""
    report = repo.report(pin.commit)
    first_host: dict[str, str] = {}  # a stack-file problem once, not once per host
    for host, use in uses.items():
        for p in pairing_problems(report, pin, stack=stack, vllm_version=None, use=use,
                                  where=f"{pin.repo} {pin.commit[:12]}"):  # fmt: skip
            first_host.setdefault(p, host)
    problems = [f"{host}: {p}" if host else p for p, host in first_host.items()]
    if spec is not None:
        problems += repo.decisions(spec, pin.commit, pin.layout, vllm_version, pin.label)
    if problems:
        raise GenesisRefused("; ".join(problems) + "; refusing before any host changes")


def lock_genesis(pins: Pins, catalog: Catalog | None = None, fetch_url: str | None = None,
                 cache_dir: Path | None = None) -> tuple[Pins, list[str]]:
    """``pins`` with each Genesis pin's layout and version read from its commit, and the changes;
    ``GenesisRefused`` lists every problem the hosts' gate would find."""
    stacks_of = catalog or builtin_catalog()
    repo_of = cache(lambda url: GenesisRepo(url, fetch_url, cache_dir).sync())
    changes: list[str] = []
    problems: list[str] = []

    def locked(key: str, name: str, p: StackPins) -> StackPins:
        g = p.genesis
        if g is None:
            return p
        repo = repo_of(g.repo)
        try:
            sha = repo.resolve(g.commit)
        except GenesisError:
            problems.append(f"{key}.genesis.commit: {g.commit} is not in {repo.fetch_url} "
                            "(no branch, tag or other ref reaches it)")  # fmt: skip
            return p
        report = repo.report(sha)
        layout = report.layout or g.layout
        new = replace(g, layout=layout, version=repo.version(sha) or g.version)
        changes.extend(f"{key}.genesis.{f}: {getattr(g, f)} -> {getattr(new, f)}"
                       for f in ("layout", "version") if getattr(g, f) != getattr(new, f))
        use = None
        if (spec := stacks_of.stacks.get(name)) is not None:
            try:
                use = StackUse.of(spec, layout)
            except ValueError as e:
                problems.append(str(e))
        problems.extend(pairing_problems(report, new, stack=name, vllm_version=p.vllm_version,
                                         use=use, image_ref=p.image,
                                         where=f"{g.repo} {sha[:12]}"))  # fmt: skip
        if spec is not None and report.layout is not None:
            problems.extend(repo.decisions(spec, sha, report.layout, p.vllm_version, new.label))
        return replace(p, genesis=new)

    stacks = {n: locked(f"stacks.{n}", n, p) for n, p in pins.stacks.items()}
    hosts = {h: {n: locked(f"hosts.{h}.stacks.{n}", n, p) for n, p in over.items()}
             for h, over in pins.hosts.items()}  # fmt: skip
    if problems:
        raise GenesisRefused("\n".join(f"{pins.path}: {p}" for p in dict.fromkeys(problems)))
    return replace(pins, stacks=stacks, hosts=hosts), changes
