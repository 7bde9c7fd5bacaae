"""``vllm`` command line."""
