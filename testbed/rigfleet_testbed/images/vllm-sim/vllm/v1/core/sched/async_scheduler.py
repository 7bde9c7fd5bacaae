"""Async scheduler: source text only (rigfleet serving simulator)."""


class AsyncScheduler:
    def _update_after_schedule(self, scheduler_output):
        for req_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
            self.requests[req_id].num_output_placeholders += num_tokens
