"""vLLM version order (``rigfleet.vllm_versions.version_key``, PEP 440 via packaging): release
candidates, dev builds, post releases and the nightlies' ``X.Y.Zrc1.devN+g<sha>`` shape."""

from __future__ import annotations

import pytest

from rigfleet.bump.candidate import newest_release, release_tags
from rigfleet.catalog import ImageRule
from rigfleet.vllm_versions import version_key

ORDERED = [
    "0.20.1",
    "0.20.2rc1.dev9+g01d4d1ad3",
    "0.20.2rc1.dev129+g1acd67a79",
    "0.20.2rc1",
    "0.20.2rc2",
    "0.20.2",
    "0.20.2.post1",
    "0.20.2.post2",
    "0.20.3.dev1",
    "0.20.3",
    "0.21.0",
    "0.32.1rc1.dev453+gaaaaaaaaa",
    "0.32.1rc1.dev860+gbbbbbbbbb",
]


@pytest.mark.parametrize("i", range(len(ORDERED) - 1))
def test_each_version_sorts_below_the_next(i):
    low, high = version_key(ORDERED[i]), version_key(ORDERED[i + 1])
    assert low is not None and high is not None
    assert low < high, (ORDERED[i], ORDERED[i + 1])


def test_release_candidates_are_not_equal():
    # The hand-written order had rc1 == rc2.
    assert version_key("0.21.0rc1") != version_key("0.21.0rc2")
    assert version_key("0.21.0rc1") < version_key("0.21.0rc2") < version_key("0.21.0")


def test_a_leading_v_and_four_part_releases():
    assert version_key("v0.27.1") == version_key("0.27.1")
    assert version_key("0.10.1") < version_key("0.10.1.1") < version_key("0.10.2")


@pytest.mark.parametrize("bad", ["", "latest", "nightly", "0.20.x", "v", "1.2.3 4"])
def test_what_is_not_a_version_has_no_key(bad):
    assert version_key(bad) is None


def test_release_tags_sort_by_version_not_by_text():
    tags = ["v0.9.0", "v0.10.0", "v0.8.5.post1", "v0.8.5", "nightly-" + "0" * 40, "latest"]
    assert release_tags(tags) == ["v0.8.5", "v0.8.5.post1", "v0.9.0", "v0.10.0"]


def test_newest_release_above_a_release_candidate():
    tags = ["v0.21.0", "v0.22.0"]
    assert newest_release(tags, above="0.22.0rc2") == "v0.22.0"
    assert newest_release(tags, above="0.22.0") is None
    assert newest_release(tags, above="0.22.0.post1") is None


def test_image_rule_range_with_dev_and_post_builds():
    rule = ImageRule(kinds=("release", "nightly"), min_version="0.22.0", below_version="0.24.0")
    assert not rule.allows_version("0.22.0rc1")
    assert rule.allows_version("0.22.0")
    assert rule.allows_version("0.23.0.post1")
    assert not rule.allows_version("0.24.0")
    assert rule.allows_version("0.24.0rc1.dev5+gabcdef012")  # a dev build of 0.24 is below it
