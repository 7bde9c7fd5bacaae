"""The testbed's "services" container: apt repositories, Hugging Face-compatible hub, Genesis git.

One process, three listeners (threads), stdlib only (Python 3.11-3.13)::

    python3 -m services --data /srv/testbed

- port 80:   static files of ``<data>/apt`` (the signed apt repositories: NVIDIA's at
             ``/compute/cuda/repos/<distro>/x86_64/`` and ``/libnvidia-container/...``,
             Docker's at ``/linux/debian/...``), see :mod:`services.static`;
- port 8080: a Hugging Face Hub look-alike serving the fixture repos under ``<data>/hub``
             (layout in :mod:`services.hubstore`), with fault injection under ``/_testbed/faults``,
             see :mod:`services.hub`;
- port 8090: git's "dumb HTTP" protocol for the bare repositories under ``<data>/git``.

Every request is logged on stderr (and ``--log FILE``) without credential values.
"""

__all__ = ["__version__"]

__version__ = "1.0.0"
