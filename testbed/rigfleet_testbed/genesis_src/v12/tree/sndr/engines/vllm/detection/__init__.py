"""What vLLM is running: version and the Genesis allowlist."""
