"""What a host holds of the pinned images (references, archives, free space), in one read-only
script: the deploy's fact and ``rigfleet images status`` both run ``state_script``::

    script = state_script(("vllm/vllm-openai:v0.27.1",), ("/srv/images",), ("root",))
    state = parse_state(output_lines)
    state.images["vllm/vllm-openai:v0.27.1"]        # LocalImage or None
    state.free["root"]                              # Space("/dev/sda1", 80_000_000_000)
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from rigfleet.hostside.layout import HOST
from rigfleet.images.archive import ArchivedImage, images_in_manifest

# Docker's own default when the daemon cannot tell (not installed yet: preflight on a bare host).
DEFAULT_DOCKER_ROOT = "/var/lib/docker"
INSPECT_FORMAT = "{{.Id}}\t{{json .RepoDigests}}\t{{json .RepoTags}}"
ROOT = "root"


@dataclass(frozen=True)
class LocalImage:
    """One image in the host's engine, as ``docker image inspect`` shows it."""

    id: str
    repo_digests: tuple[str, ...] = ()
    repo_tags: tuple[str, ...] = ()
    loaded: tuple[str, ...] = ()  # digests a checked load stands for (no RepoDigests then)

    def has_digest(self, digest: str) -> bool:
        """Pulled by that digest, or loaded from a peer and checked against it."""
        return digest in self.loaded or any(d.rpartition("@")[2] == digest
                                            for d in self.repo_digests)


@dataclass(frozen=True)
class HostArchive:
    """One archive file on the host (``size`` None: missing; ``error``: no usable manifest)."""

    size: int | None
    images: tuple[ArchivedImage, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class Space:
    filesystem: str
    free: int


@dataclass(frozen=True)
class HostImageState:
    docker_root: str = DEFAULT_DOCKER_ROOT
    images: dict[str, LocalImage | None] = field(default_factory=dict)
    archives: dict[str, HostArchive] = field(default_factory=dict)
    dirs: dict[str, tuple[str, ...]] = field(default_factory=dict)  # directory -> its .tar files
    free: dict[str, Space] = field(default_factory=dict)

    def archive_files(self, path: str) -> tuple[str, ...] | None:
        """The archives ``path`` stands for (None: not on the host)."""
        if path in self.dirs:
            return self.dirs[path]
        found = self.archives.get(path)
        return (path,) if found is not None and found.size is not None else None


def state_script(refs: Iterable[str], archives: Iterable[str], spaces: Iterable[str]) -> str:
    """The host-side shell script (read-only; it succeeds whatever is missing)."""
    fmt = shlex.quote(INSPECT_FORMAT)
    lines = [
        "root=$(docker info --format '{{.DockerRootDir}}' 2>/dev/null) || root=",
        f'[ -n "$root" ] || root={DEFAULT_DOCKER_ROOT}',
        "printf 'root\\t%s\\n' \"$root\"",
        "rf_img() { if out=$(docker image inspect --format " + fmt + ' "$1" 2>/dev/null); '
        "then printf 'image\\t%s\\t%s\\n' \"$1\" \"$out\"; "
        "else printf 'image\\t%s\\t-\\n' \"$1\"; fi; }",
        "rf_arc() { printf 'archive\\t%s\\t%s\\t' \"$1\" \"$(stat -c %s \"$1\")\"; "
        "tar -xOf \"$1\" manifest.json 2>/dev/null | tr -d '\\n\\t'; echo; }",
        "rf_path() { if [ -d \"$1\" ]; then printf 'dir\\t%s\\n' \"$1\"; "
        "for f in \"$1\"/*.tar; do [ -f \"$f\" ] && rf_arc \"$f\"; done; "
        "elif [ -f \"$1\" ]; then rf_arc \"$1\"; "
        "else printf 'archive\\t%s\\tmissing\\n' \"$1\"; fi; }",
        "rf_free() { p=$1; [ \"$p\" = root ] && p=$root; q=$p; "
        "while [ ! -d \"$q\" ]; do q=$(dirname \"$q\"); done; "
        "df -Pk \"$q\" 2>/dev/null | awk -v k=\"$1\" "
        "'NR==2 {printf \"free\\t%s\\t%s\\t%.0f\\n\", k, $1, $4*1024}'; }",
        f"for f in {shlex.quote(str(HOST.loaded_images_dir))}/*; do [ -f \"$f\" ] && "
        "read -r i < \"$f\" && printf 'loaded\\t%s\\t%s\\n' \"${f##*/}\" \"$i\"; done",
    ]
    for fn, args in (("rf_img", refs), ("rf_path", archives), ("rf_free", spaces)):
        lines += [f"{fn} {shlex.quote(a)}" for a in dict.fromkeys(args)]
    return "\n".join(lines) + "\n"


def parse_state(lines: Iterable[str]) -> HostImageState:
    root = DEFAULT_DOCKER_ROOT
    images: dict[str, LocalImage | None] = {}
    archives: dict[str, HostArchive] = {}
    dirs: dict[str, list[str]] = {}
    free: dict[str, Space] = {}
    loaded: dict[str, tuple[str, ...]] = {}  # image id -> the digests its checked loads name
    current_dir: str | None = None
    for raw in lines:
        match raw.rstrip("\n").split("\t"):
            case ["root", path] if path:
                root = path
            case ["image", ref, *fields] if fields:
                images[ref] = _image(fields)
            case ["dir", path]:
                current_dir = path
                dirs[path] = []
            case ["archive", path, "missing", *_]:
                archives[path] = HostArchive(None)
            case ["archive", path, size, *manifest]:
                archives[path] = _archive(size, manifest[0] if manifest else "")
                if current_dir is not None and path.startswith(current_dir.rstrip("/") + "/"):
                    dirs[current_dir].append(path)
            case ["free", key, filesystem, nbytes] if nbytes.isdigit():
                free[key] = Space(filesystem, int(nbytes))
            case ["loaded", digest, image_id]:
                loaded[image_id] = (*loaded.get(image_id, ()), f"sha256:{digest}")
    images = {ref: replace(img, loaded=loaded[img.id]) if img and img.id in loaded else img
              for ref, img in images.items()}
    return HostImageState(root, images, archives,
                          {d: tuple(files) for d, files in dirs.items()}, free)


def _image(fields: list[str]) -> LocalImage | None:
    if fields[0] == "-" or len(fields) < 3:
        return None
    try:
        digests, tags = (json.loads(text) or [] for text in fields[1:3])
    except ValueError:
        digests, tags = [], []
    return LocalImage(fields[0], tuple(str(d) for d in digests), tuple(str(t) for t in tags))


def _archive(size: str, manifest: str) -> HostArchive:
    nbytes = int(size) if size.isdigit() else 0
    if not manifest:
        return HostArchive(nbytes, (), "holds no manifest.json (not a `docker save` archive?)")
    try:
        found = images_in_manifest(json.loads(manifest))
    except ValueError as e:
        return HostArchive(nbytes, (), f"its manifest.json cannot be read ({e})")
    return HostArchive(nbytes, found)
