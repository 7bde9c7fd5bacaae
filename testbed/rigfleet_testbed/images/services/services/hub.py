"""A Hugging Face Hub look-alike for the real ``huggingface_hub`` client (port 8080).

Use it as the real one, through the endpoint variable (Xet off: there is no Xet storage here)::

    HF_ENDPOINT=http://hub.rigfleet.test:8080 HF_HUB_DISABLE_XET=1 \
        hf download Lorbus/Qwen3.6-27B-int4-AutoRound --revision <40-hex> --local-dir /models/q

Routes (model repositories; ids are ``org/name``):

- ``GET /api/models/{id}`` and ``/api/models/{id}/revision/{rev}``: model info (``sha``,
  ``siblings``; with ``?blobs=true`` each sibling has ``size``, ``blobId`` and ``lfs``
  ``{sha256,size,pointerSize}``), ``?expand=...`` to select fields.
- ``GET /api/models/{id}/tree/{rev}[/{path}]?recursive=true``: tree listing (files with ``oid``,
  ``size``, ``lfs {oid,size,pointerSize}``; folders with their git tree ``oid``).
- ``POST /api/models/{id}/paths-info/{rev}``, ``GET /api/models/{id}/refs``,
  ``GET /api/models/{id}/commits/{rev}``, ``GET /api/whoami-v2``, ``GET /api/agent-harnesses``
  (empty registry; the client fetches it once a day).
- ``HEAD|GET /{id}/resolve/{rev}/{path}``: the file. Headers as the real Hub: ``X-Repo-Commit``,
  ``ETag`` (git blob id, or SHA-256 for LFS files), ``X-Linked-Etag`` + ``X-Linked-Size`` for LFS
  files, ``Content-Length``, ``Accept-Ranges``; single ``Range`` requests get 206 with
  ``Content-Range`` (resume). LFS content is served directly (no CDN redirect).
- Errors carry ``X-Error-Code`` / ``X-Error-Message`` as the real Hub's do, with its statuses:
  ``RepoNotFound`` is 401 for an anonymous caller (the Hub does not reveal whether a private repo
  exists) and 404 for an authenticated one; ``RevisionNotFound`` and ``EntryNotFound`` are 404
  (``EntryNotFound`` with ``X-Repo-Commit``); ``GatedRepo`` is 401 without a token and 403 for a
  user without access; a token nobody owns is 401 "Invalid credentials in Authorization header".
  Metadata of gated repos is public (as on the Hub); their file content is not.
- ``/_testbed/faults`` (GET/POST/DELETE, see :mod:`services.faults`), ``GET /_testbed/health``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from .common import BaseHandler, parse_range
from .faults import Faults, FaultSpecError, corrupt_chunk
from .hubstore import Commit, FileEntry, HubStore, Repo, User, folder_oids

_JSON = "application/json; charset=utf-8"
_TEXT_SUFFIXES = {".json", ".md", ".txt", ".jinja", ".py", ".yaml", ".yml", ".gitattributes"}
_TRUE = {"1", "true", "yes", "on"}


class HubError(Exception):
    """An error response as the Hub sends it."""

    def __init__(
        self, status: int, code: str | None, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


def _content_type(path: str) -> str:
    suffix = PurePosixPath(path).suffix or PurePosixPath(path).name
    if suffix == ".json":
        return "application/json; charset=utf-8"
    if suffix in _TEXT_SUFFIXES:
        return "text/plain; charset=utf-8"
    return "application/octet-stream"


def _disposition(path: str) -> str:
    name = PurePosixPath(path).name
    ascii_name = name.encode("ascii", "replace").decode().replace('"', "")
    return f"inline; filename*=UTF-8''{quote(name)}; filename=\"{ascii_name}\";"


class HubHandler(BaseHandler):
    """Request routing for the hub. ``server.store`` and ``server.faults`` are set by the app."""

    # ---- plumbing -----------------------------------------------------------------------------

    @property
    def store(self) -> HubStore:
        return self.server.store  # type: ignore[attr-defined]

    @property
    def faults(self) -> Faults:
        return self.server.faults  # type: ignore[attr-defined]

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        split = urlsplit(self.path)
        self._query = parse_qs(split.query, keep_blank_values=True)
        # Split the raw path first: revisions arrive percent-encoded ("refs%2Fpr%2F1").
        segs = [unquote(s) for s in split.path.split("/")[1:]]
        try:
            self._route(segs)
        except HubError as err:
            self._send_error(err)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _route(self, segs: list[str]) -> None:
        method = self.command
        if segs[:1] == ["_testbed"]:
            self._testbed(segs[1:])
            return
        if segs[:1] == ["api"]:
            if segs[1:] == ["whoami-v2"] and method in ("GET", "HEAD"):
                self._whoami()
                return
            if segs[1:] == ["agent-harnesses"] and method in ("GET", "HEAD"):
                # The client fetches this registry (telemetry) once a day; an empty one is valid.
                self._send_json({"standardEnvVars": [], "harnesses": {}})
                return
            if len(segs) >= 4 and segs[1] == "models":
                repo_id = f"{segs[2]}/{segs[3]}"
                rest = segs[4:]
                if method in ("GET", "HEAD"):
                    if not rest:
                        self._model_info(repo_id, None)
                        return
                    if rest[0] == "revision" and len(rest) == 2:
                        self._model_info(repo_id, rest[1])
                        return
                    if rest[0] == "tree" and len(rest) >= 2:
                        self._tree(repo_id, rest[1], "/".join(rest[2:]))
                        return
                    if rest == ["refs"]:
                        self._refs(repo_id)
                        return
                    if rest[0] == "commits" and len(rest) == 2:
                        self._commits(repo_id, rest[1])
                        return
                if method == "POST" and rest[:1] == ["paths-info"] and len(rest) == 2:
                    self._paths_info(repo_id, rest[1])
                    return
            if len(segs) >= 2 and segs[1] in ("datasets", "spaces"):
                raise HubError(401, "RepoNotFound", "Repository not found")
            raise HubError(404, None, "Sorry, we can't find the page you are looking for.")
        if len(segs) >= 5 and segs[2] == "resolve" and method in ("GET", "HEAD"):
            self._resolve(f"{segs[0]}/{segs[1]}", segs[3], "/".join(segs[4:]))
            return
        if method not in ("GET", "HEAD"):
            raise HubError(405, None, "Method not allowed")
        raise HubError(404, None, "Sorry, we can't find the page you are looking for.")

    def _send_error(self, err: HubError) -> None:
        headers = {"X-Error-Message": err.message, **err.headers}
        if err.code:
            headers["X-Error-Code"] = err.code
        body = json.dumps({"error": err.message}).encode()
        self._log_fields["error"] = err.code or err.status
        self.send_bytes(err.status, body, _JSON, headers)

    def _send_json(self, data: Any, headers: dict[str, str] | None = None) -> None:
        self.send_bytes(200, json.dumps(data, indent=None).encode(), _JSON, headers)

    def _flag(self, name: str) -> bool:
        values = self._query.get(name)
        return bool(values) and values[-1].lower() in _TRUE

    # ---- auth ---------------------------------------------------------------------------------

    def _caller(self) -> User | None:
        """The user of the bearer token; None when anonymous. A bad token is an error."""
        header = self.headers.get("Authorization")
        if not header:
            return None
        scheme, _, token = header.strip().partition(" ")
        token = token.strip()
        user = self.store.user_for_token(token) if scheme.lower() == "bearer" and token else None
        if user is None:
            raise HubError(401, None, "Invalid credentials in Authorization header")
        self._log_fields["user"] = user.name
        return user

    def _repo(self, repo_id: str) -> tuple[Repo, User | None]:
        """The repo if the caller may see it (private repos need access)."""
        user = self._caller()
        repo = self.store.repo(repo_id)
        if repo is None or (repo.private and not (user and user.can_read(repo_id))):
            # The Hub answers 401 to anonymous callers, so as not to reveal private repos.
            raise HubError(401 if user is None else 404, "RepoNotFound", "Repository not found")
        return repo, user

    def _check_content_access(self, repo: Repo, user: User | None) -> None:
        if not repo.gated or (user and user.can_read(repo.repo_id)):
            return
        if user is None:
            raise HubError(
                401,
                "GatedRepo",
                f"Access to model {repo.repo_id} is restricted. You must have access to it and be "
                "authenticated to access it. Please log in.",
            )
        raise HubError(
            403,
            "GatedRepo",
            f"Access to model {repo.repo_id} is restricted and you are not in the authorized "
            f"list. Visit {self._endpoint()}/{repo.repo_id} to ask for access.",
        )

    def _endpoint(self) -> str:
        host = (
            self.headers.get("Host") or f"{self.server.server_address[0]}:{self.server.server_port}"
        )
        return f"http://{host}"

    def _commit(self, repo: Repo, revision: str) -> Commit:
        commit = repo.resolve(revision)
        if commit is None:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return commit

    # ---- API ----------------------------------------------------------------------------------

    def _whoami(self) -> None:
        user = self._caller()
        if user is None:
            raise HubError(401, None, "Invalid credentials in Authorization header")
        self._send_json(
            {
                "type": "user",
                "id": hashlib.sha1(user.name.encode()).hexdigest()[:24],
                "name": user.name,
                "fullname": user.name,
                "isPro": False,
                "orgs": [],
                "auth": {
                    "type": "access_token",
                    "accessToken": {"displayName": user.name, "role": "read"},
                },
            }
        )

    @staticmethod
    def _lfs_sibling(entry: FileEntry) -> dict[str, Any] | None:
        if entry.lfs is None:
            return None
        return {
            "sha256": entry.lfs.sha256,
            "size": entry.lfs.size,
            "pointerSize": entry.lfs.pointer_size,
        }

    def _model_info(self, repo_id: str, revision: str | None) -> None:
        repo, _user = self._repo(repo_id)
        commit = self._commit(repo, revision or "main")
        blobs = self._flag("blobs")
        siblings = []
        for path in sorted(commit.files):
            entry = commit.files[path]
            sib: dict[str, Any] = {"rfilename": path}
            if blobs:
                sib["size"] = entry.size
                sib["blobId"] = entry.oid
                lfs = self._lfs_sibling(entry)
                if lfs:
                    sib["lfs"] = lfs
            siblings.append(sib)
        author = repo_id.split("/")[0]
        info: dict[str, Any] = {
            "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
            "id": repo_id,
            "modelId": repo_id,
            "author": author,
            "sha": commit.sha,
            "lastModified": commit.date,
            "createdAt": repo.created_at or commit.date,
            "private": repo.private,
            "gated": repo.gated,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
            "spaces": [],
            "usedStorage": sum(e.size for e in commit.files.values()),
        }
        info.update(repo.info)
        expand = self._query.get("expand") or self._query.get("expand[]")
        if expand:
            info = {k: v for k, v in info.items() if k in ("_id", "id") or k in expand}
        self._send_json(info)

    def _tree_entry(self, entry: FileEntry) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": "file",
            "oid": entry.oid,
            "size": entry.size,
            "path": entry.path,
        }
        if entry.lfs:
            out["lfs"] = {
                "oid": entry.lfs.sha256,
                "size": entry.lfs.size,
                "pointerSize": entry.lfs.pointer_size,
            }
        return out

    def _tree(self, repo_id: str, revision: str, folder: str) -> None:
        repo, _user = self._repo(repo_id)
        commit = self._commit(repo, revision)
        folder = folder.strip("/")
        folders = folder_oids(commit.files)
        if folder and folder not in folders:
            raise HubError(
                404,
                "EntryNotFound",
                f'{folder} does not exist on "{revision}"',
                {"X-Repo-Commit": commit.sha},
            )
        recursive = self._flag("recursive")
        prefix = f"{folder}/" if folder else ""
        out = []
        for name in sorted(folders):
            if not name or not name.startswith(prefix) or name == folder:
                continue
            if recursive or "/" not in name[len(prefix) :]:
                out.append({"type": "directory", "oid": folders[name], "size": 0, "path": name})
        for path in sorted(commit.files):
            if path.startswith(prefix) and (recursive or "/" not in path[len(prefix) :]):
                out.append(self._tree_entry(commit.files[path]))
        self._send_json(out)

    def _paths_info(self, repo_id: str, revision: str) -> None:
        body = self.read_body().decode("utf-8", "replace")
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if ctype == "application/json":
            paths = list(json.loads(body or "{}").get("paths", []))
        else:
            paths = parse_qs(body, keep_blank_values=True).get("paths", [])
        repo, _user = self._repo(repo_id)
        commit = self._commit(repo, revision)
        folders = folder_oids(commit.files)
        out = []
        for path in paths:
            path = path.strip("/")
            if path in commit.files:
                out.append(self._tree_entry(commit.files[path]))
            elif path and path in folders:
                out.append({"type": "directory", "oid": folders[path], "size": 0, "path": path})
        self._send_json(out)

    def _refs(self, repo_id: str) -> None:
        repo, _user = self._repo(repo_id)
        self._send_json(
            {
                "branches": [
                    {"name": n, "ref": f"refs/heads/{n}", "targetCommit": s}
                    for n, s in sorted(repo.branches.items())
                ],
                "converts": [],
                "tags": [
                    {"name": n, "ref": f"refs/tags/{n}", "targetCommit": s}
                    for n, s in sorted(repo.tags.items())
                ],
            }
        )

    def _commits(self, repo_id: str, revision: str) -> None:
        repo, _user = self._repo(repo_id)
        commit = self._commit(repo, revision)
        history = []
        seen: set[str] = set()
        todo = [commit.sha]
        while todo:
            sha = todo.pop(0)
            if sha in seen or sha not in repo.commits:
                continue
            seen.add(sha)
            c = repo.commits[sha]
            history.append(
                {
                    "id": c.sha,
                    "title": c.title,
                    "message": c.message,
                    "date": c.date,
                    "authors": [{"user": a} for a in c.authors],
                }
            )
            todo.extend(c.parents)
        self._send_json(history)

    # ---- files --------------------------------------------------------------------------------

    def _resolve(self, repo_id: str, revision: str, path: str) -> None:
        repo, user = self._repo(repo_id)
        commit = self._commit(repo, revision)
        entry = commit.files.get(path)
        if entry is None:
            raise HubError(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": commit.sha})
        self._check_content_access(repo, user)
        blob = repo.blob_path(entry)
        if not blob.is_file():
            # A broken fixture: say so loudly rather than serve something else.
            raise HubError(500, None, f"fixture blob missing for {path}")

        etag = f'"{entry.etag}"'
        headers = {
            "X-Repo-Commit": commit.sha,
            "ETag": etag,
            "Accept-Ranges": "bytes",
            "Content-Disposition": _disposition(path),
            "Cache-Control": "public, max-age=31536000, immutable"
            if revision == commit.sha
            else "private, max-age=0, must-revalidate",
        }
        if entry.lfs:
            headers["X-Linked-Etag"] = etag
            headers["X-Linked-Size"] = str(entry.lfs.size)
        size = entry.size

        wanted = parse_range(self.headers.get("Range"), size)
        if_range = self.headers.get("If-Range")
        if if_range is not None and if_range.lstrip("W/") != etag:
            wanted = None
        if wanted == "unsatisfiable":
            headers["Content-Range"] = f"bytes */{size}"
            raise HubError(416, None, "Requested Range Not Satisfiable", headers)
        partial = isinstance(wanted, tuple)
        start, end = wanted if isinstance(wanted, tuple) else (0, size - 1)

        corrupt, cut_after = (False, None) if self.command == "HEAD" else self.faults.plan(path)
        if corrupt:
            self._log_fields["fault"] = "corrupt"
        if cut_after is not None:
            self._log_fields["fault"] = f"cut@{cut_after}"

        self.send_response(206 if partial else 200)
        self.send_header("Content-Type", _content_type(path))
        self.send_header("Content-Length", str(end - start + 1 if size else 0))
        if partial:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command == "HEAD" or size == 0:
            return
        transform = (lambda off, chunk: corrupt_chunk(off, chunk, size)) if corrupt else None
        self.stream_file(blob, start, end, transform=transform, cut_after=cut_after)

    # ---- testbed control ----------------------------------------------------------------------

    def _testbed(self, rest: list[str]) -> None:
        if rest == ["health"] and self.command in ("GET", "HEAD"):
            self._send_json({"ok": True, "repos": self.store.repo_ids()})
            return
        if rest != ["faults"]:
            raise HubError(404, None, "Sorry, we can't find the page you are looking for.")
        if self.command == "POST":
            try:
                spec = json.loads(self.read_body() or b"{}")
                self.faults.replace(spec)
            except (ValueError, FaultSpecError) as err:
                raise HubError(400, None, f"bad fault spec: {err}") from None
            self.server.log.line(f"[hub] faults set: {json.dumps(self.faults.snapshot())}")
        elif self.command == "DELETE":
            self.faults.clear()
            self.server.log.line("[hub] faults cleared")
        elif self.command not in ("GET", "HEAD"):
            raise HubError(405, None, "Method not allowed")
        self._send_json(self.faults.snapshot())
