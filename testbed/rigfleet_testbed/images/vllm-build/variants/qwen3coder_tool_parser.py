"""qwen3_coder tool parser: source text only (rigfleet serving simulator).

Present in builds before the streaming parser refactor (vllm#45413/#45171/#45588, merged
2026-06-15), which deleted this file.
"""


class Qwen3CoderToolParser:
    def extract_tool_calls_streaming(self, delta_text, current_token_ids):
        if self.tool_call_start_token_id in current_token_ids:
            self.is_tool_call_started = True
        tool_call_index = self.last_tool_call_index
        return self.stream_arguments(delta_text, tool_call_index)
