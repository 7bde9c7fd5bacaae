"""TurboQuant KV-cache attention backend: source text only (rigfleet serving simulator).

The simulator runs no kernels. Files like this one stand where vLLM's sources are so that tools
which text-patch vLLM (Genesis) find their anchors and leave their ``[Genesis <id>]`` markers in
the container's writable layer; the simulator reads those markers at boot
(``vllm.sim.buildinfo.load_genesis_state``). This is the form of builds with hybrid-model
support (vllm#39931, from 0.20.2rc1.dev60).
"""


class TurboQuantAttentionImpl:
    def validate_configuration(self, layer_types):
        # Hybrid models: only the full-attention layers hold a quantized KV cache.
        self.quantized_layers = [i for i, t in enumerate(layer_types) if t == "full_attention"]

    def forward_verify(self, query, kv_cache, metadata):
        # Spec-decode verify: the K+1 query tokens go through the decode kernel one by one.
        return self.decode_single_query(query, kv_cache, metadata)

    def decode_bounds(self, metadata):
        return metadata.seq_lens
