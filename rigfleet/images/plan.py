"""The staging plan (pure: sources and host state in, commands out): which pinned images a host
still needs, from which source, with which commands (present/tag/fetch/refused: docs/images.md)::

    wanted, problems = wanted_images(pins.stacks)   # stack name -> StackPins
    plan = plan_host("host1", wanted, state, results)
    plan.problems        # refusals, one line each (preflight raises them)
    plan.images[0].steps # (Shell("docker pull --quiet ..."), Shell("docker tag ..."))
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import zip_longest

from rigfleet.commands import docker as docker_commands
from rigfleet.image_sources import ImageSource
from rigfleet.images.hoststate import ROOT, HostImageState, LocalImage
from rigfleet.pins import StackPins
from rigfleet.registry import registry_of, split_image

GIB = 1024**3
# Peak disk use per byte fetched, and what stays free (docs/images.md, "preflight").
RESERVE_BYTES = 2 * GIB
PULL_FACTOR = 3.0
LOAD_FACTOR = 2.0


@dataclass(frozen=True)
class WantedImage:
    """One pinned image a host stages (every stack that names it in ``stacks``)."""

    image: str  # <repo>:<tag>: the local name the stacks run
    digest: str
    image_id: str | None
    stacks: tuple[str, ...]

    @property
    def repository(self) -> str:
        return split_image(self.image)[0]

    @property
    def digest_ref(self) -> str:
        return f"{self.repository}@{self.digest}"

    @property
    def refs(self) -> tuple[str, ...]:
        """What the host is asked about: the name, the digest reference, the image id."""
        return (self.image, self.digest_ref, *((self.image_id,) if self.image_id else ()))

    @property
    def label(self) -> str:
        return f"{self.image} (stacks {', '.join(self.stacks)})"


def wanted_images(stacks: Mapping[str, StackPins]
                  ) -> tuple[tuple[WantedImage, ...], tuple[str, ...]]:
    """The pinned images, one per name in stack-name order, and the conflicting pins' problems."""
    by_image: dict[str, list[StackPins]] = {}
    for name in sorted(stacks):
        by_image.setdefault(stacks[name].image, []).append(stacks[name])
    out: list[WantedImage] = []
    problems: list[str] = []
    for image, pins in by_image.items():
        first = pins[0]
        for other in pins[1:]:
            if other.digest != first.digest or (
                    other.image_id and first.image_id and other.image_id != first.image_id):
                problems.append(
                    f"pins: stacks.{first.name} and stacks.{other.name} pin {image} to "
                    f"different images ({first.digest[:19]}, {other.digest[:19]}); allowed: one "
                    "image per name on a host (pin the same digest, or different tags)")
        image_id = next((p.image_id for p in pins if p.image_id), None)
        out.append(WantedImage(image, first.digest, image_id, tuple(p.name for p in pins)))
    return tuple(out), tuple(problems)


def matches(w: WantedImage, img: LocalImage) -> bool:
    """``img`` is the pinned image: by id (or containerd's digest id), else by RepoDigests."""
    return img.id in (w.image_id, w.digest) if w.image_id else img.has_digest(w.digest)


@dataclass(frozen=True)
class Presence:
    """What the host holds of one wanted image: ``present`` | ``tag`` (under ``ref``) |
    ``absent`` | ``mismatch`` (pulled by the pinned digest, but another image id)."""

    state: str
    ref: str | None = None
    local: LocalImage | None = None

    @property
    def label(self) -> str:
        if self.local is None:
            return "no"
        how = "digest" if self.local.repo_digests else "image id"
        return f"yes ({how})" if self.state == "present" else f"as {self.ref}"


def presence(w: WantedImage, state: HostImageState) -> Presence:
    for ref in w.refs:  # the name first: there, it is present
        img = state.images.get(ref)
        if img is not None and matches(w, img):
            return Presence("present" if ref == w.image else "tag", ref, img)
    by_digest = state.images.get(w.digest_ref)
    if by_digest is not None and by_digest.has_digest(w.digest):
        return Presence("mismatch", w.digest_ref, by_digest)
    return Presence("absent")


@dataclass(frozen=True)
class SourceResult:
    """What one source can do for one image (``rigfleet.images.checks`` decides); ``size``:
    the bytes it brings (None: unknown), ``image_id``: what the registry's manifests name."""

    index: int
    source: ImageSource
    ok: bool
    reason: str
    size: int | None = None
    archive: str | None = None
    ref: str | None = None
    image_id: str | None = None

    @property
    def label(self) -> str:
        if self.source.cache is not None:
            return self.source.label
        return f"image_sources[{self.index}] ({self.source.label})"


@dataclass(frozen=True)
class Shell:
    command: str


@dataclass(frozen=True)
class Stream:
    """A control-side file fed over SSH into ``command``'s stdin on the host (never pyinfra's
    upload: with ``_sudo`` it stages the whole file in the SSH user's temp directory first)."""

    path: str
    command: str


Step = Shell | Stream


@dataclass(frozen=True)
class ImagePlan:
    """One wanted image: what is there, the ``action`` and its ``steps``, from where, and
    ``need``: space key (``root`` or a directory) -> bytes the fetch needs there."""

    want: WantedImage
    presence: Presence
    action: str
    steps: tuple[Step, ...] = ()
    source: SourceResult | None = None
    tried: tuple[SourceResult, ...] = ()
    need: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StagingPlan:
    """A host's plan for every wanted image; ``problems`` refuse the deploy (one line each)."""

    images: tuple[ImagePlan, ...]
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def tag_command(src: str, image: str) -> str:
    return f"docker tag {shlex.quote(src)} {shlex.quote(image)}"


def registry_ref(w: WantedImage, source: ImageSource) -> str:
    return f"{source.registry_host}/{source.repository or registry_of(w.repository)[1]}@{w.digest}"


def fetch_steps(w: WantedImage, r: SourceResult) -> tuple[Step, ...]:
    kind = r.source.kind
    if kind == "hub":
        return (Shell(docker_commands.pull(f"{w.image}@{w.digest}")),
                Shell(tag_command(w.digest_ref, w.image)))
    if kind == "registry":
        ref = r.ref or registry_ref(w, r.source)
        return Shell(docker_commands.pull(ref)), Shell(tag_command(ref, w.image))
    assert w.image_id and r.archive, "an archive source is ok only for a pinned image id"
    tag = Shell(tag_command(w.image_id, w.image))
    if kind == "host-archive":
        return Shell(f"docker load -i {shlex.quote(r.archive)}"), tag
    if r.source.via == "upload":
        q = shlex.quote(posixpath.join(r.source.upload_dir, posixpath.basename(r.archive)))
        return (Shell(f"install -d -m 0700 {shlex.quote(r.source.upload_dir)}"),
                Stream(r.archive, f"cat > {q}"),
                Shell(f"docker load -i {q}; rc=$?; rm -f {q}; exit $rc"), tag)
    return Stream(r.archive, "docker load"), tag


# The host's stderr line the deploy shows as a warning (roles.ops.WarnedCommand).
WARNING_MARK = "[rigfleet-images] WARNING: "


def cache_steps(w: WantedImage, r: SourceResult, after: SourceResult) -> tuple[Step, ...]:
    """A pull from the fleet cache ``r`` that falls back on the host to ``after``, warning."""
    first = " && ".join(s.command for s in fetch_steps(w, r) if isinstance(s, Shell))
    then = " && ".join(s.command for s in fetch_steps(w, after) if isinstance(s, Shell))
    note = shlex.quote(f"{WARNING_MARK}{w.image}: the pull from {r.label} failed (down, or a "
                       f"blob failed its digest check); pulling from {after.label} instead")
    return (Shell(f"{{ {first}; }} || {{ echo {note} >&2; {then}; }}"),)


def need_bytes(r: SourceResult) -> dict[str, int]:
    size = r.size or 0
    need = {ROOT: int(size * (PULL_FACTOR if r.source.keeps_digest else LOAD_FACTOR))}
    if r.source.kind == "archive" and r.source.via == "upload":
        need[r.source.upload_dir] = size
    return need


def plan_image(w: WantedImage, here: Presence, results: Sequence[SourceResult]) -> ImagePlan:
    if here.state == "present":
        return ImagePlan(w, here, "present")
    if here.state == "tag" and here.ref:
        return ImagePlan(w, here, "tag", (Shell(tag_command(here.ref, w.image)),))
    if here.state == "mismatch":
        return ImagePlan(w, here, "refused", tried=tuple(results))
    ok = [r for r in results if r.ok]
    for r, after in zip_longest(ok, ok[1:]):  # each usable source and the next one
        if r.source.cache is None:
            return ImagePlan(w, here, "fetch", fetch_steps(w, r), r, tuple(results), need_bytes(r))
        # A fleet cache is not asked from here: used only before a registry that holds it.
        if after is not None and after.source.kind in ("hub", "registry"):
            return ImagePlan(w, here, "fetch", cache_steps(w, r, after), r, tuple(results),
                             need_bytes(after))
    return ImagePlan(w, here, "refused", tried=tuple(r for r in results if r.source.cache is None))


def plan_host(host: str, wanted: Sequence[WantedImage], state: HostImageState,
              results: Mapping[str, Sequence[SourceResult]],
              conflicts: Sequence[str] = ()) -> StagingPlan:
    """Every wanted image's plan, the refusals and the disk check for one host."""
    plans = [plan_image(w, presence(w, state), results.get(w.image, ())) for w in wanted]
    problems = [f"{host}: {line}" for line in conflicts]
    notes: list[str] = []
    for p in plans:
        if p.action == "refused":
            problems += refusal(host, p)
        elif (p.action == "fetch" and p.source is not None and p.source.size is None
              and not p.need.get(ROOT)):
            notes.append(f"{host}: {p.want.image}: size unknown from {p.source.label}; the disk "
                         "check does not count it")
    disk, unknown = disk_problems(host, plans, state)
    return StagingPlan(tuple(plans), tuple(problems + disk), tuple(notes + unknown))


def refusal(host: str, p: ImagePlan) -> list[str]:
    w = p.want
    ident = f"digest {w.digest}" + (f", image id {w.image_id}" if w.image_id else "")
    if p.presence.state == "mismatch" and p.presence.local is not None:
        return [f"{host}: pins: {w.image}: the host's image pulled by {w.digest} has id "
                f"{p.presence.local.id}, not the pinned image_id {w.image_id}; allowed: the "
                "image id of that digest (re-resolve it: `rigfleet pins lock --refresh`)"]
    head = (f"{host}: image_sources: {w.label} is not on the host and no source can provide it "
            f"({ident}); allowed: a source that holds it (pin a release tag (vX.Y.Z), or keep a "
            "saved copy: `rigfleet images import FILE --into DIR` and list DIR as an archive "
            "source, or --host to load it)")
    return [head] + [f"{host}: {r.label}: {r.reason}" for r in p.tried]


def disk_problems(host: str, plans: Sequence[ImagePlan],
                  state: HostImageState) -> tuple[list[str], list[str]]:
    """(refusals, notes): the space the fetches need per filesystem against what is free."""
    per_fs: dict[str, tuple[str, int, list[int], list[str]]] = {}  # (path, free, sizes, items)
    notes: list[str] = []
    for p in plans:
        for key, nbytes in p.need.items():
            space = state.free.get(key)
            path = state.docker_root if key == ROOT else key
            if space is None:
                notes.append(f"{host}: free space on {path} unknown; the disk check skipped it")
                continue
            *_, sizes, items = per_fs.setdefault(space.filesystem, (path, space.free, [], []))
            sizes.append(nbytes)
            items.append(f"{p.want.image} from {p.source.label if p.source else '?'} "
                         f"~{_gib(nbytes)}")
    problems = [f"{host}: image_sources: staging needs ~{_gib(need)} on "
                f"{path} ({fs}; {'; '.join(items)}; {_gib(RESERVE_BYTES)} kept free) "
                f"but {_gib(free)} is free; allowed: more free space there (`docker image "
                "prune -a` removes images no container uses), or fewer staged stacks"
                for fs, (path, free, sizes, items) in per_fs.items()
                if (need := sum(sizes) + RESERVE_BYTES) > free]
    return problems, notes


def _gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.1f} GiB"


def verify_staged(w: WantedImage, local: LocalImage | None, source: SourceResult | None) -> \
        str | None:
    """After a fetch or tag, why the pinned name does not hold the pinned image (None: it
    does); a loaded archive has no RepoDigests and is verified by image id alone."""
    if local is None:
        return f"image {w.image} is not on the host after staging"
    if w.image_id and local.id not in (w.image_id, w.digest):
        return (f"image {w.image} has id {local.id}; the pins say image_id {w.image_id}"
                + (f" (from {source.source.label})" if source else ""))
    by_digest = (source is not None and source.source.keeps_digest) or not w.image_id
    if by_digest and not local.has_digest(w.digest):
        return (f"image {w.image} has RepoDigests {list(local.repo_digests) or 'none'}; the "
                f"pin is {w.digest}")
    return None
