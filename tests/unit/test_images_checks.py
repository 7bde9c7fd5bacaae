"""The control-side source checks (rigfleet/images/checks.py) against a fake registry and real
archive files: what each source says when it holds the image and when not, and that a fleet
asks a registry once per image."""

from __future__ import annotations

from pathlib import Path

from images_fakes import FakeHub, docker_save_tar

from rigfleet.hostdata import HostSettings
from rigfleet.image_sources import ImageSource
from rigfleet.images.archive import ArchivedImage, archive_name
from rigfleet.images.checks import SourceChecker, check_url
from rigfleet.images.hoststate import HostArchive, HostImageState
from rigfleet.images.plan import WantedImage

IMAGE = "vllm/vllm-openai:v0.27.1"
NIGHTLY = "vllm/vllm-openai:nightly-01d4d1ad375dc5854779c593eee093bcebb0cada"
DIGEST = "sha256:" + "d" * 64
GIB = 1024**3


def settings(*sources: ImageSource, bump_registry: str | None = None) -> HostSettings:
    return HostSettings(name="host1", stack="int8", power_caps_w=(250, 250), model_dir="/srv/m",
                        front_port=8000, api_key_file="/k", hf_token_file=None,
                        docker_registry_mirror=None, apt_repos={}, pip_index_url=None,
                        hf_endpoint=None, bump_registry=bump_registry,
                        image_sources=sources)


def checker(known: dict[str, tuple[str, int]] | None = None, down: set[str] | None = None):
    hubs: dict[str, FakeHub] = {}

    def make(url: str) -> FakeHub:
        hubs[url] = FakeHub(url, known or {}, unreachable=url in (down or set()))
        return hubs[url]

    FakeHub.calls = []
    return SourceChecker(make)  # type: ignore[arg-type]


def test_hub_source_is_checked_by_digest_with_its_size_and_image_id() -> None:
    c = checker({DIGEST: ("sha256:" + "1" * 64, 9 * GIB)})
    w = WantedImage(IMAGE, DIGEST, None, ("int8",))
    [r] = c.results(w, settings(ImageSource("hub")), HostImageState())
    assert r.ok and r.size == 9 * GIB and r.ref == f"{IMAGE}@{DIGEST}"
    assert r.image_id == "sha256:" + "1" * 64  # what a peer's load is checked against
    assert FakeHub.calls == [("HEAD", "https://registry-1.docker.io", f"vllm/vllm-openai@{DIGEST}"),
                             ("GET", "https://registry-1.docker.io", f"vllm/vllm-openai@{DIGEST}")]


def test_a_purged_nightly_says_why_and_the_next_source_is_tried(tmp_path) -> None:
    c = checker()
    saved = tmp_path / "archive"
    saved.mkdir()
    image_id = docker_save_tar(saved / archive_name(NIGHTLY), [NIGHTLY])
    (saved / "notes.txt").write_text("not an archive")  # only *.tar files count
    w = WantedImage(NIGHTLY, DIGEST, image_id, ("tq3",))
    first, second = c.results(w, settings(ImageSource("hub"),
                                          ImageSource("archive", path=str(saved))),
                              HostImageState())
    assert not first.ok
    assert first.reason == (f"vllm/vllm-openai@{DIGEST} is not there at "
                            "https://registry-1.docker.io (HTTP 404: digest, tag or "
                            "repository gone) (vLLM keeps only the 14 newest nightly-* tags on "
                            "Docker Hub (about two weeks); release tags stay)")
    assert second.ok and second.archive == str(saved / archive_name(NIGHTLY))
    assert second.size == (saved / archive_name(NIGHTLY)).stat().st_size


def test_unreachable_and_unchecked_registries() -> None:
    w = WantedImage(IMAGE, DIGEST, None, ())
    c = checker(down={"https://registry-1.docker.io"})
    [r] = c.results(w, settings(ImageSource("hub")), HostImageState())
    assert not r.ok and r.reason.startswith("unreachable from this machine: registry "
                                            "https://registry-1.docker.io")
    [r] = c.results(w, settings(ImageSource("hub", check="none")), HostImageState())
    assert r.ok and r.size is None and "not checked from here" in r.reason


def test_hub_check_defaults_to_bump_registry_then_the_images_registry() -> None:
    hub = ImageSource("hub")
    w = WantedImage(IMAGE, DIGEST, None, ())
    assert check_url(hub, w, settings(hub)) == "https://registry-1.docker.io"
    assert check_url(hub, w, settings(hub, bump_registry="http://127.0.0.1:15000")) == \
        "http://127.0.0.1:15000"
    ghcr = WantedImage("ghcr.io/a/b:v1", DIGEST, None, ())
    assert check_url(hub, ghcr, settings(hub, bump_registry="http://x:1")) == "https://ghcr.io"
    assert check_url(ImageSource("hub", check="http://y:2"), w, settings(hub)) == "http://y:2"


def test_lan_registry_is_checked_where_this_machine_reaches_it() -> None:
    c = checker({DIGEST: ("sha256:" + "1" * 64, GIB)})
    lan = ImageSource("registry", url="http://registry.lan:5000", repository="mirror/vllm",
                      check="http://127.0.0.1:15000")
    [r] = c.results(WantedImage(IMAGE, DIGEST, None, ()), settings(lan), HostImageState())
    assert r.ok and r.ref == f"registry.lan:5000/mirror/vllm@{DIGEST}"
    assert FakeHub.calls[0] == ("HEAD", "http://127.0.0.1:15000", f"mirror/vllm@{DIGEST}")


def test_control_archive_mismatch_missing_and_no_image_id(tmp_path) -> None:
    c = checker()
    other = tmp_path / "other.tar"
    other_id = docker_save_tar(other, ["vllm/vllm-openai:v0.21.0"], payload=b"other")
    wanted_id = "sha256:" + "7" * 64
    w = WantedImage(IMAGE, DIGEST, wanted_id, ())
    [r] = c.results(w, settings(ImageSource("archive", path=str(other))), HostImageState())
    assert not r.ok and r.reason == (f"no archive there holds image id {wanted_id} (other.tar "
                                     f"holds {other_id[:19]} (vllm/vllm-openai:v0.21.0))")
    [r] = c.results(w, settings(ImageSource("archive", path=str(tmp_path / "gone"))),
                    HostImageState())
    assert r.reason == f"{tmp_path / 'gone'} is missing on this machine"
    empty = tmp_path / "empty"
    empty.mkdir()
    [r] = c.results(w, settings(ImageSource("archive", path=str(empty))), HostImageState())
    assert r.reason == f"{empty} on this machine holds no *.tar archive"
    [r] = c.results(WantedImage(IMAGE, DIGEST, None, ()),
                    settings(ImageSource("archive", path=str(other))), HostImageState())
    assert "the pins carry no image_id" in r.reason and "rigfleet pins lock" in r.reason


def test_host_archive_from_the_hosts_state() -> None:
    c = checker()
    wanted_id = "sha256:" + "7" * 64
    w = WantedImage(IMAGE, DIGEST, wanted_id, ())
    source = ImageSource("host-archive", path="/srv/images")
    missing = HostImageState(archives={"/srv/images": HostArchive(None)})
    [r] = c.results(w, settings(source), missing)
    assert r.reason == "/srv/images is missing on the host"
    f = f"/srv/images/{archive_name(IMAGE)}"
    holds = HostImageState(dirs={"/srv/images": (f,)},
                           archives={f: HostArchive(5, (ArchivedImage(wanted_id, (IMAGE,)),))})
    [r] = c.results(w, settings(source), holds)
    assert r.ok and r.archive == f and r.size == 5
    wrong = HostImageState(dirs={"/srv/images": (f,)}, archives={
        f: HostArchive(5, (ArchivedImage("sha256:" + "8" * 64, ()),))})
    [r] = c.results(w, settings(source), wrong)
    assert not r.ok and "holds sha256:888888888888 (untagged)" in r.reason
    empty = HostImageState(dirs={"/srv/images": ()})
    assert "holds no *.tar archive" in c.results(w, settings(source), empty)[0].reason


def test_a_fleet_asks_the_registry_once_per_image(tmp_path: Path) -> None:
    c = checker({DIGEST: ("sha256:" + "1" * 64, GIB)})
    w = WantedImage(IMAGE, DIGEST, None, ())
    for _ in range(5):
        assert c.results(w, settings(ImageSource("hub")), HostImageState())[0].ok
    assert len(FakeHub.calls) == 2  # one HEAD, one GET for the size


def test_the_nightly_note_follows_each_images_tag_not_the_first_asked() -> None:
    # A nightly tag and a release tag of one build: one digest, two pinned names (kept answers
    # were keyed by digest, so the second name got the first one's note or none).
    release, nightly = (WantedImage(i, DIGEST, None, ()) for i in (IMAGE, NIGHTLY))
    for order in ((release, nightly), (nightly, release)):
        c = checker()
        reasons = {w.image: c.results(w, settings(ImageSource("hub")), HostImageState())[0].reason
                   for w in order}
        assert "nightly-* tags" in reasons[NIGHTLY] and "nightly" not in reasons[IMAGE]
