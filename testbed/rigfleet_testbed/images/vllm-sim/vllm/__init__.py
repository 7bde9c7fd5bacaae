"""vLLM-compatible serving simulator (rigfleet testbed stand-in for the vLLM OpenAI image).

Only the surface that tools and people see is reproduced: ``vllm.__version__``, the
``vllm serve`` command line, its boot log and failure modes, and the OpenAI-compatible HTTP API.
The version string and any version-specific bugs are data in ``_build_info.json``, which the
image build writes from its build arguments (the real bugs are baked into the real images too).

Importing this package must stay cheap and side-effect free: Genesis' ``apply_all`` and
``pip show``-style probes import it just to read ``__version__``.
"""

from __future__ import annotations

import json
import os

_BUILD_INFO_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_build_info.json")


def _read_version() -> str:
    try:
        with open(_BUILD_INFO_PATH, encoding="utf-8") as fh:
            return str(json.load(fh)["version"])
    except (OSError, ValueError, KeyError, TypeError):
        # A broken build-info file must not make `import vllm` fail (Genesis imports us).
        return "0.0.0+unknown"


__version__: str = _read_version()
__version_tuple__ = tuple(__version__.split("+", 1)[0].split("."))

__all__ = ["__version__", "__version_tuple__"]
