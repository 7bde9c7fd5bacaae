"""The Genesis fixture: a bare git repository shaped like ``Sandermage/sndr_core_engine`` today.

Its history has the real repository's shape (upstream-2026.md 3.1-3.3):

- branch ``dev``: the v7 generation (``vllm/_genesis/`` layout): ``release(v7.72.2)`` and the
  fictional ``release(v7.73.0)`` the twin's bump tests use. No v7 tag exists.
- branch ``main`` (HEAD), rewritten: a root "v12 public release (tidied)" commit with no merge
  base with ``dev``, ``v12.0.0`` and ``v12.1.0`` (lightweight tags) and one later commit. The
  v12 layout is ``sndr/`` (``python3 -m sndr.apply``) with the v12.1.0 allowlist as the
  reference gives it.

The sources live in ``genesis_src/``: ``common/`` (text patching and the apply loop, copied into
both layouts), ``v7/tree`` and ``v12/tree`` (the files), ``*/releases/*.md`` (one CHANGELOG
section per commit). Lines marked ``# genesis-fixture: <key>`` (or
``<!-- genesis-fixture: <key> -->``) are replaced per commit (the allowlists, versions, the
rendered ``PATCH_REGISTRY`` and text patches of :mod:`rigfleet_testbed.genesis_patches`).

Commits are made with git's plumbing under a scrubbed environment (no system or user config,
fixed author/committer ``Genesis Fixture <genesis@rigfleet.test>`` and dates), so every SHA is
the same on every machine and every build::

    fx = build_genesis_fixture(Path(".testbed/services/git"), bundle=REAL_BUNDLE)
    fx.repo_path                 # .../sndr_core_engine.git (bare, update-server-info done)
    fx.alias_path                # .../genesis-vllm-patches.git -> sndr_core_engine.git
    fx.commits[0]                # GenesisCommit of release(v7.72.2), on dev only
    fx.branches, fx.tags         # {"dev": sha, "main": sha}, {"v12.0.0": sha, "v12.1.0": sha}
    fx.real_path                 # .../real/sndr_core_engine.git from the bundle, or None

Served by the services container as ``http://git.rigfleet.test:8090/sndr_core_engine.git`` (and
under the old name, as GitHub redirects a renamed repository).
"""

from __future__ import annotations

import calendar
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from rigfleet_testbed import genesis_patches

REPO_NAME = "sndr_core_engine.git"
OLD_REPO_NAME = "genesis-vllm-patches.git"
REAL_DIR = "real"
SRC = Path(__file__).with_name("genesis_src")
AUTHOR = ("Genesis Fixture", "genesis@rigfleet.test")


@dataclass(frozen=True)
class Release:
    """One commit of a generation.

    + version: the release (``v7.72.2``, ``v12.1.0``) or the one the tree carries
    + notes: ``releases/<notes>.md``, this commit's CHANGELOG section
    + known_good: the full ``KNOWN_GOOD_VLLM_PINS`` at this commit, with the reason per pin
    + pending: ``PROMOTION_PENDING_VLLM_PINS`` (v12)
    + tag: a lightweight tag of the same name points here
    + pins_yaml: ``sndr/pins.yaml`` body (v12)
    """

    version: str
    subject: str
    body: str
    date: str  # UTC, "%Y-%m-%dT%H:%M:%SZ"
    notes: str
    known_good: tuple[tuple[str, str], ...]
    pending: tuple[str, ...] = ()
    tag: bool = False
    pins_yaml: str = ""


_V7_PINS = (
    ("0.20.1rc1.dev16+g7a1eb8ac2", "v7.65 PROD baseline"),
    ("0.20.2rc1.dev9+g01d4d1ad3", "v7.70 pin-bump target, validated 2026-05-04"),
)
V7_RELEASES: tuple[Release, ...] = (
    Release("v7.72.2", "release(v7.72.2): vllm pin allowlist gate, P67 TQ multi-query kernel",
            "KNOWN_GOOD_VLLM_PINS gate in apply_all (GENESIS_VLLM_PIN_POLICY=warn|strict).\n"
            "Validated pins: 0.20.1rc1.dev16+g7a1eb8ac2, 0.20.2rc1.dev9+g01d4d1ad3.",
            "2026-05-05T09:30:00Z", "v7.72.2", _V7_PINS),
    # Fictional: v7.73.x was never released (upstream-2026.md 3.1); the twin's bump tests use it.
    Release("v7.73.0", "release(v7.73.0): allowlist vllm 0.20.2rc1.dev212 and dev240",
            "Boot + smoke validated on 2x RTX 3090 (TQ3 + MTP).", "2026-05-12T14:00:00Z",
            "v7.73.0", _V7_PINS + (
                ("0.20.2rc1.dev212+g3f9c2a7e5", "validated 2026-05-11"),
                ("0.20.2rc1.dev240+gb7e4d1c9a", "validated 2026-05-12 (boot + smoke)"))),
)

# KNOWN_GOOD_VLLM_PINS of sndr_core_engine v12.1.0 (= main 34e26930), upstream-2026.md 3.3.
V12_1_PINS: tuple[str, ...] = (
    "0.20.1rc1.dev16+g7a1eb8ac2", "0.20.2rc1.dev9+g01d4d1ad3", "0.20.2rc1.dev60+ge47c98ef7",
    "0.20.2rc1.dev93+g51f22dcfd", "0.20.2rc1.dev209+g5536fc0c0", "0.20.2rc1.dev338+gbf0d2dc6d",
    "0.21.0", "0.21.1rc0", "0.21.1rc0+gd735968f6d63", "0.21.1rc0+gbf610c2f5676",
    "0.20.2rc1.dev371+gbf610c2f5", "0.21.1rc0+g626fa9bba5", "0.21.1rc0+g626fa9bba566",
    "nightly-626fa9bba5663a5cf6a870debf031ee344ddb822", "0.20.2rc1.dev733+g626fa9bba5",
    "0.22.1rc1.dev195+gda1daf40b", "0.22.1rc1.dev195+gda1daf40bf18e5eaae04f26a80a537c8168a8bc2",
    "nightly-da1daf40bf18e5eaae04f26a80a537c8168a8bc2", "0.22.1rc1.dev259+g303916e93",
    "0.22.1rc1.dev259+g303916e93d66", "nightly-303916e93", "nightly-303916e93d66",
    "0.22.1rc1.dev491+g1033ffac2", "0.22.1rc1.dev491+g1033ffac2d66", "nightly-1033ffac2",
    "0.23.1rc1.dev101+g4c6266331", "0.23.1rc1.dev101+g4c626633159", "nightly-4c626633",
    "nightly-4c626633159887b0f2c962058c17c78f1434556d", "0.23.1rc1.dev301+g04c2a8dea",
    "nightly-04c2a8dea", "0.23.1rc1.dev424+g3f5a1e173",
    "nightly-3f5a1e1733200760169ff31ebe60a271072b199e", "0.23.1rc1.dev672+g93d8f834d",
    "nightly-93d8f834dd8acf33eb0e2a75b2711b628cb6e226", "0.23.1rc1.dev714+g09663abde",
    "nightly-09663abde0f50944a8d5ea30120666024b503faa", "0.23.1rc1.dev748+g2dfaae752",
    "nightly-2dfaae752b4db0d43cfc0715c780e33be030d0f1",
)  # fmt: skip
V12_PENDING: tuple[str, ...] = ("0.21.0", "0.21.1rc0", "0.21.1rc0+gd735968f6d63",
                                "0.21.1rc0+gbf610c2f5676")
# v12.0.0 (2026-06-29) predates the dev672/dev714/dev748 promotions (2026-07-01..04): the
# reference gives only v12.1.0's list, this one is that list without them.
V12_0_PINS = V12_1_PINS[:-6]


def _pins(pins: tuple[str, ...], note: str) -> tuple[tuple[str, str], ...]:
    return tuple((p, note) for p in pins)


def _pins_yaml(current: str, rollback: str, image: str, digest: str) -> str:
    return (f'current: "{current}"\nrollback: "{rollback}"\nstable_release: "v0.24.0"\n'
            f'current_image: "vllm/vllm-openai:{image}"\ncurrent_image_digest: "{digest}"\n')


_DEV424 = _pins_yaml("0.23.1rc1.dev424+g3f5a1e173", "0.23.1rc1.dev301+g04c2a8dea",
                     "nightly-3f5a1e173", "vllm/vllm-openai@sha256:"
                     "c4fac672fcab4560b6572cc216ddbde94b5ed28f90cc8119b996fc868fe728d4")
_DEV748 = _pins_yaml("0.23.1rc1.dev748+g2dfaae752", "0.23.1rc1.dev714+g09663abde",
                     "nightly-2dfaae752", "vllm/vllm-openai@sha256:"
                     "6a93ae4316826f3dd8a92bee5442cbed50184a9cbd688d310f9e56ecad1eabeb")
V12_RELEASES: tuple[Release, ...] = (
    Release("v12.0.0", "Genesis vLLM Patches — v12 public release (tidied)",
            "The sndr/ layout; history rewritten (the v7 tree stays on dev).",
            "2026-06-27T09:00:00Z", "v12-public", _pins(V12_0_PINS, "validated"), V12_PENDING,
            pins_yaml=_DEV424),
    Release("v12.0.0", "release: v12.0.0 — registry lifecycles, vllm_version_range",
            "Retired patches hard-skipped (GENESIS_ALLOW_RETIRED=1 to force); version ranges\n"
            "enforced with GENESIS_ENFORCE_VERSION_RANGE=1.", "2026-06-29T12:00:00Z", "v12.0.0",
            _pins(V12_0_PINS, "validated"), V12_PENDING, tag=True, pins_yaml=_DEV424),
    Release("v12.1.0", "release: v12.1.0 — dev748 promotion",
            "dev672 and dev714 graduated, dev748 promoted to KNOWN_GOOD.",
            "2026-07-04T11:47:30Z", "v12.1.0", _pins(V12_1_PINS, "validated"), V12_PENDING,
            tag=True, pins_yaml=_DEV748),
    Release("v12.1.0", "docs: install.sh clones Sandermage/sndr_core_engine",
            "The repository was renamed; the old name redirects.", "2026-07-08T08:00:00Z",
            "main-2026-07-08", _pins(V12_1_PINS, "validated"), V12_PENDING, pins_yaml=_DEV748),
)


@dataclass(frozen=True)
class Generation:
    """One layout of the repository and the branch that carries it."""

    name: str  # "v7" | "v12"
    branch: str
    kernel_dir: str  # where genesis_src/common/ is copied
    releases: tuple[Release, ...]

    @property
    def src(self) -> Path:
        return SRC / self.name


GENERATIONS: tuple[Generation, ...] = (
    Generation("v7", "dev", "vllm/_genesis/kernel", V7_RELEASES),
    Generation("v12", "main", "sndr/kernel", V12_RELEASES),
)


class GenesisCommit(NamedTuple):
    sha: str
    title: str
    allowlist: tuple[str, ...]  # KNOWN_GOOD_VLLM_PINS
    pending: tuple[str, ...] = ()  # PROMOTION_PENDING_VLLM_PINS
    layout: str = "v7"
    branch: str = "dev"
    tag: str = ""


@dataclass(frozen=True)
class GenesisFixture:
    repo_path: Path
    commits: list[GenesisCommit]  # the v7 commits on dev, oldest first
    main_commits: list[GenesisCommit]  # the v12 commits on main, oldest first
    releases: dict[str, str]  # tag or v7 release -> sha (the newest commit of that release)
    tags: dict[str, str] = field(default_factory=dict)
    real_path: Path | None = None

    @property
    def alias_path(self) -> Path:
        return self.repo_path.with_name(OLD_REPO_NAME)

    @property
    def main(self) -> str:
        return self.main_commits[-1].sha

    @property
    def branches(self) -> dict[str, str]:
        return {"dev": self.commits[-1].sha, "main": self.main}

    def all_commits(self) -> list[GenesisCommit]:
        return self.commits + self.main_commits

    def allowlist(self, sha: str) -> tuple[str, ...]:
        return next(c.allowlist for c in self.all_commits() if c.sha == sha)

    def url(self, base: str = "http://git.rigfleet.test:8090") -> str:
        return f"{base.rstrip('/')}/{self.repo_path.name}"


# --- rendering --------------------------------------------------------------------------------

def _render(text: str, values: dict[str, str]) -> str:
    out = []
    for line in text.splitlines(keepends=True):
        marker = line.find("genesis-fixture:")
        if marker < 0:
            out.append(line)
            continue
        key = line[marker + len("genesis-fixture:") :].strip().removesuffix("-->").strip()
        if key not in values:
            raise KeyError(f"genesis_src: unknown fixture key {key!r} in line {line!r}")
        out.append(values[key].rstrip("\n") + "\n")
    return "".join(out)


def _tuple(name: str, pins: tuple[tuple[str, str], ...] | tuple[str, ...]) -> str:
    lines = [f"{name}: tuple[str, ...] = ("]
    for item in pins:
        pin, note = item if isinstance(item, tuple) else (item, "")
        lines.append(f'    "{pin}",' + (f"  # {note}" if note else ""))
    return "\n".join(lines) + "\n)"


def _values(gen: Generation, upto: tuple[Release, ...], dev_shas: list[str]) -> dict[str, str]:
    release = upto[-1]
    sections = [(gen.src / "releases" / f"{r.notes}.md").read_text() for r in reversed(upto)]
    values = {
        "pins": _tuple("KNOWN_GOOD_VLLM_PINS", release.known_good),
        "changelog": "\n".join(s.rstrip("\n") + "\n" for s in sections),
        "registry": genesis_patches.render_registry(gen.name),
        "text-patches": genesis_patches.render_text_patches(gen.name),
    }
    number = release.version.lstrip("v")
    if gen.name == "v7":
        values.update({"version": f'VERSION = "{release.version}"',
                       "plugin-version": f'version = "{number}"'})
    else:
        values.update({
            "version": f'__version__ = "{number}"',
            "project-version": f'version = "{number}"',
            "pending": _tuple("PROMOTION_PENDING_VLLM_PINS", release.pending),
            "genesis-pins": _tuple("KNOWN_GOOD_GENESIS_PINS",
                                   tuple((s[:7], "dev-branch v7 release") for s in dev_shas)),
            "pins-yaml": release.pins_yaml,
        })
    return values


def render_release(gen: Generation, upto: tuple[Release, ...], dest: Path,
                   dev_shas: list[str] | None = None) -> None:
    """Write the repository's files as of the last release in ``upto`` into ``dest``."""
    values = _values(gen, upto, dev_shas or [])
    sources = [(p, p.relative_to(gen.src / "tree")) for p in (gen.src / "tree").rglob("*")]
    sources += [(p, Path(gen.kernel_dir) / p.relative_to(SRC / "common"))
                for p in (SRC / "common").rglob("*")]
    for src, rel in sorted(sources, key=lambda s: str(s[1])):
        if src.is_dir() or "__pycache__" in src.parts:
            continue
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(_render(src.read_text(encoding="utf-8"), values), encoding="utf-8")
        os.chmod(out, 0o644)  # git records the exec bit; keep every file 100644


# --- git --------------------------------------------------------------------------------------

def _git_env(home: Path) -> dict[str, str]:
    """A git environment free of any system/user configuration (determinism, no surprises)."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "LC_ALL": "C",
        "TZ": "UTC",
    }


def _git(env: dict[str, str], *args: str, cwd: Path | None = None, stdin: str | None = None) -> str:
    proc = subprocess.run(
        ["git", *args], env=env, cwd=cwd, input=stdin, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"git {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}"
        )
    return proc.stdout.strip()


def _stamp(date: str) -> str:
    return f"{calendar.timegm(time.strptime(date, '%Y-%m-%dT%H:%M:%SZ'))} +0000"


def _commit_generation(gen: Generation, bare: dict[str, str], tmp: Path,
                       dev_shas: list[str]) -> list[GenesisCommit]:
    commits: list[GenesisCommit] = []
    parent: str | None = None
    for i, release in enumerate(gen.releases):
        work = tmp / f"{gen.name}-work-{i}"
        render_release(gen, gen.releases[: i + 1], work, dev_shas)
        stamp = _stamp(release.date)
        step = {
            **bare,
            "GIT_WORK_TREE": str(work),
            "GIT_INDEX_FILE": str(tmp / f"{gen.name}-index-{i}"),  # fresh index: tree == files
            "GIT_AUTHOR_NAME": AUTHOR[0], "GIT_AUTHOR_EMAIL": AUTHOR[1],
            "GIT_AUTHOR_DATE": stamp,
            "GIT_COMMITTER_NAME": AUTHOR[0], "GIT_COMMITTER_EMAIL": AUTHOR[1],
            "GIT_COMMITTER_DATE": stamp,
        }  # fmt: skip
        _git(step, "add", "--all", ".", cwd=work)
        tree = _git(step, "write-tree", cwd=work)
        parents = ["-p", parent] if parent else []
        sha = _git(step, "commit-tree", tree, *parents, "-F", "-", cwd=work,
                   stdin=f"{release.subject}\n\n{release.body}\n")
        if release.tag:
            _git(bare, "update-ref", f"refs/tags/{release.version}", sha)
        commits.append(GenesisCommit(sha, release.subject, tuple(p for p, _ in release.known_good),
                                     release.pending, gen.name, gen.branch,
                                     release.version if release.tag else ""))
        parent = sha
    assert parent is not None
    _git(bare, "update-ref", f"refs/heads/{gen.branch}", parent)
    return commits


def _finish(bare: dict[str, str]) -> None:
    """One pack (fewer dumb-HTTP round trips), then the info files dumb HTTP clients read."""
    _git(bare, "repack", "-a", "-d", "-q")
    _git(bare, "prune-packed")
    _git(bare, "update-server-info")


def build_genesis_fixture(git_root: Path, bundle: Path | None = None) -> GenesisFixture:
    """(Re)build ``<git_root>/sndr_core_engine.git`` (same SHAs on every build), its old-name
    alias, and, when ``bundle`` exists, ``<git_root>/real/sndr_core_engine.git`` from it."""
    git_root.mkdir(parents=True, exist_ok=True)
    repo = git_root / REPO_NAME
    if repo.exists():
        shutil.rmtree(repo)
    with tempfile.TemporaryDirectory(prefix="genesis-fixture-") as tmp_name:
        tmp = Path(tmp_name)
        env = _git_env(tmp)
        _git(env, "init", "--quiet", "--bare", "--template=", str(repo))
        bare = {**env, "GIT_DIR": str(repo)}
        _git(bare, "symbolic-ref", "HEAD", "refs/heads/main")
        dev = _commit_generation(GENERATIONS[0], bare, tmp, [])
        main = _commit_generation(GENERATIONS[1], bare, tmp, [c.sha for c in dev])
        _finish(bare)
    alias = git_root / OLD_REPO_NAME
    if alias.is_symlink() or alias.exists():
        alias.unlink() if alias.is_symlink() or alias.is_file() else shutil.rmtree(alias)
    alias.symlink_to(REPO_NAME)  # GitHub redirects the old name of a renamed repository
    releases = {r.version: c.sha for r, c in zip(V7_RELEASES, dev, strict=True)}
    tags = {c.tag: c.sha for c in main if c.tag}
    real = import_bundle(bundle, git_root / REAL_DIR / REPO_NAME) if bundle else None
    return GenesisFixture(repo, dev, main, {**releases, **tags}, tags, real)


def import_bundle(bundle: Path, dest: Path) -> Path | None:
    """``dest`` as a bare repository holding every ref of ``bundle`` (HEAD -> the first branch,
    since the bundle has no HEAD and no main); None when the bundle is absent. Re-imports only
    when the bundle's refs differ from what ``dest`` holds."""
    if not bundle.is_file():
        return None
    with tempfile.TemporaryDirectory(prefix="genesis-real-") as tmp:
        env = _git_env(Path(tmp))
        heads = [line.split(" ", 1) for line in
                 _git(env, "bundle", "list-heads", str(bundle)).splitlines() if " " in line]
        wanted = sorted(f"{sha} {ref}" for sha, ref in heads)
        if (dest / "HEAD").is_file():
            have = _git({**env, "GIT_DIR": str(dest)}, "for-each-ref",
                        "--format=%(objectname) %(refname)").splitlines()
            if sorted(have) == wanted:
                return dest
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        _git(env, "init", "--quiet", "--bare", "--template=", str(dest))
        bare = {**env, "GIT_DIR": str(dest)}
        _git(bare, "fetch", "--quiet", str(bundle), "refs/*:refs/*")
        branches = sorted(ref for _, ref in heads if ref.startswith("refs/heads/"))
        if branches:
            _git(bare, "symbolic-ref", "HEAD", branches[0])
        _finish(bare)
    return dest


if __name__ == "__main__":  # python -m rigfleet_testbed.genesis_fixture <git_root> [bundle]
    import sys

    fx = build_genesis_fixture(Path(sys.argv[1]), Path(sys.argv[2]) if sys.argv[2:] else None)
    for c in fx.all_commits():
        print(c.sha, c.branch, c.tag or "-", c.title)
