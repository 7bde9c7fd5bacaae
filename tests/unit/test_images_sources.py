"""Host data ``image_sources`` (rigfleet/image_sources.py through rigfleet/hostdata.py): the
format, the default, and a clear error for each kind of mistake."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from images_fakes import fleet_data

from rigfleet.hostdata import KEY_DEFAULTS, HostDataError, validate_host
from rigfleet.image_sources import DEFAULT_SOURCES, DEFAULT_UPLOAD_DIR, ImageSource


@pytest.fixture
def data(tmp_path: Path) -> dict[str, Any]:
    return fleet_data(tmp_path)


def errors(data: dict[str, Any], sources: Any) -> list[str]:
    with pytest.raises(HostDataError) as e:
        validate_host("host1", {**data, "image_sources": sources})
    return e.value.problems


def test_default_is_the_hub_through_the_daemon(data) -> None:
    assert "image_sources" in KEY_DEFAULTS
    assert validate_host("host1", data).image_sources == DEFAULT_SOURCES == (ImageSource("hub"),)


def test_every_kind_parses(data, tmp_path) -> None:
    settings = validate_host("host1", {**data, "image_sources": [
        {"kind": "registry", "url": "http://registry.lan:5000", "repository": "mirror/vllm",
         "check": "http://127.0.0.1:15000"},
        {"kind": "archive", "path": str(tmp_path / "archive")},
        {"kind": "archive", "path": "rel/dir", "via": "upload", "upload_dir": "/data/up"},
        {"kind": "host-archive", "path": "/srv/images"},
        {"kind": "hub", "check": "none"},
    ]})
    lan, archive, upload, host_archive, hub = settings.image_sources
    assert lan == ImageSource("registry", url="http://registry.lan:5000",
                              repository="mirror/vllm", check="http://127.0.0.1:15000")
    assert lan.registry_host == "registry.lan:5000" and lan.keeps_digest
    assert archive.path == str(tmp_path / "archive") and archive.via == "stream"
    assert archive.upload_dir == DEFAULT_UPLOAD_DIR and not archive.keeps_digest
    assert upload.path == str(Path("rel/dir").absolute()) and upload.upload_dir == "/data/up"
    assert host_archive.label == "host-archive /srv/images"
    assert hub.check == "none" and hub.label == "hub"


def test_archive_path_expands_home(data) -> None:
    settings = validate_host("host1", {**data, "image_sources": [
        {"kind": "archive", "path": "~/image-archive"}]})
    assert settings.image_sources[0].path == os.path.expanduser("~/image-archive")


def test_each_mistake_names_the_entry_key_and_what_is_allowed(data) -> None:
    lines = errors(data, [
        {"kind": "arhive", "path": "/x"},
        {"kind": "registry"},
        {"kind": "registry", "url": "registry.lan:5000"},
        {"kind": "archive", "pth": "/x"},
        {"kind": "archive", "path": "/x", "via": "scp"},
        {"kind": "host-archive", "path": "srv/images"},
        {"kind": "host-archive", "path": "/srv"},
        {"kind": "hub", "check": "ftp://x"},
        "hub",
    ])
    assert lines == [
        "host1: image_sources[0].kind: 'arhive' is not allowed (did you mean 'archive'?); "
        "allowed: hub, registry, archive, host-archive",
        "host1: image_sources[1].url: missing; allowed: the registry's http(s) URL as the host "
        "reaches it, e.g. 'http://registry.lan:5000'",
        "host1: image_sources[2].url: 'registry.lan:5000' is not valid; allowed: an http:// or "
        "https:// URL with a host, e.g. 'http://mirror.lan:5000'",
        "host1: image_sources[3].pth: 'pth' is an unknown key (did you mean 'path'?); allowed: "
        "kind, path, via, upload_dir",
        "host1: image_sources[3].path: missing; allowed: a `docker save` .tar file or a "
        "directory of them on this (control) machine, e.g. '~/image-archive'",
        "host1: image_sources[4].via: 'scp' is not allowed; allowed: stream, upload",
        "host1: image_sources[5].path: 'srv/images' is not an absolute, normalised path; "
        "allowed: an absolute path on the host: a `docker save` .tar file or a directory of "
        "them, e.g. '/srv/images'",
        "host1: image_sources[6].path: '/srv' is a system directory; allowed: an absolute path "
        "on the host: a `docker save` .tar file or a directory of them, e.g. '/srv/images' (not "
        "a system directory)",
        "host1: image_sources[7].check: 'ftp://x' is not valid; allowed: an http:// or "
        "https:// URL with a host, e.g. 'http://mirror.lan:5000'",
        "host1: image_sources[8]: 'hub' is not a mapping; allowed: a list of mappings, each "
        "with a kind: hub, registry, archive, host-archive, e.g. [{'kind': 'hub'}, {'kind': "
        "'archive', 'path': '~/image-archive'}]",
    ]


def test_wrong_shapes_and_a_typo_of_the_key(data) -> None:
    assert errors(data, [])[0].startswith("host1: image_sources: [] is not a non-empty list")
    assert errors(data, {"kind": "hub"})[0].startswith(
        "host1: image_sources: {'kind': 'hub'} is not a list")
    with pytest.raises(HostDataError, match=r"image_source: 'image_source' is not a rigfleet "
                                            r"key \(did you mean 'image_sources'\?\)"):
        validate_host("host1", {**data, "image_source": [{"kind": "hub"}]})


def test_a_tab_in_a_host_path_is_refused(data) -> None:
    lines = errors(data, [{"kind": "host-archive", "path": "/srv/a\tb"}])
    assert lines[0].startswith("host1: image_sources[0].path: '/srv/a\\tb' ")
