"""The converge: ``pyinfra inventory/home.py deploy.py`` takes each host to serving.

Preflight validates every host's data and the pins while pyinfra prepares (a problem stops
the run before any host changes), then the roles run in order (see ``roles/__init__.py``).
A second run changes nothing; ``--dry`` shows what a run would change.
"""

from pyinfra.api.exceptions import PyinfraError

from rigfleet.errors import RigfleetError
from roles import converge

try:
    converge()
except RigfleetError as error:
    # A data problem (host data, pins, OS, a power cap out of range): the message names the
    # host, key, value and what is allowed; pyinfra prints it without a traceback and stops
    # before any host changes.
    raise PyinfraError(f"rigfleet preflight refused the run:\n{error}") from None
