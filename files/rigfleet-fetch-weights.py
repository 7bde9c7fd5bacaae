#!/usr/bin/env python3
"""Fetch pinned model weights from a Hugging Face hub and verify every file (host side).

Installed by rigfleet (roles/weights.py) at /usr/local/lib/rigfleet/rigfleet-fetch-weights.py
and run with the huggingface_hub venv's python:

    rigfleet-fetch-weights.py fetch --repo ORG/NAME --revision <40-hex> --local-dir DIR \
        [--token-file /etc/rigfleet/secrets/hf-token] [--lock-dir /var/lib/rigfleet/locks] \
        [--mirror http://cache.lan:8081 ...]
    rigfleet-fetch-weights.py check --repo ORG/NAME --revision <40-hex> --local-dir DIR
    rigfleet-fetch-weights.py adopt --repo ORG/NAME --revision <40-hex> --from OLD --to DIR \
        --lock-dir /var/lib/rigfleet/locks

DIR is the revision's own directory (``<model_dir>/<local_dir>@<revision[:12]>``): a name
that only ever holds that revision, verified. ``fetch``:

1. takes a per-repo ``flock`` (a second concurrent fetch of the same repo fails at once and
   names the holder's pid);
2. returns at once when DIR's ``.rigfleet-manifest.json`` is for this repo and revision and
   every file still has its recorded size and mtime (no network, no hashing);
3. refuses a DIR whose manifest is for another repo or revision (a verified revision's
   directory is never rewritten);
4. downloads into ``<parent>/.<name>.partial`` (DIR itself only when it exists but no longer
   matches its manifest: its manifest is removed first, then it is repaired in place);
5. asks the hub for the revision's files (sizes, LFS sha256) and checks free disk first
   (bytes still to download + 10 % of the total as headroom);
6. each ``--mirror`` (a fleet cache: ``<mirror>/<repo>/<revision>/<file>``, plain HTTP GET)
   in order, for every file not there yet: streamed to ``<file>.mirror-part``, its sha256
   (LFS) or git blob id checked against the hub's listing, and only then renamed into place;
   a file that fails is dropped and a mirror that cannot be reached is skipped, each with a
   ``WARNING`` line naming the mirror (the hub gives what is left);
7. ``snapshot_download(repo, revision, local_dir=<that directory>)`` for the files still
   missing (resumes partial downloads);
8. verifies every file: sha256 of every LFS file against the hub's, size of every file, and
   the git blob id of small (non-LFS) files;
9. writes the manifest (atomically) only after all of that passed, then renames the partial
   directory to DIR: DIR appears complete and verified, or not at all.

``adopt`` takes over a directory of before per-revision directories (OLD,
``<model_dir>/<local_dir>``) whose manifest says it holds this repo at this revision: it is
renamed to DIR (no download, file mtimes kept, so the manifest still matches) and OLD becomes
a relative link to DIR, for the compose snapshot that still names OLD. Nothing happens when
OLD is a link already, missing, unverified (no manifest: left as it is) or DIR exists.

The token is read from a root-only file here, never taken from argv or the environment of
the ssh command, and never printed. ``HF_ENDPOINT`` in the environment selects the hub.
Progress goes to stdout, one line per step, prefixed ``[rigfleet-weights]``.
Exit codes: 0 ok, 1 verification/download failure, 2 usage, 3 lock held, 4 disk full.
"""

from __future__ import annotations

import argparse
import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

MANIFEST = ".rigfleet-manifest.json"
MIRROR_PART = ".mirror-part"
MIRROR_TIMEOUT_S = 30
PARTIAL_SUFFIX = ".partial"
HEADROOM = 0.10
CHUNK = 8 * 1024 * 1024
_HEX40 = re.compile(r"[0-9a-f]{40}")


class FetchError(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def say(message: str) -> None:
    print(f"[rigfleet-weights] {message}", flush=True)


def warn(message: str) -> None:
    """One line on stderr the deploy shows as the host's warning (``WARNING`` marks it)."""
    print(f"[rigfleet-weights] WARNING: {message}", file=sys.stderr, flush=True)


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


# --- manifest ------------------------------------------------------------------------------


def read_manifest(local_dir: Path) -> dict | None:
    try:
        data = json.loads((local_dir / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def manifest_matches(local_dir: Path, repo: str, revision: str) -> tuple[bool, str]:
    """Is DIR verified for this pin, and unchanged since (size + mtime of every file)?"""
    manifest = read_manifest(local_dir)
    if manifest is None:
        return False, "no manifest"
    if manifest.get("repo") != repo or manifest.get("revision") != revision:
        return False, (
            f"manifest is for {manifest.get('repo')}@{manifest.get('revision')}, "
            f"pin is {repo}@{revision}"
        )
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return False, "manifest lists no files"
    for name, meta in sorted(files.items()):
        why = moved(local_dir, name, meta)
        if why is not None:
            return False, why
    return True, "matches manifest"


def moved(local_dir: Path, name: str, meta: dict) -> str | None:
    """How a file the manifest lists differs from what it recorded (missing, size, mtime),
    or None when it does not."""
    meta = meta if isinstance(meta, dict) else {}
    try:
        st = (local_dir / name).stat()
    except OSError:
        return f"{name} is missing"
    if st.st_size != meta.get("size"):
        return f"{name} has {st.st_size} bytes, manifest says {meta.get('size')}"
    mtime = meta.get("mtime")  # no number: a damaged manifest, as good as modified
    if not isinstance(mtime, int | float) or abs(st.st_mtime - mtime) > 0.001:
        return f"{name} was modified after it was verified"
    return None


def changed_files(local_dir: Path, manifest: dict) -> list[str]:
    """The files a manifest lists whose size or mtime moved since it was written (a changed
    file of the same size would otherwise pass for present before it is hashed)."""
    files = manifest.get("files")
    return [name for name, meta in sorted(files.items() if isinstance(files, dict) else ())
            if (local_dir / name).exists() and moved(local_dir, name, meta) is not None]


def write_manifest(local_dir: Path, repo: str, revision: str, files: dict) -> None:
    tmp = local_dir / (MANIFEST + ".tmp")
    body = {"repo": repo, "revision": revision, "files": files}
    tmp.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.chmod(tmp, 0o644)
    os.replace(tmp, local_dir / MANIFEST)


# --- lock ----------------------------------------------------------------------------------


def acquire_lock(lock_dir: Path, repo: str):
    """An exclusive, non-blocking flock per repo; the file holds the holder's pid."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    path = lock_dir / ("weights-" + re.sub(r"[^A-Za-z0-9._-]+", "_", repo) + ".lock")
    fh = open(path, "a+")  # noqa: SIM115 - held for the whole fetch, closed by the caller
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        holder = fh.read().strip() or "unknown"
        fh.close()
        raise FetchError(
            f"another download of {repo} is running (pid {holder}, lock {path}); "
            "wait for it to finish, then re-run",
            code=3,
        ) from None
    fh.seek(0)
    fh.truncate()
    fh.write(f"{os.getpid()}\n")
    fh.flush()
    return fh


# --- hub -----------------------------------------------------------------------------------


def read_token(path: str | None) -> str | None:
    if not path:
        return None
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as e:
        raise FetchError(f"cannot read the token file {path} ({e.strerror})", code=2) from None
    return token or None


def hub_files(repo: str, revision: str, token: str | None) -> dict[str, dict]:
    """name -> {size, sha256 (LFS) or None, blob_id} for every file of the revision."""
    from huggingface_hub import HfApi

    info = HfApi().model_info(repo, revision=revision, files_metadata=True, token=token)
    if getattr(info, "sha", None) and info.sha != revision:
        raise FetchError(f"hub answered revision {info.sha} for {revision}")
    files: dict[str, dict] = {}
    for sibling in info.siblings or []:
        lfs = sibling.lfs
        sha256 = lfs.sha256 if lfs is not None else None
        size = lfs.size if lfs is not None else sibling.size
        if size is None:
            raise FetchError(f"hub gave no size for {sibling.rfilename}")
        files[sibling.rfilename] = {"size": int(size), "sha256": sha256, "blob_id": sibling.blob_id}
    if not files:
        raise FetchError(f"hub lists no files for {repo}@{revision}")
    return files


# --- verification --------------------------------------------------------------------------


def file_digests(path: Path, blob: bool) -> tuple[str, str | None]:
    """sha256, and (when asked) the git blob id (sha1 of ``blob <size>\\0`` + content)."""
    size = path.stat().st_size
    sha256 = hashlib.sha256()
    sha1 = hashlib.sha1(f"blob {size}\0".encode()) if blob else None
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            sha256.update(chunk)
            if sha1 is not None:
                sha1.update(chunk)
    return sha256.hexdigest(), sha1.hexdigest() if sha1 is not None else None


def verify(local_dir: Path, expected: dict[str, dict]) -> dict[str, dict]:
    """Check every file; return the manifest's ``files`` or raise with every problem."""
    problems: list[str] = []
    verified: dict[str, dict] = {}
    for i, (name, meta) in enumerate(sorted(expected.items()), 1):
        path = local_dir / name
        try:
            st = path.stat()
        except OSError:
            problems.append(f"{name}: missing after download")
            continue
        if st.st_size != meta["size"]:
            problems.append(f"{name}: {st.st_size} bytes, hub says {meta['size']}")
            continue
        say(f"verify {i}/{len(expected)} {name} ({gib(st.st_size)})")
        sha256, blob_id = file_digests(path, blob=meta["sha256"] is None)
        if meta["sha256"] is not None and sha256 != meta["sha256"]:
            problems.append(f"{name}: sha256 {sha256}, hub says {meta['sha256']}")
            continue
        if meta["sha256"] is None and meta.get("blob_id") and blob_id != meta["blob_id"]:
            problems.append(f"{name}: git blob {blob_id}, hub says {meta['blob_id']}")
            continue
        verified[name] = {"size": st.st_size, "sha256": sha256, "mtime": st.st_mtime}
    if problems:
        raise FetchError(
            "verification failed:\n  "
            + "\n  ".join(problems)
            + f"\nremove the bad files under {local_dir} and re-run"
        )
    return verified


# --- mirrors (a fleet cache) ----------------------------------------------------------------


class MirrorDown(Exception):
    """The mirror cannot be reached (or answers 5xx): skip it for the remaining files."""


def mirror_url(mirror: str, repo: str, revision: str, name: str) -> str:
    path = "/".join(urllib.parse.quote(p) for p in (*repo.split("/"), revision, *name.split("/")))
    return f"{mirror.rstrip('/')}/{path}"


def mirror_file(url: str, dest: Path, meta: dict) -> str | None:
    """Stream ``url`` to ``dest`` if it is the file the hub lists; None when it is (``dest``
    in place), else why not (nothing left behind). Raises ``MirrorDown``."""
    part = dest.with_name(dest.name + MIRROR_PART)
    dest.parent.mkdir(parents=True, exist_ok=True)
    sha256 = hashlib.sha256()
    sha1 = hashlib.sha1(f"blob {meta['size']}\0".encode()) if meta["sha256"] is None else None
    size = 0
    try:
        with urllib.request.urlopen(url, timeout=MIRROR_TIMEOUT_S) as answer, \
                open(part, "wb") as out:
            while chunk := answer.read(CHUNK):
                size += len(chunk)
                if size > meta["size"]:
                    break
                sha256.update(chunk)
                if sha1 is not None:
                    sha1.update(chunk)
                out.write(chunk)
    except urllib.error.HTTPError as e:
        part.unlink(missing_ok=True)
        if e.code >= 500:
            raise MirrorDown(f"HTTP {e.code}") from None
        return f"HTTP {e.code}"
    except (OSError, urllib.error.URLError) as e:
        part.unlink(missing_ok=True)
        raise MirrorDown(str(getattr(e, "reason", None) or e)) from None
    why = None
    if size != meta["size"]:
        why = f"{size}{'+' if size > meta['size'] else ''} bytes, hub says {meta['size']}"
    elif meta["sha256"] is not None and sha256.hexdigest() != meta["sha256"]:
        why = f"sha256 {sha256.hexdigest()}, hub says {meta['sha256']}"
    elif sha1 is not None and meta.get("blob_id") and sha1.hexdigest() != meta["blob_id"]:
        why = f"git blob {sha1.hexdigest()}, hub says {meta['blob_id']}"
    if why is not None:
        part.unlink(missing_ok=True)
        return why
    os.replace(part, dest)
    return None


def from_mirrors(mirrors: list[str], repo: str, revision: str, work: Path,
                 expected: dict[str, dict]) -> tuple[set[str], int]:
    """Fetch what the mirrors hold (each file verified first); the names still missing and
    the bytes the mirrors gave."""
    missing = set()
    for name, meta in expected.items():
        try:
            if (work / name).stat().st_size == meta["size"]:
                continue
        except OSError:
            pass
        missing.add(name)
    given = 0
    for mirror in mirrors:
        if not missing:
            break
        say(f"mirror {mirror}: asking for {len(missing)} file(s)")
        for name in sorted(missing):
            url = mirror_url(mirror, repo, revision, name)
            try:
                why = mirror_file(url, work / name, expected[name])
            except MirrorDown as e:
                warn(f"mirror {mirror} cannot be reached ({e}); skipped, the hub gives the rest")
                break
            if why is None:
                missing.discard(name)
                given += expected[name]["size"]
            elif why.startswith("HTTP 404"):
                say(f"mirror {mirror}: {name}: not there; from the hub")
            else:
                warn(f"mirror {mirror}: {name}: {why}; not used, fetched from the hub instead")
        say(f"mirror {mirror}: {len(expected) - len(missing)}/{len(expected)} file(s) here")
    return missing, given


def check_disk(local_dir: Path, expected: dict[str, dict]) -> None:
    total = sum(m["size"] for m in expected.values())
    present = 0
    for name, meta in expected.items():
        try:
            if (local_dir / name).stat().st_size == meta["size"]:
                present += meta["size"]
        except OSError:
            pass
    to_fetch = total - present
    need = to_fetch + int(total * HEADROOM)
    free = shutil.disk_usage(local_dir).free
    say(f"size {gib(total)}, to download {gib(to_fetch)}, free {gib(free)}")
    if free < need:
        raise FetchError(
            f"not enough free disk in {local_dir}: need {gib(need)} ({gib(to_fetch)} to "
            f"download + {gib(total * HEADROOM)} headroom, 10% of {gib(total)}), "
            f"have {gib(free)}",
            code=4,
        )


# --- commands ------------------------------------------------------------------------------


def partial_dir(final: Path) -> Path:
    """Where a revision downloads until it is verified: ``<parent>/.<name>.partial``."""
    return final.with_name(f".{final.name}{PARTIAL_SUFFIX}")


def sync_dir(path: Path) -> None:
    """fsync a directory, so a rename or a new entry in it survives a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fetch(args: argparse.Namespace) -> int:
    final = Path(args.local_dir)
    lock = acquire_lock(Path(args.lock_dir), args.repo)
    try:
        ok, reason = manifest_matches(final, args.repo, args.revision)
        if ok:
            say(f"{args.repo}@{args.revision} already verified in {final}")
            return 0
        manifest = read_manifest(final)
        if manifest is not None and (manifest.get("repo"), manifest.get("revision")) != (
                args.repo, args.revision):
            raise FetchError(
                f"{final} holds {manifest.get('repo')}@{manifest.get('revision')}, not "
                f"{args.repo}@{args.revision}: a verified revision's directory is never "
                "rewritten; move it away (it may be a compose file's), then re-run"
            )
        work = final if final.is_dir() else partial_dir(final)
        if work == final and manifest is not None:
            # No manifest vouches for files while they are repaired; a file it no longer
            # vouches for goes first, so that it is fetched again, not taken for present.
            changed = changed_files(final, manifest)
            for name in changed:
                (final / name).unlink(missing_ok=True)
            (final / MANIFEST).unlink()
            say(f"{final}: {reason}; its manifest is removed and it is repaired in place"
                + (f" ({len(changed)} changed file(s) removed)" if changed else ""))
        say(f"{args.repo}@{args.revision} -> {work} ({reason})")
        work.mkdir(parents=True, exist_ok=True)
        token = read_token(args.token_file)
        say(f"hub {os.environ.get('HF_ENDPOINT') or 'https://huggingface.co'}: listing files")
        expected = hub_files(args.repo, args.revision, token)
        check_disk(work, expected)
        from huggingface_hub import snapshot_download

        started = time.monotonic()
        missing, given = from_mirrors(args.mirror or [], args.repo, args.revision, work,
                                      expected)
        if args.mirror:
            say(f"mirrors gave {given} bytes; {len(missing)} file(s) from the hub")
        if missing or not args.mirror:
            say(f"downloading {len(missing)} files (resumes partial downloads)")
            snapshot_download(args.repo, revision=args.revision, local_dir=str(work),
                              token=token, allow_patterns=sorted(
                                  glob.escape(n) for n in missing) if args.mirror else None)
        say(f"downloaded in {time.monotonic() - started:.0f}s; verifying")
        files = verify(work, expected)
        write_manifest(work, args.repo, args.revision, files)
        if work != final:
            # Into place only now: the revision's name never holds unverified files.
            os.rename(work, final)
            sync_dir(final.parent)
        say(f"verified {len(files)} files; wrote {final / MANIFEST}")
        return 0
    finally:
        lock.close()


def adopt(args: argparse.Namespace) -> int:
    """Take over a directory of before per-revision directories (see the module docstring)."""
    old, final = Path(args.from_dir), Path(args.to)
    if old.parent != final.parent or old == final:
        raise FetchError(f"--from {old} and --to {final} must be two names in one directory",
                         code=2)
    lock = acquire_lock(Path(args.lock_dir), args.repo)
    try:
        if old.is_symlink():
            say(f"{old} links to {os.readlink(old)}: adopted already")
            return 0
        if not old.is_dir():
            say(f"nothing at {old}: nothing to adopt")
            return 0
        manifest = read_manifest(old)
        if manifest is None:
            say(f"{old} has no manifest (never verified): left as it is")
            return 0
        if (manifest.get("repo"), manifest.get("revision")) != (args.repo, args.revision):
            raise FetchError(
                f"{old}'s manifest is for {manifest.get('repo')}@{manifest.get('revision')}, "
                f"not {args.repo}@{args.revision}; nothing adopted"
            )
        if final.exists() or final.is_symlink():
            say(f"{final} exists already: {old} left as it is (remove it once no compose file "
                "names it)")
            return 0
        os.rename(old, final)
        # The old name, for the compose snapshot that still names it: a relative link, made
        # under a temporary name and renamed into place.
        tmp = old.with_name(f".{old.name}.link-tmp")
        tmp.unlink(missing_ok=True)
        os.symlink(final.name, tmp)
        os.rename(tmp, old)
        sync_dir(final.parent)
        say(f"adopted {old} as {final} ({args.repo}@{args.revision}, no download); {old} "
            "links to it")
        return 0
    finally:
        lock.close()


def check(args: argparse.Namespace) -> int:
    ok, reason = manifest_matches(Path(args.local_dir), args.repo, args.revision)
    print(json.dumps({"ok": ok, "reason": reason}))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("fetch", "check", "adopt"):
        p = sub.add_parser(name)
        p.add_argument("--repo", required=True)
        p.add_argument("--revision", required=True)
        if name == "adopt":
            p.add_argument("--from", dest="from_dir", required=True)
            p.add_argument("--to", required=True)
        else:
            p.add_argument("--local-dir", required=True)
        if name == "fetch":
            p.add_argument("--token-file")
            p.add_argument("--mirror", action="append",
                           help="a fleet cache tried before the hub (repeatable, in order)")
        if name in ("fetch", "adopt"):
            p.add_argument("--lock-dir", required=True)
    args = parser.parse_args(argv)
    if not _HEX40.fullmatch(args.revision):
        print(f"revision {args.revision!r} is not a full 40-hex commit", file=sys.stderr)
        return 2
    commands = {"fetch": fetch, "check": check, "adopt": adopt}
    try:
        return commands[args.command](args)
    except FetchError as e:
        print(f"[rigfleet-weights] ERROR: {e}", file=sys.stderr, flush=True)
        return e.code
    except Exception as e:  # hub/network errors: one line, no traceback noise, no token
        print(f"[rigfleet-weights] ERROR: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
