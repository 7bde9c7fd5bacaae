"""A Genesis stack's derived image: its name follows what it holds; its Dockerfile installs
exactly the pinned packages from the given index on top of the pinned image (by the name the
images role staged and verified)."""

from __future__ import annotations

from rigfleet.catalog import builtin_catalog
from rigfleet.pins import GenesisPin, StackPins
from rigfleet.runtime_image import RuntimeImage

DIGEST = "sha256:" + "6a93ae43" * 8


def pins(digest: str = DIGEST) -> StackPins:
    return StackPins("tq3-mtp-genesis", "vllm/vllm-openai:v0.21.0", digest, "0.21.0",
                     GenesisPin("http://git.example/sndr.git", "a" * 40, "v12", "v12.1.0"))


def test_a_stack_without_genesis_packages_runs_its_pinned_image():
    int8 = StackPins("int8", "vllm/vllm-openai:v0.27.1", DIGEST, "0.27.1")
    assert RuntimeImage.for_stack(builtin_catalog().get("int8"), int8) is None


def test_the_name_changes_with_the_base_and_nothing_else():
    spec = builtin_catalog().get("tq3-mtp-genesis")
    img = RuntimeImage.for_stack(spec, pins())
    assert img is not None
    assert img.ref.startswith("rigfleet/tq3-mtp-genesis-runtime:6a93ae436a93-")
    assert img.base == "vllm/vllm-openai:v0.21.0"  # the staged, verified name
    assert img.packages == ("xxhash==3.5.0", "pandas==2.2.3", "scipy==1.14.1")
    other = RuntimeImage.for_stack(spec, pins("sha256:" + "1" * 64))
    assert other is not None and other.ref != img.ref
    assert RuntimeImage.for_stack(spec, pins()) == img  # deterministic


def test_the_dockerfile_installs_the_pinned_packages_from_the_index():
    img = RuntimeImage.for_stack(builtin_catalog().get("tq3-mtp-genesis"), pins())
    assert img is not None
    text = img.dockerfile("http://pypi.lan:3141/simple/")
    lines = text.splitlines()
    assert "FROM vllm/vllm-openai:v0.21.0" in lines
    run = next(ln for ln in lines if ln.startswith("RUN "))
    assert "--index-url http://pypi.lan:3141/simple/ --trusted-host pypi.lan" in run
    assert run.endswith("xxhash==3.5.0 pandas==2.2.3 scipy==1.14.1")
    assert f"io.rigfleet.base-digest={DIGEST}" in text
    assert 'io.rigfleet.runtime-packages="xxhash==3.5.0 pandas==2.2.3 scipy==1.14.1"' in text
    assert "--index-url" not in img.dockerfile(None)  # PyPI itself
