"""Stand-ins for NVIDIA's driver and container-toolkit programs on simulated hosts.

Each module is one program (``smi`` is ``nvidia-smi``, ``ctk`` is ``nvidia-ctk``, ...), stdlib
only, sharing :mod:`simstate`. ``rigfleet_testbed.packages`` bundles each into a zipapp inside the
stand-in .deb packages; tests import the modules directly.
"""
