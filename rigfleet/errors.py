"""The base of the errors rigfleet reports to a person: each concern raises its own subclass
(``PinsError``, ``HostDataError``, ...) whose message names where the problem is, the bad value
and what would be allowed; catch ``RigfleetError`` to print any of them without a traceback.
"""

from __future__ import annotations


class RigfleetError(Exception):
    """A problem a person can fix from the message alone (bad data, missing file, ...)."""
