"""VllmConfig cudagraph sizing: source text only (rigfleet serving simulator).

Genesis P66 text-patches the capture-size computation; with its marker here
the simulator logs the sizes the filter keeps and removes, as the patched code does.
"""


class VllmConfig:
    def _set_cudagraph_sizes(self, cudagraph_capture_sizes, max_num_tokens):
        cudagraph_capture_sizes = sorted(s for s in cudagraph_capture_sizes if s <= max_num_tokens)
        self.compilation_config.cudagraph_capture_sizes = cudagraph_capture_sizes
