"""``rigfleet check`` (rigfleet/check.py) and the apt index reader (rigfleet/aptindex.py): every
offline problem listed at once; online, a signed apt repository read with its key and judged
by each OS's policy (a SHA-1-bound key fails Debian 13's), and the deploy's verdict (a thing
its source lacks refuses the host, an unreachable source is a warning)."""

from __future__ import annotations

import functools
import gzip
import hashlib
import lzma
import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from images_fakes import fleet_data, pins_text
from monitor_tools import need

from rigfleet.aptindex import (
    AptIndex,
    AptIndexError,
    AptUnreachable,
    read_index,
    split_clearsigned,
)
from rigfleet.catalog import BUILTIN_DIR
from rigfleet.check import (
    CHANGED,
    FOUND,
    MISSING,
    UNREACHABLE,
    Finding,
    Online,
    deploy_verdict,
    host_os,
    offline,
    online_pass,
    reacher,
)
from rigfleet.hostdata import AptRepo, validate_host
from rigfleet.inventory import InventoryHost
from rigfleet.pins import load_pins

DRIVER = ["nvidia-kernel-open-dkms", "nvidia-driver-cuda", "nvidia-smi", "nvidia-persistenced"]
TOOLKIT = ["nvidia-container-toolkit", "nvidia-container-toolkit-base",
           "libnvidia-container-tools", "libnvidia-container1"]


def _gpg(home: Path, *args: str) -> None:
    subprocess.run(["gpg", "--homedir", str(home), "--batch", "--yes", "--passphrase", "",
                    *args], check=True, capture_output=True)


LISTS = {"Packages": bytes, "Packages.gz": lambda b: gzip.compress(b, mtime=0),
         "Packages.xz": lzma.compress}


def make_repo(root: Path, name: str, packages: dict[str, list[str]], sha1: bool = False,
              lists: tuple[str, ...] = ("Packages", "Packages.gz")) -> str:
    """A signed repository at ``root/<name>`` (suite ``stable``, component ``main``), its key
    at ``root/<name>.asc``; returns the key's fingerprint."""
    home = root / f"{name}-gnupg"
    home.mkdir(mode=0o700)
    algo = ["--cert-digest-algo", "SHA1"] if sha1 else []
    _gpg(home, *algo, "--quick-gen-key", f"{name} <{name}@test>",
         "rsa2048" if sha1 else "ed25519", "sign", "never")
    out = subprocess.run(["gpg", "--homedir", str(home), "--with-colons", "--list-keys"],
                         check=True, capture_output=True, text=True).stdout
    fpr = next(line.split(":")[9] for line in out.splitlines() if line.startswith("fpr:"))
    _gpg(home, "--armor", "--output", str(root / f"{name}.asc"), "--export", fpr)
    dist = root / name / "dists" / "stable"
    binary = dist / "main" / "binary-amd64"
    binary.mkdir(parents=True)
    text = "\n".join(f"Package: {p}\nVersion: {v}\nArchitecture: amd64\n"
                     for p, versions in packages.items() for v in versions)
    for n in lists:
        (binary / n).write_bytes(LISTS[n](text.encode()))
    lines = [f" {hashlib.sha256((binary / n).read_bytes()).hexdigest()} "
             f"{(binary / n).stat().st_size} main/binary-amd64/{n}" for n in lists]
    (dist / "Release").write_text("Origin: test\nSuite: stable\nSHA256:\n" + "\n".join(lines)
                                  + "\n")
    _gpg(home, "--digest-algo", "SHA512", "--clearsign", "--output", str(dist / "InRelease"),
         str(dist / "Release"))
    _gpg(home, "--digest-algo", "SHA512", "--armor", "--detach-sign", "--output",
         str(dist / "Release.gpg"), str(dist / "Release"))
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"],
                   capture_output=True)  # the agent gpg started for this home goes with it
    return fpr


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, dict[str, str]]]:
    root = tmp_path_factory.mktemp("apt")
    fprs = {
        "new": make_repo(root, "new", {"nvidia-driver-cuda": ["590.44.01-1"],
                                       **{p: ["1.17.8-1"] for p in TOOLKIT}}),
        "old": make_repo(root, "old", {p: ["580.105.08-1", "590.44.01-1"] for p in DRIVER},
                         sha1=True),
        "xz": make_repo(root, "xz", {"nvidia-smi": ["590.44.01-1"]}, lists=("Packages.xz",)),
    }
    # The same repository serving only one of apt's two signature forms, and a forged index.
    for variant, drop in (("inline", ("Release", "Release.gpg")), ("detached", ("InRelease",)),
                          ("forged", ("Release", "Release.gpg"))):
        shutil.copytree(root / "new", root / f"new-{variant}")
        shutil.copy(root / "new.asc", root / f"new-{variant}.asc")
        fprs[f"new-{variant}"] = fprs["new"]
        for name in drop:
            (root / f"new-{variant}" / "dists" / "stable" / name).unlink()
    forged = root / "new-forged" / "dists" / "stable" / "InRelease"
    forged.write_text(forged.read_text().replace("Origin: test", "Origin: forged"))
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None  # type: ignore[method-assign]
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", root, fprs
    server.shutdown()


def repo(web: tuple[str, Path, dict[str, str]], name: str, **kw: Any) -> AptRepo:
    url, _, fprs = web
    return AptRepo(name, f"{url}/{name}", f"{url}/{name}.asc", "stable", ("main",),
                   kw.get("fingerprint", fprs[name]))


# ---- the apt index ----------------------------------------------------------------------------


def test_a_signed_index_is_read_with_its_key(web) -> None:
    index = read_index(repo(web, "old"))
    assert index.versions("nvidia-driver-cuda") == ["580.105.08-1", "590.44.01-1"]
    assert index.verifier == "gpgv"


def test_an_index_that_lists_only_packages_xz_is_read(web) -> None:
    assert read_index(repo(web, "xz")).versions("nvidia-smi") == ["590.44.01-1"]


def test_the_key_must_carry_the_configured_fingerprint(web) -> None:
    with pytest.raises(AptIndexError, match="key_fingerprint says " + "A" * 40):
        read_index(repo(web, "old", fingerprint="A" * 40))


def test_an_index_signed_by_another_key_is_refused(web) -> None:
    url, _, fprs = web
    wrong = AptRepo("x", f"{url}/old", f"{url}/new.asc", "stable", ("main",), fprs["new"])
    with pytest.raises(AptIndexError, match="does not verify"):
        read_index(wrong)


def test_a_sha1_bound_key_fails_trixies_policy_only(web) -> None:
    assert read_index(repo(web, "old"), policy="gpgv").versions("nvidia-smi")
    with pytest.raises(AptIndexError, match="SHA-1.*sqv"):
        read_index(repo(web, "old"), policy="sqv")
    # A key with SHA-512 bindings passes trixie's policy (said how it was checked).
    assert "sqv" in read_index(repo(web, "new"), policy="sqv").verifier


@pytest.mark.parametrize("verifier", ["sqv", "gpgv"])
def test_either_signature_form_is_read_and_a_forged_index_refused(web, monkeypatch,
                                                                   verifier: str) -> None:
    """Debian 13's policy with its own verifier (sqv) and without it (gpgv): an index signed
    inline only (InRelease) or detached only (Release.gpg) reads; a changed InRelease does not."""
    if verifier == "sqv":
        need("sqv", "sqv")
    else:
        which = shutil.which
        monkeypatch.setattr(shutil, "which", lambda n: None if n == "sqv" else which(n))
    for form in ("inline", "detached"):
        index = read_index(repo(web, f"new-{form}"), policy="sqv")
        assert index.versions("nvidia-driver-cuda") == ["590.44.01-1"]
        assert index.verifier.startswith(verifier)
    with pytest.raises(AptIndexError, match="rejects the signature|does not verify"):
        read_index(repo(web, "new-forged"), policy="sqv")


def test_text_after_an_inline_signature_is_refused(tmp_path) -> None:
    armored = b"-----BEGIN PGP SIGNATURE-----\n\nAAAA\n-----END PGP SIGNATURE-----\n"
    signed = (b"-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA512\n\nOrigin: x  \n- -dashed\n"
              + armored)
    # Dash-escaping undone; trailing whitespace is not signed (RFC 4880 7.1).
    assert split_clearsigned(signed, "r") == (b"Origin: x\n-dashed", armored)
    with pytest.raises(AptIndexError, match="r: text after the signature"):
        split_clearsigned(signed + b"Origin: unsigned\n", "r")
    with pytest.raises(AptIndexError, match="r: not a clear-signed index"):
        split_clearsigned(b"Origin: x\n", "r")


def test_packages_not_listed_in_the_signed_index_are_refused(web, tmp_path) -> None:
    url, root, _ = web
    packages = root / "new" / "dists" / "stable" / "main" / "binary-amd64" / "Packages.gz"
    saved = packages.read_bytes()
    packages.write_bytes(gzip.compress(b"Package: nvidia-driver-cuda\nVersion: 580.1-1\n"))
    try:
        with pytest.raises(AptIndexError, match="SHA256"):
            read_index(repo(web, "new"))
    finally:
        packages.write_bytes(saved)


def test_an_index_cut_short_is_unreachable_not_a_traceback() -> None:
    class Short(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b"-----BEGIN PGP")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Short)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        with pytest.raises(AptUnreachable, match=rf"^{url}/key.asc: cannot reach it "
                                                 r"\(IncompleteRead"):
            read_index(AptRepo("x", f"{url}/repo", f"{url}/key.asc", "stable", ("main",)),
                       timeout=5)
    finally:
        server.shutdown()


# ---- online checks ----------------------------------------------------------------------------


def settings_for(tmp_path: Path, web, cuda: str, toolkit: str = "new", **extra: Any):
    data = fleet_data(tmp_path, stack="int8", **extra)
    url, _, fprs = web
    data["apt_repos"] = {
        "cuda": {"url": f"{url}/{cuda}", "key_url": f"{url}/{cuda}.asc", "suite": "stable",
                 "components": ["main"], "key_fingerprint": fprs[cuda]},
        "nvidia-container-toolkit": {"url": f"{url}/{toolkit}", "key_url": f"{url}/{toolkit}.asc",
                                     "suite": "stable", "components": ["main"],
                                     "key_fingerprint": fprs[toolkit]},
    }
    return validate_host("rig-a", data)


def pins_at(tmp_path: Path, branch: str = "580"):
    path = tmp_path / "pins.yaml"
    text = pins_text('int8: {image: "vllm/vllm-openai:v0.27.1", digest: "sha256:'
                     + "1" * 64 + '", vllm_version: 0.27.1}\n')
    path.write_text(text.replace('branch: "580"', f'branch: "{branch}"'))
    return load_pins(path)


def test_apt_per_os_policy_found_and_missing(tmp_path, web) -> None:
    settings = settings_for(tmp_path, web, cuda="old")
    run = Online(images=False)
    bookworm = run.apt(settings, pins_at(tmp_path), ("debian", "12", "bookworm"))
    assert {f.status for f in bookworm} == {FOUND}
    assert any(f.thing == "driver 580 (debian 12)" and "nvidia-driver-cuda 580.105.08-1" in f.todo
               for f in bookworm)
    trixie = run.apt(settings, pins_at(tmp_path), ("debian", "13", "trixie"))
    driver = [f for f in trixie if f.source.startswith("cuda")]
    assert driver and {f.status for f in driver} == {MISSING}
    assert all("SHA-1" in f.todo for f in driver)


def test_a_branch_the_repository_lacks_is_missing_with_what_it_has(tmp_path, web) -> None:
    settings = settings_for(tmp_path, web, cuda="new")
    found = Online(images=False).apt(settings, pins_at(tmp_path), ("debian", "13", "trixie"))
    cuda = next(f for f in found if f.thing == "driver 580 (debian 13)")
    assert cuda.status == MISSING and "nvidia-driver-cuda (it has 590.44.01-1)" in cuda.todo
    assert "nvidia-smi (it has no version)" in cuda.todo
    assert "apt_repos.cuda" in cuda.todo
    toolkit = next(f for f in found if f.thing.startswith("container toolkit"))
    assert toolkit.status == FOUND and "nvidia-container-toolkit 1.17.8-1" in toolkit.todo


def test_a_pinned_driver_version_matches_its_debian_revisions(tmp_path, web) -> None:
    settings = settings_for(tmp_path, web, cuda="old")
    pins = pins_at(tmp_path)
    pins = replace(pins, driver_version="580.105.08")
    found = Online(images=False).apt(settings, pins, ("debian", "12", "bookworm"))
    cuda = next(f for f in found if f.thing == "driver 580.105.08 (debian 12)")
    assert cuda.status == FOUND and "nvidia-driver-cuda 580.105.08-1" in cuda.todo
    other = replace(pins, driver_version="580.105.0")  # a prefix of a version is not it
    found = Online(images=False).apt(settings, other, ("debian", "12", "bookworm"))
    assert next(f for f in found if f.thing.startswith("driver")).status == MISSING


def test_versions_a_repository_has_are_shown_in_version_order(tmp_path, web) -> None:
    class Index(Online):
        def index(self, repo: AptRepo, policy: str) -> AptIndex:
            versions = ["580.65.06-1", "580.105.08-1", "580.95.05-1", "580.82.07-1", "575.9-1"]
            return AptIndex("gpgv", {p: versions for p in DRIVER})

    settings = settings_for(tmp_path, web, cuda="old")
    found = Index(images=False).apt(settings, pins_at(tmp_path), ("debian", "12", "bookworm"))
    assert "nvidia-driver-cuda 580.105.08-1" in found[0].todo  # the newest of the branch
    other = Index(images=False).apt(settings, pins_at(tmp_path, "590"), ("debian", "12", "b"))
    assert ("nvidia-smi (it has 580.65.06-1, 580.82.07-1, 580.95.05-1, 580.105.08-1)"
            in other[0].todo)


class FakeSources(Online):
    """The model and Genesis answers given; apt as configured (the local repositories)."""

    def __init__(self, model: Finding, **kw: Any) -> None:
        super().__init__(images=False, **kw)
        self.answer = model

    def model(self, settings: Any, pins: Any) -> Finding:
        return self.answer


def test_the_deploys_verdict_refuses_missing_and_warns_unreachable(tmp_path, web) -> None:
    settings = settings_for(tmp_path, web, cuda="old")
    pins = pins_at(tmp_path)
    gone = FakeSources(Finding("model x@aaaa", "http://hub", MISSING, "no such revision"))
    refusals, warnings = deploy_verdict(settings, pins, ("debian", "12", "bookworm"), gone)
    assert refusals == ["rig-a: model x@aaaa: missing at http://hub: no such revision"]
    assert warnings == []
    away = FakeSources(Finding("model x@aaaa", "http://hub", UNREACHABLE, "cannot reach"))
    refusals, warnings = deploy_verdict(settings, pins, ("debian", "12", "bookworm"), away)
    assert refusals == [] and len(warnings) == 1 and "not checked" in warnings[0]
    moved = FakeSources(Finding("model x@aaaa", "http://hub", CHANGED, "main moved"))
    assert deploy_verdict(settings, pins, ("debian", "12", "bookworm"), moved) == ([], [])


def test_reach_rewrites_url_prefixes_only() -> None:
    reach = reacher(["http://hub.rigfleet.test:8080=http://127.0.0.1:18680"])
    assert reach("http://hub.rigfleet.test:8080/api/x") == "http://127.0.0.1:18680/api/x"
    assert reach("http://hub.rigfleet.test:80800/x") == "http://hub.rigfleet.test:80800/x"
    with pytest.raises(ValueError, match="FROM=TO"):
        reacher(["nothing"])



def test_a_bad_reach_pair_is_named_where_it_was_given(monkeypatch) -> None:
    # a RIGFLEET_REACH pair was refused as "--reach: ...", a flag the deploy does not have
    monkeypatch.setenv("RIGFLEET_REACH", "http://hub.test")
    with pytest.raises(ValueError, match=r"^RIGFLEET_REACH: 'http://hub.test' is not FROM=TO; "
                                         r"allowed: FROM=TO URL prefixes"):
        online_pass()
    monkeypatch.setenv("RIGFLEET_REACH", "http://hub.test=http://127.0.0.1:1")
    with pytest.raises(ValueError, match=r"^--reach: 'x' is not FROM=TO; allowed: FROM=TO"):
        online_pass(reach=["x"])


# ---- offline ----------------------------------------------------------------------------------


def test_host_os_key() -> None:
    assert host_os("debian 13") == [("debian", "13", "trixie")]
    assert host_os("ubuntu2404") == [("ubuntu", "24.04", "noble")]
    assert len(host_os(None)) == 4


def test_offline_lists_every_problem_at_once(tmp_path) -> None:
    pins = tmp_path / "pins.yaml"
    pins.write_text(pins_text('int8: {image: "vllm/vllm-openai:v0.27.1", digest: unresolved, '
                              'vllm_version: 0.27.1}\n').replace('"' + "a" * 40 + '"',
                                                                 "unresolved"))
    good = fleet_data(tmp_path, stack="int8", pins_file=str(pins))
    hosts = [
        InventoryHost("rig-a", ("gpu_hosts",), {**good, "power_caps_w": [999, 250]}),
        InventoryHost("rig-b", ("gpu_hosts",), {**good, "os": "centos 9", "stack": "tq3"}),
        InventoryHost("rig-c", ("gpu_hosts",), good),
    ]
    problems = offline(hosts).problems
    text = "\n".join(problems)
    assert "rig-a: power_caps_w" in text and "999" in text
    assert "rig-b: os: 'centos 9'" in text and "rig-b: stack: 'tq3'" in text
    # host data's own check names a bad os, once
    assert [p for p in problems if "rig-b: os:" in p] == [
        "rig-b: os: 'centos 9' is not valid; allowed: one of: debian 12, debian 13, ubuntu 22.04, "
        "ubuntu 24.04"]
    assert f"{pins}: stacks.int8.digest: 'unresolved'" in text
    assert f"{pins}: model.revision: 'unresolved'" in text
    assert len([p for p in problems if "stacks.int8.digest" in p]) == 1  # once, not per host



def test_a_home_of_no_such_user_is_a_problem_of_its_key_not_the_end_of_the_check(
        tmp_path) -> None:
    # Path.expanduser raised RuntimeError ("Could not determine home directory.") for
    # '~<no such user>/...': rigfleet check stopped at it, naming neither host nor key
    good = fleet_data(tmp_path, stack="int8")
    hosts = [InventoryHost("rig-a", ("gpu_hosts",), {
        **good, "stacks_dir": "~no-such-user-rf/stacks", "pins_file": "~no-such-user-rf/p.yaml"})]
    problems = offline(hosts).problems
    assert problems[0] == ("rig-a: stacks_dir: '~no-such-user-rf/stacks' is not a directory; "
                           "allowed: a directory of stack files on this (control) machine, e.g. "
                           "'inventory/stacks'")
    assert "~no-such-user-rf/p.yaml: no such file (the pins file)" in problems[1]



def test_hosts_sharing_a_pins_file_each_read_it_with_their_own_stacks(tmp_path) -> None:
    # The pins file was read once, with the first host's catalog: rig-b (no stacks_dir) came
    # out clean although its deploy refuses the pins of a stack only rig-a's stacks_dir has
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    text = (BUILTIN_DIR / "int8.yaml").read_text().replace("name: int8", "name: mine")
    (stacks / "mine.yaml").write_text(text.replace("port: 8011", "port: 8099"))
    pins = tmp_path / "pins.yaml"
    pins.write_text(pins_text("\n".join(
        f'{n}: {{image: "vllm/vllm-openai:v0.27.1", digest: "sha256:{"1" * 64}", '
        'vllm_version: 0.27.1}' for n in ("int8", "mine")) + "\n"))
    data = fleet_data(tmp_path, stack="int8", pins_file=str(pins))
    hosts = [InventoryHost("rig-a", ("gpu_hosts",), {**data, "stacks_dir": str(stacks)}),
             InventoryHost("rig-b", ("gpu_hosts",), data)]
    assert offline(hosts[:1]).problems == []
    assert offline(hosts).problems == offline(hosts[::-1]).problems == [
        f"{pins}: stacks.mine: 'mine' is not a stack in the catalog; allowed: int8, "
        "single-fp8-mtp, tq3-mtp-genesis, tq3-nomtp, turbo"]



def test_paths_that_cannot_be_looked_at_are_problems_of_their_keys(tmp_path) -> None:
    # host data names them (ENAMETOOLONG here, EACCES under a directory this user may not
    # search), but check then looked at them again itself: OSError ended it, listing nothing
    good = fleet_data(tmp_path, stack="int8")
    hosts = [InventoryHost("rig-a", ("gpu_hosts",), {**good, "stacks_dir": "s" * 300,
                                                     "pins_file": "p" * 300})]
    problems = offline(hosts).problems
    assert problems[0].startswith("rig-a: stacks_dir: 'sss")
    assert "cannot be read (File name too long)" in problems[0]
    assert problems[1].endswith("p" * 300 + ": cannot be read (File name too long)")


def test_a_clean_inventory_has_no_problem(tmp_path) -> None:
    pins = tmp_path / "pins.yaml"
    pins.write_text(pins_text('int8: {image: "vllm/vllm-openai:v0.27.1", digest: "sha256:'
                              + "1" * 64 + '", vllm_version: 0.27.1}\n'))
    data = fleet_data(tmp_path, stack="int8", pins_file=str(pins), stacks=["int8"])
    checked = offline([InventoryHost("rig-a", ("gpu_hosts",), data)])
    assert checked.problems == []
    settings, host_pins, oses = checked.hosts["rig-a"]
    assert settings.name == "rig-a" and host_pins.stacks["int8"].digest.endswith("1" * 64)
    assert replace(settings).stack == "int8" and len(oses) == 4


def test_the_deploy_refuses_an_os_key_that_is_not_the_hosts() -> None:
    from rigfleet.check import os_disagrees

    trixie = ("debian", "13", "trixie")
    assert os_disagrees("h", None, trixie) is None
    assert os_disagrees("h", "debian 13", trixie) is None
    assert os_disagrees("h", "debian 12", trixie) == (
        "h: os: 'debian 12', but the host runs debian 13 (trixie); allowed: the OS the host "
        "runs (or no os key)")


def repos_data(settings) -> dict[str, dict]:
    """Host data ``apt_repos`` for the repositories ``settings`` hold."""
    return {k: {"url": r.url, "key_url": r.key_url, "suite": r.suite,
                "components": list(r.components), "key_fingerprint": r.key_fingerprint}
            for k, r in settings.apt_repos.items()}


def test_verify_pins_names_the_thing_its_source_and_the_hosts(tmp_path, web) -> None:
    from rigfleet.check import verify_pins

    settings = settings_for(tmp_path, web, cuda="new")
    pins = pins_at(tmp_path)
    data = fleet_data(tmp_path, stack="int8", pins_file=str(pins.path), os="debian 13",
                      apt_repos=repos_data(settings))
    hosts = [InventoryHost("rig-a", ("gpu_hosts",), data),
             InventoryHost("rig-b", ("gpu_hosts",), data)]
    there = FakeSources(Finding("model x@aaaa", "http://hub", FOUND))
    refusals, warnings = verify_pins(hosts, pins, there)
    assert warnings == [] and len(refusals) == 1  # the 580 driver, for Debian 13 only
    assert refusals[0].startswith("driver 580 (debian 13): missing at cuda http://127.0.0.1:")
    assert refusals[0].endswith("(hosts: rig-a, rig-b)")


class TagRegistry:
    """A registry holding ``digests`` (and ``tags``: tag -> digest) for any repository."""

    def __init__(self, url: str, digests: set[str], tags: dict[str, str]) -> None:
        self.url, self.digests, self.tags = url, digests, tags

    def digest(self, repo: str, ref: str) -> str:
        from rigfleet.registry import RegistryNotFound

        if ref in self.digests:
            return ref
        if ref in self.tags:
            return self.tags[ref]
        raise RegistryNotFound(f"registry {self.url}: {repo}@{ref}: not found")

    def resolve(self, repo: str, ref: str) -> Any:
        from rigfleet.registry import RegistryError

        raise RegistryError("sizes are not asked here")


def test_images_found_changed_and_missing_with_each_source_tried(tmp_path) -> None:
    from rigfleet.images.plan import WantedImage

    pinned, moved = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    data = fleet_data(tmp_path, stack="int8", bump_registry="http://mirror.lan:5000",
                      image_sources=[{"kind": "registry", "url": "http://lan:5000"},
                                     {"kind": "hub"}])
    settings = validate_host("rig-a", data)
    w = WantedImage("vllm/vllm-openai:v0.27.1", pinned, None, ("int8",))

    def run_with(digests: set[str], tags: dict[str, str]) -> Finding:
        return Online(registry=lambda url, timeout: TagRegistry(url, digests, tags)).image(
            w, settings)

    found = run_with({pinned}, {"v0.27.1": pinned})
    assert found.status == FOUND and found.source == "registry http://lan:5000"
    changed = Online(registry=lambda url, t: TagRegistry(url, {pinned} if "mirror" in url
                                                         else set(), {"v0.27.1": moved}))
    f = changed.image(w, settings)
    assert f.status == CHANGED and f.source == "hub" and moved[:19] in f.todo
    gone = run_with(set(), {"v0.27.1": moved})
    assert gone.status == MISSING
    assert "registry http://lan:5000: " in gone.source and "hub: " in gone.source
    assert "http://mirror.lan:5000" in gone.source  # where the hub source was checked


def test_the_bump_refuses_a_plan_whose_pins_a_source_lacks(tmp_path, web) -> None:
    from types import SimpleNamespace

    from rigfleet.bump.cli import refuse_missing
    from rigfleet.bump.decide import BumpError

    settings = settings_for(tmp_path, web, cuda="old")
    pins = pins_at(tmp_path)
    data = fleet_data(tmp_path, stack="int8", pins_file=str(pins.path), os="debian 12",
                      apt_repos=repos_data(settings))
    inputs = SimpleNamespace(pins=pins, hosts=[InventoryHost("rig-a", ("gpu_hosts",), data)])
    plan = SimpleNamespace(new_stacks={})
    there = FakeSources(Finding("model x@aaaa", "http://hub", FOUND))
    refuse_missing(inputs, plan, there)  # type: ignore[arg-type]
    gone = FakeSources(Finding("model x@aaaa", "http://hub", MISSING, "no such revision"))
    with pytest.raises(BumpError, match=r"model x@aaaa: missing at http://hub: no such "
                                        r"revision \(hosts: rig-a\)\nnothing changed"):
        refuse_missing(inputs, plan, gone)  # type: ignore[arg-type]


def test_offline_checks_a_cache_host_as_its_preflight_does(tmp_path) -> None:
    key = tmp_path / "cache-key"
    key.write_text("k" * 32 + "\n")
    key.chmod(0o600)
    # Also the fleet's monitor: its Prometheus holds 9090.
    cache = InventoryHost("cache1", ("caches", "monitors"), {
        "api_key_file": str(key), "cache_registry_port": 9090, "cache_adress": "x"})
    problems = "\n".join(offline([cache]).problems)
    assert "cache1: cache_registry_port: 9090 is taken by another service of this host" in problems
    assert "did you mean 'cache_address'?" in problems


def test_the_online_pass_asks_each_source_with_the_timeout_given(tmp_path, monkeypatch) -> None:
    import argparse

    import rigfleet.check as check
    import rigfleet.cliargs as cliargs

    data = fleet_data(tmp_path, stack="int8", stacks=["int8"])
    monkeypatch.setattr(cliargs, "fleet_hosts",
                        lambda args: [InventoryHost("rig-a", ("gpu_hosts",), data)])
    seen: list[tuple[float, str, str]] = []
    monkeypatch.setattr(Online, "host", lambda self, *a: seen.append(
        (self.timeout, self.reach("http://hub.test/api"), self.reach("http://apt.test/k"))))
    # RIGFLEET_REACH is read as the deploy's preflight reads it, --reach added to it.
    monkeypatch.setenv("RIGFLEET_REACH", "http://hub.test=http://127.0.0.1:1")
    parser = argparse.ArgumentParser()
    check.add_parser(parser.add_subparsers())
    hub, apt = "http://127.0.0.1:1/api", "http://apt.test/k"
    for argv, want in ((["check", "--online", "--json"], (10.0, hub, apt)),
                       (["check", "--online", "--json", "--timeout", "3", "--reach",
                         "http://apt.test=http://127.0.0.1:2"], (3.0, hub, "http://127.0.0.1:2/k"))):
        args = parser.parse_args(argv)
        args.func(args)
        assert seen.pop() == want


@pytest.fixture
def answering() -> Iterator[tuple[str, list[int]]]:
    """A server answering every request with the first status of its list (an empty body)."""
    codes = [404]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(codes[0])
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_HEAD = do_GET

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", codes
    server.shutdown()


def test_a_rate_limited_or_failing_registry_is_unreachable_not_missing(tmp_path,
                                                                       answering) -> None:
    from rigfleet.images.plan import WantedImage

    url, codes = answering
    settings = validate_host("rig-a", fleet_data(tmp_path, stack="int8", image_sources=[
        {"kind": "registry", "url": url}]))
    w = WantedImage("vllm/vllm-openai:v0.27.1", "sha256:" + "1" * 64, None, ("int8",))
    for code, status in ((404, MISSING), (429, UNREACHABLE), (503, UNREACHABLE),
                         (500, UNREACHABLE)):
        codes[0] = code
        f = Online(timeout=5).image(w, settings)
        assert f.status == status, (code, f)
        assert f"HTTP {code}" in f.source


def test_a_rate_limited_or_failing_hub_is_unreachable_not_missing(tmp_path, answering) -> None:
    from rigfleet.pins import ModelPin

    url, codes = answering
    settings = validate_host("rig-a", fleet_data(tmp_path, stack="int8", hf_endpoint=url))
    m = ModelPin("org/model", "a" * 40, "/srv/models/model")
    for code, status in ((404, MISSING), (429, UNREACHABLE), (503, UNREACHABLE)):
        codes[0] = code
        f = Online(timeout=5).model(settings, m)
        assert f.status == status, (code, f)
