"""The fleet's pinned images on the hosts and in saved copies (docs/images.md)."""
