"""The converge: ``pyinfra inventory/home.py deploy.py`` takes each host to serving.

Preflight validates every host's data and the pins while pyinfra prepares (a problem stops
the run before any host changes), then the roles run in order (see ``roles/__init__.py``).
A second run changes nothing; ``--dry`` shows what a run would change.
"""

from roles import converge

converge()
