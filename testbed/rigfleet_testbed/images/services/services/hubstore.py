"""The hub fixture on disk, read-only: repositories, commits, files, users.

Layout (written by ``testbed/rigfleet_testbed/model_fixture.py``; any writer following it works)::

    <hub>/_hub.json                  optional; users and their tokens:
        {"users": [{"name": "testbed", "token": "hf_...", "access": ["*"]}]}
        ("access": repo ids, or "*", that the user may read when private or gated)
    <hub>/<org>/<name>/repo.json     the repository (format below)
    <hub>/<org>/<name>/blobs/<sha256>  every file's content, named by its SHA-256

``repo.json``::

    {"format": "rigfleet-hub-repo/1",
     "id": "Org/Name",
     "private": false,                 # true: invisible (401/404 RepoNotFound) without access
     "gated": false,                   # "auto"/"manual": metadata public, file content needs access
     "branches": {"main": "<40-hex>"}, "tags": {},
     "created_at": "2026-05-02T10:11:12Z",
     "info": {...},                    # extra model-info fields (library_name, tags, config, ...)
     "commits": {"<40-hex>": {
         "title": "...", "message": "...", "date": "2026-05-02T10:11:12Z",
         "authors": ["Org"], "parents": [], "tree": "<git tree oid>",
         "files": [{"path": "config.json", "size": 1234, "sha256": "<hex>",
                    "oid": "<git blob oid>",  # of the content, or of the LFS pointer
                    "lfs": null | {"sha256": "<hex>", "size": 1234, "pointerSize": 134}}]}}}

Files and commits are immutable; a writer replaces ``repo.json`` atomically (rename), and this
module re-reads it when its mtime changes, so a fixture can be rebuilt under a running server.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_FORMAT = "rigfleet-hub-repo/1"
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


def valid_repo_id(repo_id: str) -> bool:
    """``org/name`` with Hub-like characters and no path tricks."""
    parts = repo_id.split("/")
    return (
        len(parts) == 2
        and all(_NAME_RE.match(p) for p in parts)
        and not any(".." in p for p in parts)
    )


@dataclass(frozen=True)
class LfsInfo:
    sha256: str
    size: int
    pointer_size: int


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str
    oid: str
    lfs: LfsInfo | None

    @property
    def etag(self) -> str:
        """What the real Hub puts in ETag: the LFS SHA-256, or the git blob id."""
        return self.lfs.sha256 if self.lfs else self.oid


@dataclass(frozen=True)
class Commit:
    sha: str
    title: str
    message: str
    date: str
    authors: tuple[str, ...]
    parents: tuple[str, ...]
    tree: str
    files: dict[str, FileEntry]


@dataclass(frozen=True)
class Repo:
    repo_id: str
    root: Path
    private: bool
    gated: str | bool
    branches: dict[str, str]
    tags: dict[str, str]
    created_at: str | None
    info: dict[str, Any]
    commits: dict[str, Commit]

    def resolve(self, revision: str) -> Commit | None:
        """Branch, tag, ``refs/heads/x``, ``refs/tags/x`` or full commit id -> commit.

        Short commit ids are not accepted: the real Hub needs the full 40-hex id.
        """
        if revision.startswith("refs/heads/"):
            sha = self.branches.get(revision[len("refs/heads/") :])
        elif revision.startswith("refs/tags/"):
            sha = self.tags.get(revision[len("refs/tags/") :])
        elif revision in self.branches:
            sha = self.branches[revision]
        elif revision in self.tags:
            sha = self.tags[revision]
        elif COMMIT_RE.match(revision):
            sha = revision
        else:
            sha = None
        return self.commits.get(sha) if sha else None

    def blob_path(self, entry: FileEntry) -> Path:
        return self.root / "blobs" / entry.sha256


@dataclass(frozen=True)
class User:
    name: str
    token: str
    access: tuple[str, ...]

    def can_read(self, repo_id: str) -> bool:
        return "*" in self.access or repo_id in self.access


@dataclass
class _Cached:
    stamp: tuple[int, int]
    value: Any


@dataclass
class HubStore:
    """Loads repositories and users from ``root`` on demand, caching by file mtime."""

    root: Path
    _cache: dict[Path, _Cached] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _load_json(self, path: Path, parse: Any) -> Any:
        try:
            st = path.stat()
        except OSError:
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        with self._lock:
            cached = self._cache.get(path)
            if cached is not None and cached.stamp == stamp:
                return cached.value
        value = parse(json.loads(path.read_text(encoding="utf-8")), path)
        with self._lock:
            self._cache[path] = _Cached(stamp, value)
        return value

    def repo(self, repo_id: str) -> Repo | None:
        """The repository, or None if it does not exist (or the id is not a valid repo id)."""
        if not valid_repo_id(repo_id):
            return None
        return self._load_json(self.root / repo_id / "repo.json", _parse_repo)

    def repo_ids(self) -> list[str]:
        return sorted(
            f"{p.parent.parent.name}/{p.parent.name}" for p in self.root.glob("*/*/repo.json")
        )

    def users(self) -> dict[str, User]:
        """Token -> user."""
        return self._load_json(self.root / "_hub.json", _parse_users) or {}

    def user_for_token(self, token: str) -> User | None:
        return self.users().get(token)


def _parse_repo(data: dict[str, Any], path: Path) -> Repo:
    if data.get("format") != REPO_FORMAT:
        raise ValueError(f"{path}: format {data.get('format')!r}, expected {REPO_FORMAT!r}")
    commits: dict[str, Commit] = {}
    for sha, c in data["commits"].items():
        files = {}
        for f in c["files"]:
            lfs = f.get("lfs")
            files[f["path"]] = FileEntry(
                path=f["path"],
                size=int(f["size"]),
                sha256=f["sha256"],
                oid=f["oid"],
                lfs=LfsInfo(lfs["sha256"], int(lfs["size"]), int(lfs["pointerSize"]))
                if lfs
                else None,
            )
        commits[sha] = Commit(
            sha=sha,
            title=c.get("title", ""),
            message=c.get("message", c.get("title", "")),
            date=c["date"],
            authors=tuple(c.get("authors", ())),
            parents=tuple(c.get("parents", ())),
            tree=c.get("tree", ""),
            files=files,
        )
    return Repo(
        repo_id=data["id"],
        root=path.parent,
        private=bool(data.get("private", False)),
        gated=data.get("gated", False) or False,
        branches=dict(data.get("branches", {})),
        tags=dict(data.get("tags", {})),
        created_at=data.get("created_at"),
        info=dict(data.get("info", {})),
        commits=commits,
    )


def _parse_users(data: dict[str, Any], path: Path) -> dict[str, User]:
    users = {}
    for u in data.get("users", []):
        users[u["token"]] = User(
            name=u["name"], token=u["token"], access=tuple(u.get("access", []))
        )
    return users


def git_tree_oid(entries: list[tuple[str, str, str]]) -> str:
    """Git tree object id of ``(mode, name, oid)`` entries (``"100644"`` files, ``"40000"``
    trees)."""

    # Git sorts tree entries by name, with directories compared as if they ended in "/".
    def key(e: tuple[str, str, str]) -> bytes:
        return (e[1] + ("/" if e[0] == "40000" else "")).encode()

    body = b"".join(
        f"{mode} {name}".encode() + b"\0" + bytes.fromhex(oid)
        for mode, name, oid in sorted(entries, key=key)
    )
    return hashlib.sha1(b"tree %d\0" % len(body) + body).hexdigest()


def folder_oids(files: dict[str, FileEntry]) -> dict[str, str]:
    """Tree oid of every folder ("" = root) of a commit's files."""
    children: dict[str, dict[str, tuple[str, str]]] = {"": {}}
    for path, entry in files.items():
        parts = path.split("/")
        for i in range(len(parts) - 1):
            parent = "/".join(parts[:i])
            here = "/".join(parts[: i + 1])
            children.setdefault(parent, {})[parts[i]] = ("40000", here)
            children.setdefault(here, {})
        children["/".join(parts[:-1])][parts[-1]] = ("100644", entry.oid)

    oids: dict[str, str] = {}

    def compute(folder: str) -> str:
        if folder not in oids:
            rows = []
            for name, (mode, ref) in children[folder].items():
                rows.append((mode, name, compute(ref) if mode == "40000" else ref))
            oids[folder] = git_tree_oid(rows)
        return oids[folder]

    for folder in list(children):
        compute(folder)
    return oids
