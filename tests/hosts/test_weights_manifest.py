"""Weights: the manifest is for the pinned model revision and every file still matches it.

``--weights-check sha256`` (default) hashes every file on the host and compares with the
sha256 the fetcher verified against the hub; ``stat`` compares size and mtime only.

    pytest tests/hosts/test_weights_manifest.py --inventory inventory/home.py
"""

from __future__ import annotations

import json
import shlex

import pytest

from rigfleet.hostside.layout import MANIFEST_NAME


@pytest.fixture(scope="module")
def manifest(host, rig) -> dict:
    path = f"{rig.want.model_path}/{MANIFEST_NAME}"
    f = host.file(path)
    if not f.exists:
        pytest.fail(
            f"{rig.name}: {path} is missing: the weights were never verified here", pytrace=False
        )
    try:
        data = json.loads(f.content_string)
        assert isinstance(data.get("files"), dict) and data["files"]
    except (ValueError, AssertionError, AttributeError):
        pytest.fail(f"{rig.name}: {path} is not a manifest with files", pytrace=False)
    return data


def test_manifest_is_for_the_pinned_revision(rig, manifest, fail_if):
    model = rig.want.pins.model
    problems = []
    if manifest.get("repo") != model.repo:
        problems.append(f"manifest repo is {manifest.get('repo')}, pins model.repo is {model.repo}")
    if manifest.get("revision") != model.revision:
        problems.append(
            f"manifest revision is {manifest.get('revision')}, pins model.revision "
            f"is {model.revision}"
        )
    fail_if(f"weights in {rig.want.model_path}", problems)


def test_every_file_matches_the_manifest(host, rig, manifest, weights_check, fail_if):
    files: dict[str, dict] = manifest["files"]
    names = sorted(files)
    d = shlex.quote(rig.want.model_path)
    quoted = " ".join(shlex.quote(n) for n in names)
    # One round trip: size and mtime of every listed file (missing ones print nothing).
    listing = host.run(f"cd {d} && stat -c '%s\t%.6Y\t%n' -- {quoted} 2>/dev/null; true")
    seen: dict[str, tuple[int, float]] = {}
    for line in listing.stdout.splitlines():
        size, mtime, name = line.split("\t", 2)
        seen[name] = (int(size), float(mtime))
    problems = []
    for name in names:
        meta = files[name]
        if name not in seen:
            problems.append(f"{name} is missing")
        elif seen[name][0] != meta.get("size"):
            problems.append(f"{name} has {seen[name][0]} bytes, manifest says {meta.get('size')}")
        elif weights_check == "stat" and abs(seen[name][1] - float(meta.get("mtime", 0))) > 0.001:
            problems.append(f"{name} was modified after it was verified (mtime differs)")
    if weights_check == "sha256":
        present = " ".join(shlex.quote(n) for n in names if n in seen)
        sums = host.run(f"cd {d} && sha256sum -- {present}") if present else None
        got = {}
        for line in (sums.stdout if sums else "").splitlines():
            digest, _, name = line.partition("  ")
            got[name.strip()] = digest.strip()
        for name in names:
            if name in seen and seen[name][0] == files[name].get("size"):
                want = files[name].get("sha256")
                if got.get(name) != want:
                    problems.append(f"{name} sha256 is {got.get(name)}, manifest says {want}")
    fail_if(f"weights in {rig.want.model_path} differ from {MANIFEST_NAME}", problems)
