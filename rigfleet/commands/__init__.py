"""Shell command builders: they return command strings and run nothing.

One module per concern (``apt``, ``docker``, ``nvidia``, ``weights``, ``probe``), in the way of
Kamal's ``Commands::*``: a role decides *when* a command runs, these modules decide *what* it
is. Every interpolated value goes through ``shlex.quote``; secrets never appear in a command
(they travel as root-only files the commands read).
"""
