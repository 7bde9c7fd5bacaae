"""Engines SNDR patches (this fixture: vllm)."""
