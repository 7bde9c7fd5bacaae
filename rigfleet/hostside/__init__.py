"""Code that runs ON the hosts: stdlib only, Python >= 3.11 (shipped as a zipapp, no pip)."""
