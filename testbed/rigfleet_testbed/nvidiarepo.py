"""NVIDIA's apt repositories as the twin serves them, and the inventory data that names them.

The CUDA repositories, one per distribution NVIDIA publishes (``aptrepo.CUDA_BRANCHES``: the
driver branches each carries, debian13 without 580; ``aptrepo.CUDA_KEY_OF``: the key each is
signed with, debian13's a new one), and the container toolkit's, built from the stand-in
.debs under the services container's apt web root. :func:`apt_repos_data` gives the testbed
inventory's ``apt_repos.cuda`` and ``apt_repos.nvidia-container-toolkit`` in the shape of
inventory/group_data/all.py's: only host names and the stand-in keys' fingerprints differ::

    build_nvidia_repos(Path(".testbed/debs"), Path(".testbed/services/apt"), gnupg)
    apt_repos_data(gnupg)["cuda"]["per_distro"]["debian13"]["key_fingerprint"]
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from rigfleet_testbed import aptrepo, layout, packages


def build_nvidia_repos(debs: Path, web: Path, gnupg: Path) -> dict[str, aptrepo.RepoInfo]:
    """Build the stand-in .debs into ``debs`` and every NVIDIA repository under ``web``.

    Returns each repository by name (``debian13``, ..., ``toolkit``).
    """
    packages.build_all(debs)
    # The single repository of earlier testbeds (one suite and key for everything) is gone.
    shutil.rmtree(web / "debian", ignore_errors=True)
    for old in ("rigfleet-testbed.asc", "rigfleet-testbed.gpg"):
        (web / old).unlink(missing_ok=True)
    out = {}
    for distro, branches in aptrepo.CUDA_BRANCHES.items():
        driver_debs = [debs / p.filename for v in packages.DRIVER_VERSIONS
                       if packages.upstream(v).split(".")[0] in branches
                       for p in packages.driver_packages(v)]
        out[distro] = aptrepo.build_repo(web, gnupg, driver_debs, aptrepo.nvidia_layout(distro))
    toolkit_debs = [debs / p.filename for v in packages.TOOLKIT_VERSIONS
                    for p in packages.toolkit_packages(v)]
    out["toolkit"] = aptrepo.build_repo(web, gnupg, toolkit_debs, aptrepo.TOOLKIT_LAYOUT)
    return out


def _fingerprint(gnupg: Path, repo: aptrepo.RepoLayout) -> str:
    return aptrepo.ensure_key(gnupg, repo.key_uid, repo.key_algo, repo.cert_digest)


def apt_repos_data(gnupg: Path) -> dict[str, dict[str, Any]]:
    """The inventory's NVIDIA ``apt_repos`` entries (keys generated if missing)."""
    base = layout.CUDA_APT_BASE
    new_key = aptrepo.CUDA_KEY_OF["debian13"]
    return {
        "cuda": {
            "url": f"{base}/{{distro}}/x86_64/",
            "key_url": f"{base}/{{distro}}/x86_64/{aptrepo.OLD_CUDA_KEY}.pub",
            "suite": "/", "components": [],
            "key_fingerprint": _fingerprint(gnupg, aptrepo.nvidia_layout("debian12")),
            "per_distro": {"debian13": {
                "key_url": f"{base}/debian13/x86_64/{new_key}.pub",
                "key_fingerprint": _fingerprint(gnupg, aptrepo.nvidia_layout("debian13")),
            }},
        },
        "nvidia-container-toolkit": {
            "url": f"{layout.TOOLKIT_APT_BASE}/stable/deb/$(ARCH)",
            "key_url": f"{layout.TOOLKIT_APT_BASE}/gpgkey",
            "suite": "/", "components": [],
            "key_fingerprint": _fingerprint(gnupg, aptrepo.TOOLKIT_LAYOUT),
        },
    }
