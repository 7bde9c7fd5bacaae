"""The base of the errors rigfleet reports to a person (``PinsError``, ``HostDataError``, ...:
the message names where, the bad value and what is allowed); catch it to print, no traceback."""

from __future__ import annotations


class RigfleetError(Exception):
    """A problem a person can fix from the message alone (bad data, missing file, ...)."""
