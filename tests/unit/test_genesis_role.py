"""The Genesis role's commands in a real shell against a repository of the real shape
(``genesis_trees.genesis_repo``: v7 only on ``dev``, v12 only as tags, no ``main``, one commit
only ``refs/pull/*`` reaches): the checkout reaches every pinned commit without relying on the
default branch, and the export holds the pinned layout's entry point.

Run: ``.venv/bin/python -m pytest tests/unit/test_genesis_role.py -q``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from genesis_trees import FixtureRepo, _git, genesis_repo, v12_files

from roles.genesis import checkout_commands, export_command


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> FixtureRepo:
    return genesis_repo(tmp_path_factory.mktemp("genesis"))


def converge(repo_url: str, commit: str, dest: Path) -> subprocess.CompletedProcess[str]:
    """Run the checkout commands as the operation yields them (stop at the first failure)."""
    cloned = (dest / ".git").is_dir()
    run = subprocess.CompletedProcess[str]([], 0, "", "")
    for command in checkout_commands(repo_url, commit, str(dest), cloned):
        run = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)
        if run.returncode != 0:
            return run
    return run


def head(dest: Path) -> str:
    return subprocess.run(["git", "-C", str(dest), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip


@pytest.mark.parametrize("name", ["v7.72.2", "v12.1.0", "pull-only"])
def test_fresh_checkout_reaches_commits_of_no_default_branch(repo, tmp_path, name) -> None:
    # The bare repository's HEAD names a main that does not exist: a clone would check out
    # nothing; the role fetches every branch and tag, then the sha itself.
    dest = tmp_path / "checkout"
    run = converge(repo.url, repo.commits[name], dest)
    assert run.returncode == 0, run.stderr
    assert head(dest) == repo.commits[name]


def test_repin_fetches_a_tag_made_after_the_first_checkout(repo, tmp_path) -> None:
    dest = tmp_path / "checkout"
    assert converge(repo.url, repo.commits["v7.72.2"], dest).returncode == 0
    # A new release tag on a commit no branch reaches, pushed after the host cloned.
    work = tmp_path / "work"
    _git(tmp_path, "clone", "-q", "--no-checkout", repo.url, str(work))
    _git(work, "fetch", "-q", "origin", repo.commits["pull-only"])
    _git(work, "checkout", "-q", "--detach", repo.commits["pull-only"])
    _git(work, "commit", "-q", "--allow-empty", "-m", "release v12.1.1",
         date="2026-07-20T09:00:00Z")
    new = _git(work, "rev-parse", "HEAD")
    _git(work, "tag", "v12.1.1-test")
    _git(work, "push", "-q", "origin", "v12.1.1-test")
    try:
        run = converge(repo.url, new, dest)
        assert run.returncode == 0, run.stderr
        assert head(dest) == new
        tags = subprocess.run(["git", "-C", str(dest), "tag"], capture_output=True, text=True)
        assert "v12.1.1-test" in tags.stdout.split()
        # Back to the older pin: local, no fetch needed.
        assert converge("file:///nonexistent.git", repo.commits["v7.72.2"], dest).returncode == 0
        assert head(dest) == repo.commits["v7.72.2"]
    finally:
        _git(repo.path, "tag", "-d", "v12.1.1-test")


def test_a_commit_no_ref_reaches_is_refused_with_a_clear_line(repo, tmp_path) -> None:
    run = converge(repo.url, "f" * 40, tmp_path / "checkout")
    assert run.returncode == 1
    assert (f"rigfleet: Genesis commit {'f' * 40} is on no branch or tag of {repo.url}, and the "
            "server does not hand it out by its sha") in run.stderr  # fmt: skip


def test_export_requires_the_pinned_layouts_entry_point(repo, tmp_path) -> None:
    dest, trees = tmp_path / "checkout", tmp_path / "trees"
    commit = repo.commits["v12.1.0"]
    assert converge(repo.url, commit, dest).returncode == 0
    ok = subprocess.run(["sh", "-c", export_command(str(dest), commit, "sndr/apply/__main__.py",
                                                    str(trees))], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert (trees / commit / "sndr/apply/__main__.py").is_file()
    # The data outside sndr/ that v12 patches read at apply time is exported too.
    assert (trees / commit / "tests/unit/integrations/fixtures/post_patch.py.txt").is_file()
    assert set(v12_files([], [])) <= {str(p.relative_to(trees / commit))
                                      for p in (trees / commit).rglob("*") if p.is_file()}
    wrong = subprocess.run(["sh", "-c", export_command(
        str(dest), commit, "vllm/_genesis/patches/apply_all.py", str(trees))],
        capture_output=True, text=True)  # fmt: skip
    assert wrong.returncode != 0
    # Nothing is renamed into place: the tree exported before is untouched.
    assert (trees / commit / "sndr/apply/__main__.py").is_file()
