"""``rigfleet images``: the fleet's pinned images on hosts and in saved copies.

    rigfleet images status --inventory inventory/home.py [--json]
    rigfleet images export --inventory inventory/home.py --host rig-a --to ~/image-archive
    rigfleet images export ... --stack int8 --json
    rigfleet images import FILE --into ~/image-archive [--json]        # keep it as a source
    rigfleet images import FILE --inventory inventory/home.py --host rig-a [--host rig-b]

``status``: per host and pinned image, whether it is there (by digest or image id) and which
source would provide it (exit 1 when a host cannot get one). ``export``: ``docker save`` a
host's pinned image(s) into a directory here, with a JSON sidecar (image, digest, image id,
vLLM version, sha256). ``import``: put a saved archive into hosts' engines (streamed over SSH,
``docker load``, tagged with its name, verified by image id), and/or copy it into a directory
an ``archive`` image source lists; it prints what to pin (digest, image id). Transfers show a
progress bar on stderr.
"""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.text import Text

from rigfleet import ssh
from rigfleet.cliargs import UsageError, fleet_hosts, fleet_options
from rigfleet.desired import load_desired
from rigfleet.errors import RigfleetError
from rigfleet.fleetview import each_host
from rigfleet.images.archive import (
    ArchivedImage,
    ArchiveInfo,
    archive_name,
    inspect_archive,
    write_sidecar,
)
from rigfleet.images.checks import SourceChecker
from rigfleet.images.deploy import build_plan, fact_arguments
from rigfleet.images.plan import ImagePlan, StagingPlan, WantedImage, wanted_images
from rigfleet.images.transfer import Counted, export_image, host_state, load_archive, progress_bar
from rigfleet.inventory import InventoryHost, gpu_hosts
from rigfleet.ssh import HostUnreachable, Remote
from rigfleet.tables import Table, show


class ImagesCliError(RigfleetError, ValueError):
    """Bad arguments or inputs for ``rigfleet images``; the message says what to give."""


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("images", help="pinned images: status per host, export and "
                              "import saved copies", description=__doc__.splitlines()[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog="\n".join(__doc__.splitlines()[1:]))
    sub = p.add_subparsers(dest="action", required=True)
    # Only the SSH connect is limited: reading a host's images may take 120 s, a transfer hours.
    opts = fleet_options(timeout_help="seconds per SSH connect")
    sub.add_parser("status", parents=[opts], help="per host and pinned image: present? which "
                   "source?").set_defaults(func=cmd_status)
    ex = sub.add_parser("export", parents=[opts],
                        help="docker save a host's pinned image(s) into a directory")
    ex.add_argument("--host", required=True, help="the host to save from (inventory name)")
    ex.add_argument("--to", required=True, type=Path, help="directory on this machine")
    ex.add_argument("--stack", action="append", default=[], metavar="NAME",
                    help="only this stack's image (repeatable; default: every staged image)")
    ex.set_defaults(func=cmd_export)
    im = sub.add_parser("import", parents=[opts],
                        help="load a saved archive into hosts and/or keep it as an archive source")
    im.add_argument("file", type=Path, help="a `docker save` archive (.tar)")
    im.add_argument("--host", action="append", default=[], metavar="NAME",
                    help="load it into this host's engine (repeatable)")
    im.add_argument("--into", type=Path, metavar="DIR",
                    help="copy it into DIR (an archive image source) with its sidecar")
    im.add_argument("--image", metavar="REPO:TAG",
                    help="its name, when neither its sidecar nor its tags say")
    im.add_argument("--digest", metavar="SHA256",
                    help="its registry digest, when its sidecar does not say (for the pins)")
    im.set_defaults(func=cmd_import)


def _hosts(args: argparse.Namespace) -> list[Any]:
    """The inventory's GPU hosts (a balancer-only host has no images), ``--limit`` applied."""
    hosts = gpu_hosts(fleet_hosts(args))
    if not hosts:
        raise ImagesCliError(f"{args.inventory}: no GPU host"
                             + (f" in --limit {', '.join(args.limit)}" if args.limit else "")
                             + "; allowed: hosts that serve (a balancer has no images)")
    return hosts


def _named(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    """The GPU hosts ``--host`` names, by name, once each in order; a usage error for others."""
    hosts = {h.name: h for h in _hosts(args)}
    if unknown := [n for n in dict.fromkeys(names) if n not in hosts]:
        raise UsageError(f"--host {', '.join(map(repr, unknown))}: not in {args.inventory}; "
                         f"allowed: {', '.join(hosts)}")
    return {n: hosts[n] for n in names}


@dataclass(frozen=True)
class HostImages:
    host: str
    plan: StagingPlan | None = None
    error: str | None = None


def fleet_images(hosts: Sequence[InventoryHost], remote: Remote) -> list[HostImages]:
    """Each host's rows from the same plan the deploy runs (its state read over SSH)."""
    checker = SourceChecker()

    def host_images(host: InventoryHost) -> HostImages:
        want = load_desired(host.name, host.data)
        plan = build_plan(want, host_state(remote, host, **fact_arguments(want)), checker)
        return HostImages(host.name, plan)

    return each_host(hosts, host_images, lambda h, why: HostImages(h.name, error=why))


def table(rows: Sequence[HostImages], title: str = "rigfleet images status") -> Table:
    """One line per host and image (last: the cell a narrow terminal cuts), notes under it."""
    t = Table(title, ["host", "present", "id", "source", "image"])
    for row in rows:
        if row.plan is None:
            t.row(row.host, Text("?", style="red"), "", "", "")
            t.note(row.host, Text(str(row.error), style="red"))
            continue
        for p in row.plan.images:
            present = Text(p.presence.label, style="green" if p.action == "present" else
                           "yellow" if p.action in ("tag", "fetch") else "red")
            local = p.presence.local.id[7:19] if p.presence.local else "-"
            fetch = p.source if p.action == "fetch" else None  # "[1] archive": from where
            source = (f"[{fetch.index}] {fetch.source.kind}" if fetch else
                      {"present": "-", "tag": "docker tag", "refused": "none"}.get(p.action, "-"))
            t.row(row.host, present, local, source, p.want.image)
            t.note(row.host, p.want.label + (f"; {fetch.label}: {fetch.reason}" if fetch else ""))
        for line in row.plan.problems:
            t.note(row.host, Text(line.removeprefix(f"{row.host}: "), style="red"))
        for line in row.plan.notes:
            t.note(row.host, line.removeprefix(f"{row.host}: "))
    return t


def _image_json(p: ImagePlan) -> dict[str, Any]:
    local = p.presence.local
    return {"image": p.want.image, "digest": p.want.digest, "image_id": p.want.image_id,
            "stacks": list(p.want.stacks), "present": p.action == "present",
            "local": None if local is None else {
                "ref": p.presence.ref, "id": local.id, "repo_digests": list(local.repo_digests),
                "repo_tags": list(local.repo_tags)},
            "action": p.action,
            "source": p.source.source.label if p.source else None,
            "tried": [{"source": r.label, "ok": r.ok, "reason": r.reason, "bytes": r.size}
                      for r in p.tried]}


def as_json(rows: Sequence[HostImages]) -> dict[str, Any]:
    return {"hosts": [{"host": row.host, "error": row.error,
                       "images": [_image_json(p) for p in row.plan.images] if row.plan else [],
                       "problems": list(row.plan.problems if row.plan else ())} for row in rows],
            "ok": exit_status(rows) == 0}


def exit_status(rows: Sequence[HostImages]) -> int:
    """0: every host has (or can get) every pinned image."""
    return 0 if all(not r.error and not (r.plan and r.plan.problems) for r in rows) else 1


def _directory(flag: str, path: Path) -> None:
    """Create ``flag``'s directory before any host is asked, else ``UsageError``."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{flag} {path}: {e.strerror or e}; allowed: a directory this user can "
                         "create and write") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: not writable by this user; allowed: a directory this "
                         "user can create and write")


def cmd_status(args: argparse.Namespace) -> int:
    rows = fleet_images(_hosts(args), ssh.SshRemote(connect_timeout=args.timeout))
    show(args.json, as_json(rows), table(rows, f"rigfleet images status ({args.inventory})"))
    return exit_status(rows)


def cmd_export(args: argparse.Namespace) -> int:
    hosts = _named(args, [args.host])
    want = load_desired(args.host, hosts[args.host].data)
    if (name := next((n for n in args.stack if n not in want.stacks), None)) is not None:
        raise UsageError(f"--stack {name!r}: {args.host} stages no such stack; "
                         f"allowed: {', '.join(want.stacks)}")
    stacks = {n: s.pins for n, s in want.stacks.items() if not args.stack or n in args.stack}
    wanted, _ = wanted_images(stacks)
    _directory("--to", args.to)
    remote = ssh.SshRemote(connect_timeout=args.timeout)
    saved: list[dict[str, Any]] = []
    t = Table(f"rigfleet images export ({args.host} -> {args.to})",
              ["GB", "image id", "image"], keys=())
    for w in wanted:
        version = stacks[w.stacks[0]].vllm_version
        with progress_bar(f"{args.host}: docker save {w.image}", None) as meter:
            archive = export_image(remote, hosts[args.host], w, args.to, version, meter)
        saved.append({"image": w.image, "digest": w.digest, **archive.summary(),
                      "vllm_version": version, "stacks": list(w.stacks)})
        t.row(f"{archive.size / 1e9:.2f}", archive.image_id[:19], w.image)
        t.note(archive.path.name, f"sha256 {archive.sha256}")
    show(args.json, {"host": args.host, "saved": saved}, t)
    return 0


def _pick(info: ArchiveInfo, image: str | None) -> ArchivedImage:
    if len(info.images) == 1:
        return info.images[0]
    if (named := next((i for i in info.images if image in i.repo_tags), None)) is not None:
        return named
    raise UsageError(f"{info.path}: holds {len(info.images)} images ({info.label}); "
                     "allowed: --image <repo>:<tag> naming one of them")


def _copy(src: Path, dest: Path) -> str:
    """Copy with a progress bar; the hex sha256 of what was copied."""
    partial = dest.with_name(dest.name + ".partial")
    try:
        with progress_bar(f"copy to {dest}", src.stat().st_size) as meter, \
                src.open("rb") as fin, partial.open("wb") as fout:
            reader = Counted(fin, meter)
            shutil.copyfileobj(reader, fout, 1 << 20)
        partial.replace(dest)
    except BaseException:  # a full disk, Ctrl-C: no half copy stays
        partial.unlink(missing_ok=True)
        raise
    return reader.sha.hexdigest()


def cmd_import(args: argparse.Namespace) -> int:
    if not args.host and args.into is None:
        raise UsageError("import: say where it goes: --host NAME (load it into that host's "
                         "engine) and/or --into DIR (keep it as an archive image source)")
    targets = _named(args, args.host) if args.host else {}
    info = inspect_archive(args.file)
    chosen = _pick(info, args.image)
    sidecar = info.sidecar if info.sidecar.get("image_id") == chosen.image_id else {}
    image = args.image or sidecar.get("image") or (
        chosen.repo_tags[0] if len(chosen.repo_tags) == 1 else None)
    if not image:
        raise UsageError(f"{args.file}: its name is unknown (tags: "
                         f"{', '.join(chosen.repo_tags) or 'none'}); allowed: --image "
                         "<repo>:<tag> (the pinned image it is a copy of)")
    digest = args.digest or sidecar.get("digest")
    result: dict[str, Any] = {"file": str(args.file), "image": image, "image_id": chosen.image_id,
                              "digest": digest, "vllm_version": sidecar.get("vllm_version"),
                              "hosts": {}, "into": None}
    t = Table(f"rigfleet images import {args.file.name}", ["where", "result"], keys=("where",))
    if args.into is not None:
        _directory("--into", args.into)
        dest = args.into / archive_name(image)
        same = dest.exists() and dest.resolve() == args.file.resolve()
        try:
            sha = (sidecar.get("sha256") if same and sidecar.get("sha256")
                   else _copy(args.file, dest))
        except OSError as e:
            raise ImagesCliError(f"--into {args.into}: cannot copy {args.file} to {dest}: "
                                 f"{e.strerror or e}") from None
        write_sidecar(dest, image=image, digest=digest, image_id=chosen.image_id,
                      vllm_version=sidecar.get("vllm_version"), sha256=sha,
                      bytes=info.size, imported_from=str(args.file))
        result.update(into=str(dest), sha256=sha)
        t.row("this machine", f"kept as {dest}")
    # Without a known digest the image is verified by its id alone (a loaded image has none).
    want = WantedImage(image, digest or chosen.image_id, chosen.image_id, ())
    remote = ssh.SshRemote(connect_timeout=args.timeout)
    for name in targets:
        try:
            with progress_bar(f"{name}: docker load {image}", info.size) as meter:
                result["hosts"][name] = load_archive(remote, targets[name], want, args.file, meter)
        except (RigfleetError, HostUnreachable, OSError) as e:
            result["hosts"][name] = f"failed: {e}"
    result["pin"] = pins = {k: v for k, v in (("image", image), ("digest", digest),
                                              ("image_id", chosen.image_id)) if v}
    for host, done in result["hosts"].items():
        t.row(host, done)
    t.note("pin", ", ".join(f"{k}: {v}" for k, v in pins.items())
           + ("" if digest else " (digest unknown: give --digest, or keep the pinned one)"))
    show(args.json, result, t)
    return int(any(done.startswith("failed") for done in result["hosts"].values()))

