"""The simulated fleet: a digital twin of dual-RTX-3090 hosts on one machine.

Hosts are containers with systemd and sshd, reached by pyinfra over real SSH; NVIDIA software,
the vLLM image, the Hugging Face hub and the Genesis repository are stand-ins that behave like
the real ones, failures included. See docs/architecture.md.
"""
