"""TurboQuant KV-cache attention backend: source text only (rigfleet serving simulator).

The form of builds before vllm#39931 (0.20.2rc1.dev60): hybrid models are refused. Genesis P4
text-patches the refusal away; the simulator reads the marker it leaves.
"""


class TurboQuantAttentionImpl:
    def validate_configuration(self, layer_types):
        if any(t != "full_attention" for t in layer_types):
            raise NotImplementedError("TurboQuant KV cache is not supported for hybrid models")
        self.quantized_layers = list(range(len(layer_types)))

    def forward_verify(self, query, kv_cache, metadata):
        # Spec-decode verify: the K+1 query tokens go through the decode kernel one by one.
        return self.decode_single_query(query, kv_cache, metadata)

    def decode_bounds(self, metadata):
        return metadata.seq_lens
