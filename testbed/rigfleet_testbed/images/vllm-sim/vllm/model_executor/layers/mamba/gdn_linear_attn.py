"""Gated DeltaNet linear attention: source text only (rigfleet serving simulator)."""


class GatedDeltaNetAttention:
    def forward_decode(self, hidden_states, state, metadata):
        state = self.recurrent_update(hidden_states, state, metadata.num_accepted_tokens)
        return self.out_proj(state.output)

    def forward_prefill(self, hidden_states, state, metadata):
        chunks = self.chunk(hidden_states, metadata.chunk_size)
        return self.scan(chunks, state)

    def state_dtype(self, model_dtype):
        return model_dtype
