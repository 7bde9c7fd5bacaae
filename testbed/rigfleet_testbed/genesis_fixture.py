"""The Genesis fixture: a bare git repository ``genesis-vllm-patches.git`` with two releases.

The sources live in ``testbed/rigfleet_testbed/genesis_src/tree/`` (the repository's files) and
``genesis_src/releases/`` (one CHANGELOG section per release). Lines marked
``# genesis-fixture: <key>`` (or ``<!-- genesis-fixture: <key> -->``) are replaced per release:
``version``, ``pins`` (``KNOWN_GOOD_VLLM_PINS``), ``plugin-version``, ``changelog``.

Commits are made with git's plumbing under a scrubbed environment (no system or user config,
fixed author/committer ``Genesis Fixture <genesis@rigfleet.test>`` and dates), so the SHAs are
the same on every machine and every build::

    from rigfleet_testbed.genesis_fixture import build_genesis_fixture
    fx = build_genesis_fixture(Path(".testbed/services/git"))
    fx.repo_path                  # .../genesis-vllm-patches.git (bare, update-server-info done)
    sha, title, allowlist = fx.commits[0]     # release(v7.72.2)
    fx.main                       # sha of release(v7.73.0), what refs/heads/main points at
    fx.releases["v7.72.2"]        # version -> sha

Served by the services container as ``http://git.rigfleet.test:8090/genesis-vllm-patches.git``.
"""

from __future__ import annotations

import calendar
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

REPO_NAME = "genesis-vllm-patches.git"
SRC = Path(__file__).with_name("genesis_src")
AUTHOR = ("Genesis Fixture", "genesis@rigfleet.test")


@dataclass(frozen=True)
class Release:
    """One release commit; ``new_pins`` are added to the previous release's allowlist."""

    version: str
    subject: str
    body: str
    date: str  # UTC, "%Y-%m-%dT%H:%M:%SZ"
    new_pins: tuple[tuple[str, str], ...]  # (pin, why it is trusted)


RELEASES: tuple[Release, ...] = (
    Release(
        version="v7.72.2",
        subject="release(v7.72.2): vllm pin allowlist gate, P67 TQ multi-query kernel",
        body=(
            "KNOWN_GOOD_VLLM_PINS gate in apply_all (GENESIS_VLLM_PIN_POLICY=warn|strict).\n"
            "Validated pins: 0.20.1rc1.dev16+g7a1eb8ac2, 0.20.2rc1.dev9+g01d4d1ad3."
        ),
        date="2026-05-05T09:30:00Z",
        new_pins=(
            ("0.20.1rc1.dev16+g7a1eb8ac2", "v7.65 PROD baseline"),
            ("0.20.2rc1.dev9+g01d4d1ad3", "v7.70 pin-bump target, validated 2026-05-04"),
        ),
    ),
    Release(
        version="v7.73.0",
        subject="release(v7.73.0): allowlist vllm 0.20.2rc1.dev212 and dev240",
        body="Boot + smoke validated on 2x RTX 3090 (TQ3 + MTP).",
        date="2026-05-12T14:00:00Z",
        new_pins=(
            ("0.20.2rc1.dev212+g3f9c2a7e5", "validated 2026-05-11"),
            ("0.20.2rc1.dev240+gb7e4d1c9a", "validated 2026-05-12 (boot + smoke)"),
        ),
    ),
)


class GenesisCommit(NamedTuple):
    sha: str
    title: str
    allowlist: tuple[str, ...]


@dataclass(frozen=True)
class GenesisFixture:
    repo_path: Path
    commits: list[GenesisCommit]  # oldest first
    releases: dict[str, str]  # version -> sha

    @property
    def main(self) -> str:
        return self.commits[-1].sha

    def allowlist(self, sha: str) -> tuple[str, ...]:
        return next(c.allowlist for c in self.commits if c.sha == sha)

    def url(self, base: str = "http://git.rigfleet.test:8090") -> str:
        return f"{base.rstrip('/')}/{self.repo_path.name}"


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


def _values(upto: tuple[Release, ...]) -> dict[str, str]:
    release = upto[-1]
    pins = [p for r in upto for p in r.new_pins]
    pin_lines = "".join(f'    "{pin}",  # {note}\n' for pin, note in pins)
    sections = [(SRC / "releases" / f"{r.version}.md").read_text() for r in reversed(upto)]
    return {
        "version": f'VERSION = "{release.version}"',
        "pins": f"KNOWN_GOOD_VLLM_PINS: tuple[str, ...] = (\n{pin_lines})",
        "plugin-version": f'version = "{release.version.lstrip("v")}"',
        "changelog": "\n".join(s.rstrip("\n") + "\n" for s in sections),
    }


def render_release(upto: tuple[Release, ...], dest: Path) -> None:
    """Write the repository's files as of the last release in ``upto`` into ``dest``."""
    values = _values(upto)
    tree = SRC / "tree"
    for src in sorted(tree.rglob("*")):
        if src.is_dir() or "__pycache__" in src.parts:
            continue
        out = dest / src.relative_to(tree)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(_render(src.read_text(encoding="utf-8"), values), encoding="utf-8")
        os.chmod(out, 0o644)  # git records the exec bit; keep every file 100644


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


def build_genesis_fixture(git_root: Path) -> GenesisFixture:
    """(Re)build ``<git_root>/genesis-vllm-patches.git``; same SHAs on every build."""
    git_root.mkdir(parents=True, exist_ok=True)
    repo = git_root / REPO_NAME
    if repo.exists():
        shutil.rmtree(repo)
    commits: list[GenesisCommit] = []
    with tempfile.TemporaryDirectory(prefix="genesis-fixture-") as tmp_name:
        tmp = Path(tmp_name)
        env = _git_env(tmp)
        _git(env, "init", "--quiet", "--bare", "--template=", str(repo))
        bare = {**env, "GIT_DIR": str(repo)}
        _git(bare, "symbolic-ref", "HEAD", "refs/heads/main")
        parent: str | None = None
        for i, release in enumerate(RELEASES):
            upto = RELEASES[: i + 1]
            work = tmp / f"work-{i}"
            render_release(upto, work)
            stamp = _stamp(release.date)
            step = {
                **bare,
                "GIT_WORK_TREE": str(work),
                "GIT_INDEX_FILE": str(tmp / f"index-{i}"),  # fresh index: tree == rendered files
                "GIT_AUTHOR_NAME": AUTHOR[0],
                "GIT_AUTHOR_EMAIL": AUTHOR[1],
                "GIT_AUTHOR_DATE": stamp,
                "GIT_COMMITTER_NAME": AUTHOR[0],
                "GIT_COMMITTER_EMAIL": AUTHOR[1],
                "GIT_COMMITTER_DATE": stamp,
            }
            _git(step, "add", "--all", ".", cwd=work)
            tree = _git(step, "write-tree", cwd=work)
            message = f"{release.subject}\n\n{release.body}\n"
            parents = ["-p", parent] if parent else []
            sha = _git(step, "commit-tree", tree, *parents, "-F", "-", cwd=work, stdin=message)
            allowlist = tuple(p for r in upto for p, _ in r.new_pins)
            commits.append(GenesisCommit(sha, release.subject, allowlist))
            parent = sha
        assert parent is not None
        _git(bare, "update-ref", "refs/heads/main", parent)
        # One pack (fewer dumb-HTTP round trips), then the info files dumb HTTP clients read.
        _git(bare, "repack", "-a", "-d", "-q")
        _git(bare, "prune-packed")
        _git(bare, "update-server-info")
    return GenesisFixture(
        repo_path=repo,
        commits=commits,
        releases={r.version: c.sha for r, c in zip(RELEASES, commits, strict=True)},
    )


if __name__ == "__main__":  # python -m rigfleet_testbed.genesis_fixture <git_root>
    import sys

    fx = build_genesis_fixture(Path(sys.argv[1]))
    for c in fx.commits:
        print(c.sha, c.title, ", ".join(c.allowlist))
