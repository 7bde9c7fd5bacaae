"""vLLM's image tags and versions: which tag is a release (``vX.Y.Z``), which a nightly
(``nightly-<40-hex>``), and their order; moving tags and variants are neither::

    tag_kind("v0.27.1")                       # "release"
    tag_kind("nightly-" + "0" * 40)           # "nightly"
    tag_kind("latest")                        # None
    version_key("0.20.2rc1.dev9+g01d4d1ad3") < version_key("0.20.2")   # True
"""

from __future__ import annotations

import re

from packaging.version import InvalidVersion, Version

NIGHTLY_TAG = re.compile(r"nightly-(?P<sha>[0-9a-f]{40})")
# v0.27.1, v0.10.1.1, v0.8.5.post1; release candidates and variants are not releases.
RELEASE_TAG = re.compile(r"v(?P<version>\d+\.\d+\.\d+(?:\.\d+)?(?:\.post\d+)?)")
RELEASE, NIGHTLY = "release", "nightly"
TAG_KINDS = (RELEASE, NIGHTLY)


def tag_kind(tag: str) -> str | None:
    """``release`` for ``vX.Y.Z``, ``nightly`` for ``nightly-<40-hex>``, None otherwise."""
    return RELEASE if RELEASE_TAG.fullmatch(tag) else (
        NIGHTLY if NIGHTLY_TAG.fullmatch(tag) else None)


def version_key(version: str) -> Version | None:
    """An order for vLLM versions (PEP 440; a leading ``v`` ignored); None for what is not one."""
    try:
        return Version(version.strip().removeprefix("v"))
    except InvalidVersion:
        return None


def is_release(version: str) -> bool:
    """``0.21.0`` is a release version; ``0.20.2rc1.dev9+g01d4d1ad3`` is not."""
    return RELEASE_TAG.fullmatch(f"v{version}") is not None
