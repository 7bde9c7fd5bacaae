"""Small Genesis trees of both layouts, and a git repository shaped like the real one, for tests.

The files are written here (never copied from Genesis): just enough of each layout for what
rigfleet reads (marker files, guards, registry, version, v12's ``Flags``), with the facts that
matter taken from the real history (upstream-2026.md §3): v7 reads each patch's ``env_flag``
literally and never skips retired patches; v12 reads ``GENESIS_ENABLE_``/``SNDR_ENABLE_``
suffixes, honours ``env_flag_aliases`` and skips retired patches; legacy patches are switched
by ``GENESIS_LEGACY_<id>``.

The repository (``genesis_repo``) has the real shape: v7 commits only on branch ``dev``, the
v12 releases only as tags (``v12.0.0``, ``v12.1.0``) on a history with no common root, no
``main``, and one commit that only a ``refs/pull/*`` ref reaches::

    repo = genesis_repo(tmp_path)
    repo.url, repo.commits["v7.72.2"], repo.commits["v12.1.0"]
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

NEVER_RUN = "raise SystemExit('a Genesis fixture file was executed; rigfleet must only parse it')\n"

V7_REGISTRY = '''
PATCH_REGISTRY = {
    "P4": {"env_flag": "GENESIS_LEGACY_P4", "default_on": True, "lifecycle": "legacy"},
    "P40": {"env_flag": "GENESIS_ENABLE_P40", "default_on": False, "deprecated": True},
    "P58": {"env_flag": "GENESIS_ENABLE_P58_ASYNC_PLACEHOLDER_FIX", "default_on": False},
    "P64": {"env_flag": "GENESIS_ENABLE_P64_QWEN3CODER_MTP_STREAMING", "default_on": False},
    "P67": {"env_flag": "GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL", "default_on": False},
    "P67b": {"env_flag": "GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL", "default_on": False},
    "P87": {"env_flag": "GENESIS_ENABLE_P87", "default_on": False},
    "PN13": {"env_flag": "GENESIS_ENABLE_PN13_CUDA_GRAPH_LAMBDA_ARITY", "default_on": False,
             "lifecycle": "retired"},
}
ENV_FLAGS = frozenset(m["env_flag"] for m in PATCH_REGISTRY.values())
'''

V12_REGISTRY = '''
from typing import Any

PATCH_REGISTRY: dict[str, dict[str, Any]] = {
    "P4": {"env_flag": "GENESIS_LEGACY_P4", "default_on": True, "lifecycle": "legacy"},
    "P58": {"env_flag": "GENESIS_ENABLE_P58_ASYNC_PLACEHOLDER_FIX", "default_on": False,
            "lifecycle": "experimental"},
    "P61b": {"env_flag": "GENESIS_ENABLE_P61B_STREAMING_OVERLAP", "default_on": False,
             "lifecycle": "experimental",
             "env_flag_aliases": ["GENESIS_ENABLE_P59_QWEN3_TOOL_RECOVERY"]},
    "P64": {"env_flag": "GENESIS_ENABLE_P64_QWEN3CODER_MTP_STREAMING", "default_on": False,
            "lifecycle": "retired",
            "env_flag_aliases": ["GENESIS_ENABLE_P61C_QWEN3CODER_DEFERRED_COMMIT"]},
    "P67": {"env_flag": "GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL", "default_on": False,
            "lifecycle": "experimental", "vllm_version_range": (">=0.20.0", "<0.24.0")},
    "P67b": {"env_flag": "GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL", "default_on": False,
             "lifecycle": "experimental"},
    "P87": {"env_flag": "GENESIS_ENABLE_P87", "default_on": False, "lifecycle": "experimental"},
    "PN13": {"env_flag": "GENESIS_ENABLE_PN13_CUDA_GRAPH_LAMBDA_ARITY", "default_on": False,
             "lifecycle": "retired"},
    "PN26b": {"env_flag": "GENESIS_ENABLE_PN26_SPARSE_V", "default_on": False,
              "lifecycle": "research"},
    "PN282": {"env_flag": "SNDR_ENABLE_SPEC_DECODE_ACCEPTANCE_METRIC", "default_on": False,
              "lifecycle": "stable"},
    "PN346": {"title": "Mamba/GDN cache hit boundary fix for MTP + prefix caching",
              "env_flag": "GENESIS_ENABLE_PN346", "default_on": True, "category": "correctness",
              "lifecycle": "experimental",
              "applies_to": {"vllm_version_range": (">=0.21.0", "<0.24.0")}},
}
'''

V12_FLAGS = '''
class Flags:
    P4 = "P4"
    P58_ASYNC_PLACEHOLDER_FIX = "P58_ASYNC_PLACEHOLDER_FIX"
    BUNDLE_REASONING_QWEN3 = "BUNDLE_REASONING_QWEN3"
    NO_PATCH_CACHE = "NO_PATCH_CACHE"
'''


def guards(known: list[str], pending: list[str] | None = None) -> str:
    text = NEVER_RUN + f"KNOWN_GOOD_VLLM_PINS: tuple[str, ...] = {tuple(known)!r}\n"
    if pending is not None:
        text += f"PROMOTION_PENDING_VLLM_PINS: tuple[str, ...] = {tuple(pending)!r}\n"
    return text + "ALL = KNOWN_GOOD_VLLM_PINS + compute()\n"


def v7_files(known: list[str], version: str = "v7.63.x", registry: str = V7_REGISTRY
             ) -> dict[str, str]:  # fmt: skip
    """A v7 tree (``vllm/_genesis``)."""
    return {
        "vllm/_genesis/__init__.py": "",
        "vllm/_genesis/__version__.py": f'VERSION = "{version}"\n__version__ = VERSION\n',
        "vllm/_genesis/patches/__init__.py": "",
        "vllm/_genesis/patches/apply_all.py": NEVER_RUN,
        "vllm/_genesis/guards.py": guards(known),
        "vllm/_genesis/dispatcher.py": NEVER_RUN + registry,
        "tools/genesis_vllm_plugin/pyproject.toml": '[project]\nversion = "7.0.0.dev0"\n',
    }


def v12_files(known: list[str], pending: list[str], version: str = "12.1.0") -> dict[str, str]:
    """A v12 tree (top-level ``sndr``), with data outside ``sndr/`` as the real one has."""
    return {
        "pyproject.toml": (f'[build-system]\nrequires = ["setuptools"]\n\n[project]\n'
                           f'name = "sndr-platform"\nversion = "{version}"\n\n'
                           '[tool.other]\nversion = "0.0.1"\n'),
        "sndr/__init__.py": "",
        "sndr/apply/__init__.py": NEVER_RUN,
        "sndr/apply/__main__.py": NEVER_RUN,
        "sndr/env.py": NEVER_RUN + V12_FLAGS,
        "sndr/engines/vllm/detection/guards.py": guards(known, pending),
        "sndr/dispatcher/registry.py": NEVER_RUN + V12_REGISTRY,
        "tests/unit/integrations/fixtures/post_patch.py.txt": "data a patch reads at apply time\n",
    }


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """Write ``files`` (relative path -> text) under ``root``; returns ``root``."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


V7_KNOWN = ["0.20.1rc1.dev16+g7a1eb8ac2", "0.20.2rc1.dev9+g01d4d1ad3"]
V12_KNOWN = [*V7_KNOWN, "0.20.2rc1.dev338+gbf0d2dc6d", "0.23.1rc1.dev748+g2dfaae752",
             "nightly-626fa9bba5663a5cf6a870debf031ee344ddb822"]
V12_PENDING = ["0.21.0", "0.21.1rc0"]


@dataclass
class FixtureRepo:
    """A bare repository of the real shape (see the module docstring).

    + url: ``file://`` URL of the bare repository
    + commits: name -> sha: ``v7.72.2`` (dev), ``dev-tip`` (dev, lists dev212), ``v12.0.0``
      (tag), ``v12.1.0`` (tag), ``pull-only`` (only refs/pull/7/head reaches it)
    """

    path: Path
    commits: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.path.as_uri()


def _git(cwd: Path, *args: str, date: str = "2026-05-05T09:00:00Z") -> str:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd),
        "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "Fixture", "GIT_AUTHOR_EMAIL": "f@x.test",
        "GIT_COMMITTER_NAME": "Fixture", "GIT_COMMITTER_EMAIL": "f@x.test",
        "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date, "LC_ALL": "C",
    }  # fmt: skip
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()  # fmt: skip


def _commit(work: Path, files: dict[str, str], subject: str, date: str) -> str:
    for child in work.iterdir():
        if child.name != ".git":
            subprocess.run(["rm", "-rf", str(child)], check=True)
    write_tree(work, files)
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", subject, date=date)
    return _git(work, "rev-parse", "HEAD")


def genesis_repo(tmp: Path) -> FixtureRepo:
    """Build the repository under ``tmp`` (see ``FixtureRepo``)."""
    work = tmp / "work"
    work.mkdir(parents=True)
    _git(work, "init", "-q", "-b", "dev")
    repo = FixtureRepo(tmp / "genesis.git")
    c = repo.commits
    c["v7.72.2"] = _commit(work, v7_files(V7_KNOWN), "release(v7.72.2): fixture v7 release",
                           "2026-05-05T09:00:00Z")
    c["dev-tip"] = _commit(work, v7_files([*V7_KNOWN, "0.20.2rc1.dev212+g3f9c2a7e5"]),
                           "allowlist: 0.20.2rc1.dev212", "2026-05-06T09:00:00Z")
    _git(work, "checkout", "-q", "--orphan", "v12-line")
    c["v12.0.0"] = _commit(work, v12_files(V12_KNOWN, ["0.21.0"], "12.0.0"),
                           "Genesis v12 public release (fixture)", "2026-06-29T09:00:00Z")
    _git(work, "tag", "v12.0.0")
    c["v12.1.0"] = _commit(work, v12_files(V12_KNOWN, V12_PENDING),
                           "Merge pull request #46 from fixture/release-v12.1.0",
                           "2026-07-04T09:00:00Z")
    _git(work, "tag", "v12.1.0")
    c["pull-only"] = _commit(work, v12_files(V12_KNOWN, [*V12_PENDING, "0.22.0"], "12.2.0"),
                             "wip: not merged", "2026-07-10T09:00:00Z")
    _git(work, "update-ref", "refs/pull/7/head", c["pull-only"])
    _git(work, "checkout", "-q", "dev")
    _git(work, "branch", "-q", "-D", "v12-line")
    _git(tmp, "init", "-q", "--bare", str(repo.path))
    _git(work, "push", "-q", str(repo.path), "dev", "v12.0.0", "v12.1.0", "refs/pull/7/head")
    # The bare repository's HEAD names refs/heads/main, which does not exist (as in the bundle).
    _git(repo.path, "symbolic-ref", "HEAD", "refs/heads/main")
    return repo



def v7_registry(switches: list[str]) -> str:
    """A v7 dispatcher registry with a patch per ``GENESIS_ENABLE_<switch>`` (id: its prefix)."""
    entries = "".join(f'    "{s.split("_")[0]}": {{"env_flag": "GENESIS_ENABLE_{s}", '
                      f'"default_on": False}},\n' for s in switches)
    return ("PATCH_REGISTRY = {\n" + entries + "}\n"
            "ENV_FLAGS = frozenset(m['env_flag'] for m in PATCH_REGISTRY.values())\n")


def v7_release_repo(tmp: Path, switches: list[str]) -> FixtureRepo:
    """Two v7 releases on ``dev`` as ``rigfleet bump`` reads them (``release(vX)`` subjects, no
    tags), both with a patch per switch: ``v7.72.2`` lists V7_KNOWN, ``v7.73.0`` adds dev212
    and dev240."""
    registry = v7_registry(switches)
    work = tmp / "work"
    work.mkdir(parents=True)
    _git(work, "init", "-q", "-b", "dev")
    repo = FixtureRepo(tmp / "genesis.git")
    c = repo.commits
    c["v7.72.2"] = _commit(work, v7_files(V7_KNOWN, "v7.72.2", registry),
                           "release(v7.72.2): vllm pin allowlist gate", "2026-05-05T09:30:00Z")
    newer = [*V7_KNOWN, "0.20.2rc1.dev212+g3f9c2a7e5", "0.20.2rc1.dev240+gb7e4d1c9a"]
    c["v7.73.0"] = _commit(work, v7_files(newer, "v7.73.0", registry),
                           "release(v7.73.0): allowlist vllm 0.20.2rc1.dev212 and dev240",
                           "2026-05-12T14:00:00Z")
    _git(tmp, "init", "-q", "--bare", str(repo.path))
    _git(work, "push", "-q", str(repo.path), "dev")
    _git(repo.path, "symbolic-ref", "HEAD", "refs/heads/main")
    return repo
