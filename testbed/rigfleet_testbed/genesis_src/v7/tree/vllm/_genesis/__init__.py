"""Genesis: runtime patches for vLLM (Qwen3.6 hybrid models, TurboQuant KV, MTP spec-decode).

Lives inside the vllm package as ``vllm._genesis`` (mounted read-only into the container at
``.../dist-packages/vllm/_genesis``) and is applied before ``vllm serve`` by::

    python3 -m vllm._genesis.patches.apply_all

or by the ``genesis_v7`` vLLM general plugin (``tools/genesis_vllm_plugin``).
"""

from .__version__ import VERSION

__version__ = VERSION
