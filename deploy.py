"""The converge: ``pyinfra inventory/home.py deploy.py`` takes each host to serving.

Preflight validates every host's data, the pins and the host's facts while pyinfra prepares
(so ``-y`` and the prompt check the same). A host that fails it gets one failing operation
instead of the roles (nothing changes on it), the other hosts go on, and the run ends
non-zero listing the refused hosts and why; ``--data rigfleet_stop_on_preflight=1`` (or
``RIGFLEET_STOP_ON_PREFLIGHT=1``) stops the whole run instead. Then the roles run in order
(see ``roles/__init__.py``). A second run changes nothing; ``--dry`` shows what a run would
change.
"""

from roles import converge
from roles.preflight import run_deploy

run_deploy(converge)
