"""Code that runs ON the hosts: stdlib only, Python >= 3.10 (Ubuntu 22.04's), shipped as a
zipapp, no pip."""
