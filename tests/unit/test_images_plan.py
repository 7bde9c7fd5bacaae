"""The staging plan (rigfleet/images/plan.py): a pure decision, sources and host state in,
commands out. Every branch: present / tag / fetch per source kind / refused, the disk check, the
verification after staging."""

from __future__ import annotations

from rigfleet.image_sources import ImageSource
from rigfleet.images.hoststate import HostImageState, LocalImage, Space
from rigfleet.images.plan import (
    GIB,
    RESERVE_BYTES,
    Shell,
    SourceResult,
    Stream,
    WantedImage,
    plan_host,
    plan_image,
    presence,
    verify_staged,
    wanted_images,
)
from rigfleet.pins import StackPins

IMAGE = "vllm/vllm-openai:v0.27.1"
DIGEST = "sha256:" + "d" * 64
IMAGE_ID = "sha256:" + "1" * 64
OTHER_ID = "sha256:" + "2" * 64
W = WantedImage(IMAGE, DIGEST, IMAGE_ID, ("int8",))
HUB = ImageSource("hub")
LAN = ImageSource("registry", url="http://registry.lan:5000")
ARCHIVE = ImageSource("archive", path="/srv/archive")
UPLOAD = ImageSource("archive", path="/srv/archive", via="upload", upload_dir="/data/up")
HOST_ARCHIVE = ImageSource("host-archive", path="/srv/images")


def state(images: dict[str, LocalImage | None] | None = None, free: int = 500 * GIB,
          **more: Space) -> HostImageState:
    return HostImageState("/var/lib/docker", images or {},
                          free={"root": Space("/dev/sda1", free), **more})


def pulled(image_id: str = IMAGE_ID, tags: tuple[str, ...] = ()) -> LocalImage:
    return LocalImage(image_id, (f"vllm/vllm-openai@{DIGEST}",), tags)


def ok(source: ImageSource, size: int | None = 10 * GIB, index: int = 0, **kw) -> SourceResult:
    return SourceResult(index, source, True, "there", size, **kw)


# --- what the stacks want ------------------------------------------------------------------


def test_stacks_sharing_an_image_stage_it_once_in_stack_order() -> None:
    a = StackPins("tq3", IMAGE, DIGEST, "0.27.1", image_id=IMAGE_ID)
    b = StackPins("int8", IMAGE, DIGEST, "0.27.1")
    c = StackPins("zeta", "vllm/vllm-openai:v0.21.0", "sha256:" + "e" * 64, "0.21.0")
    wanted, problems = wanted_images({"tq3": a, "zeta": c, "int8": b})
    assert problems == ()
    assert [w.image for w in wanted] == [IMAGE, "vllm/vllm-openai:v0.21.0"]
    assert wanted[0].stacks == ("int8", "tq3") and wanted[0].image_id == IMAGE_ID


def test_one_name_pinned_to_two_images_is_a_conflict() -> None:
    a = StackPins("int8", IMAGE, DIGEST, "0.27.1")
    b = StackPins("tq3", IMAGE, "sha256:" + "e" * 64, "0.27.1")
    _, problems = wanted_images({"int8": a, "tq3": b})
    assert len(problems) == 1
    assert "stacks.int8 and stacks.tq3 pin vllm/vllm-openai:v0.27.1 to different images" in \
        problems[0] and "allowed: one image per name" in problems[0]


# --- what the host has -----------------------------------------------------------------------


def test_presence_by_image_id_by_digest_and_absence() -> None:
    assert presence(W, state({IMAGE: pulled(tags=(IMAGE,))})).state == "present"
    # Loaded from an archive: no repo digest, the id decides.
    loaded = LocalImage(IMAGE_ID, (), (IMAGE,))
    assert presence(W, state({IMAGE: loaded})).state == "present"
    # Docker's containerd image store: the id is the pulled (index) digest.
    assert presence(W, state({IMAGE: LocalImage(DIGEST, (), (IMAGE,))})).state == "present"
    # No image id pinned: RepoDigests decide.
    no_id = WantedImage(IMAGE, DIGEST, None, ("int8",))
    assert presence(no_id, state({IMAGE: pulled("sha256:" + "9" * 64)})).state == "present"
    assert presence(no_id, state({IMAGE: LocalImage(OTHER_ID, (), (IMAGE,))})).state == "absent"
    assert presence(W, state()).state == "absent"


def test_the_name_on_another_image_is_not_presence() -> None:
    other = LocalImage(OTHER_ID, ("vllm/vllm-openai@sha256:" + "e" * 64,), (IMAGE,))
    here = presence(W, state({IMAGE: other}))
    assert here.state == "absent"


def test_there_by_digest_or_id_only_is_tagged_not_fetched() -> None:
    by_digest = state({W.digest_ref: pulled()})
    p = plan_image(W, presence(W, by_digest), [])
    assert p.action == "tag" and p.steps == (Shell(f"docker tag {W.digest_ref} {IMAGE}"),)
    by_id = state({IMAGE_ID: LocalImage(IMAGE_ID)})
    p = plan_image(W, presence(W, by_id), [])
    assert p.steps == (Shell(f"docker tag {IMAGE_ID} {IMAGE}"),)


def test_pulled_digest_with_another_id_refuses_naming_the_pins() -> None:
    plan = plan_host("host1", [W], state({W.digest_ref: pulled(OTHER_ID)}), {})
    assert plan.images[0].action == "refused"
    assert plan.problems[0].startswith("host1: pins: vllm/vllm-openai:v0.27.1: the host's "
                                       "image pulled by")
    assert f"has id {OTHER_ID}, not the pinned image_id {IMAGE_ID}" in plan.problems[0]


def test_converged_host_has_no_steps() -> None:
    plan = plan_host("host1", [W], state({IMAGE: pulled(tags=(IMAGE,))}), {})
    assert not any(p.steps for p in plan.images)
    assert plan.problems == () and plan.images[0].action == "present"


# --- fetch commands per source ---------------------------------------------------------------


def test_hub_pulls_tag_at_digest_then_names_it() -> None:
    p = plan_image(W, presence(W, state()), [ok(HUB)])
    assert p.steps == (Shell(f"docker pull --quiet {IMAGE}@{DIGEST}"),
                       Shell(f"docker tag vllm/vllm-openai@{DIGEST} {IMAGE}"))


def test_lan_registry_pulls_by_digest_and_tags_the_pinned_name() -> None:
    p = plan_image(W, presence(W, state()), [ok(LAN)])
    ref = f"registry.lan:5000/vllm/vllm-openai@{DIGEST}"
    assert p.steps == (Shell(f"docker pull --quiet {ref}"), Shell(f"docker tag {ref} {IMAGE}"))
    other = ImageSource("registry", url="https://reg.lan", repository="mirror/vllm")
    p = plan_image(W, presence(W, state()), [ok(other)])
    assert p.steps[0] == Shell(f"docker pull --quiet reg.lan/mirror/vllm@{DIGEST}")


def test_control_archive_streams_into_docker_load_then_tags_by_id() -> None:
    p = plan_image(W, presence(W, state()), [ok(ARCHIVE, archive="/srv/archive/x.tar")])
    assert p.steps == (Stream("/srv/archive/x.tar", "docker load"),
                       Shell(f"docker tag {IMAGE_ID} {IMAGE}"))


def test_uploaded_archive_is_loaded_then_removed() -> None:
    p = plan_image(W, presence(W, state()), [ok(UPLOAD, archive="/srv/archive/x y.tar")])
    assert p.steps == (
        Shell("install -d -m 0700 /data/up"),
        Stream("/srv/archive/x y.tar", "cat > '/data/up/x y.tar'"),
        Shell("docker load -i '/data/up/x y.tar'; rc=$?; rm -f '/data/up/x y.tar'; exit $rc"),
        Shell(f"docker tag {IMAGE_ID} {IMAGE}"),
    )


def test_host_archive_is_loaded_from_its_path() -> None:
    p = plan_image(W, presence(W, state()), [ok(HOST_ARCHIVE, archive="/srv/images/x.tar")])
    assert p.steps == (Shell("docker load -i /srv/images/x.tar"),
                       Shell(f"docker tag {IMAGE_ID} {IMAGE}"))


def test_the_first_source_that_holds_it_is_used() -> None:
    tried = [SourceResult(0, HUB, False, "gone"), ok(ARCHIVE, index=1, archive="/a.tar")]
    p = plan_image(W, presence(W, state()), tried)
    assert p.source is tried[1] and isinstance(p.steps[0], Stream)


# --- refusals ----------------------------------------------------------------------------------


def test_no_source_refuses_naming_the_image_and_each_source() -> None:
    tried = [SourceResult(0, HUB, False, "vllm/vllm-openai@sha256:dd... is not there (HTTP 404)"),
             SourceResult(1, ARCHIVE, False, "/srv/archive is missing on this machine"),
             SourceResult(2, HOST_ARCHIVE, False, "/srv/images is missing on the host")]
    plan = plan_host("host1", [W], state(), {IMAGE: tried})
    head, *lines = plan.problems
    assert head.startswith("host1: image_sources: vllm/vllm-openai:v0.27.1 (stacks int8) is not "
                           "on the host and no source can provide it")
    assert f"digest {DIGEST}, image id {IMAGE_ID}" in head and "allowed:" in head
    assert lines == [
        "host1: image_sources[0] (hub): vllm/vllm-openai@sha256:dd... is not there (HTTP 404)",
        "host1: image_sources[1] (archive /srv/archive (this machine)): /srv/archive is "
        "missing on this machine",
        "host1: image_sources[2] (host-archive /srv/images): /srv/images is missing on the host",
    ]


# --- disk ------------------------------------------------------------------------------------


def test_disk_check_counts_every_image_to_fetch_with_a_reserve() -> None:
    second = WantedImage("vllm/vllm-openai:v0.21.0", "sha256:" + "e" * 64, OTHER_ID, ("tq3",))
    results = {IMAGE: [ok(HUB, size=10 * GIB)],
               second.image: [ok(ARCHIVE, size=20 * GIB, archive="/a.tar")]}
    need = 10 * GIB * 3 + 20 * GIB * 2  # a pull ~3x its download, a load ~2x the archive
    roomy = plan_host("host1", [W, second], state(free=need + RESERVE_BYTES), results)
    assert roomy.problems == ()
    tight = plan_host("host1", [W, second], state(free=need + RESERVE_BYTES - 1), results)
    assert len(tight.problems) == 1
    line = tight.problems[0]
    assert line.startswith("host1: image_sources: staging needs ~72.0 GiB on /var/lib/docker "
                           "(/dev/sda1; vllm/vllm-openai:v0.27.1 from image_sources[0] (hub) "
                           "~30.0 GiB; vllm/vllm-openai:v0.21.0 from")
    assert "but 72.0 GiB is free" in line and "docker image prune -a" in line


def test_images_already_there_need_no_space() -> None:
    plan = plan_host("host1", [W], state({IMAGE: pulled(tags=(IMAGE,))}, free=0), {})
    assert plan.problems == ()


def test_upload_counts_on_its_own_filesystem() -> None:
    results = {IMAGE: [ok(UPLOAD, size=20 * GIB, archive="/a.tar")]}
    s = state(free=100 * GIB, **{"/data/up": Space("/dev/sdb1", 10 * GIB)})
    plan = plan_host("host1", [W], s, results)
    assert len(plan.problems) == 1 and "on /data/up (/dev/sdb1" in plan.problems[0]
    same_fs = state(free=100 * GIB, **{"/data/up": Space("/dev/sda1", 100 * GIB)})
    assert plan_host("host1", [W], same_fs, results).problems == ()  # 40 + 20 + 2 <= 100
    tight = state(free=61 * GIB, **{"/data/up": Space("/dev/sda1", 61 * GIB)})
    assert plan_host("host1", [W], tight, results).problems  # 62 GiB on one filesystem


def test_unknown_sizes_and_free_space_are_noted_not_refused() -> None:
    unknown = HostImageState("/var/lib/docker", {}, free={})
    plan = plan_host("host1", [W], unknown, {IMAGE: [ok(HUB, size=10 * GIB)]})
    assert plan.problems == () and any("free space on /var/lib/docker unknown" in n
                                       for n in plan.notes)
    plan = plan_host("host1", [W], state(), {IMAGE: [ok(HUB, size=None)]})
    assert plan.problems == () and any("size unknown" in n for n in plan.notes)


# --- verification after staging ------------------------------------------------------------


def test_verify_a_pull_by_id_and_digest_a_load_by_id() -> None:
    hub = ok(HUB)
    assert verify_staged(W, pulled(tags=(IMAGE,)), hub) is None
    assert "RepoDigests" in str(verify_staged(W, LocalImage(IMAGE_ID, (), (IMAGE,)), hub))
    assert "has id" in str(verify_staged(W, pulled(OTHER_ID), hub))
    archive = ok(ARCHIVE, archive="/a.tar")
    assert verify_staged(W, LocalImage(IMAGE_ID, (), (IMAGE,)), archive) is None
    assert "has id sha256:2222" in str(verify_staged(W, LocalImage(OTHER_ID), archive))
    assert "not on the host" in str(verify_staged(W, None, archive))
    no_id = WantedImage(IMAGE, DIGEST, None, ())
    assert verify_staged(no_id, pulled("sha256:" + "9" * 64), None) is None
    assert verify_staged(no_id, LocalImage(OTHER_ID), None) is not None
