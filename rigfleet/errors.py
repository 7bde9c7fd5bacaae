"""The base of the errors rigfleet reports to a person.

Each concern raises its own subclass (``PinsError``, ``HostDataError``, ``CatalogError``) whose
message is meant to be printed as is: it names where the problem is, the bad value and what
would be allowed. Catch ``RigfleetError`` to report any of them without a traceback::

    try:
        pins = load_pins("pins.yaml")
    except RigfleetError as e:
        raise SystemExit(str(e))
"""

from __future__ import annotations


class RigfleetError(Exception):
    """A problem a person can fix from the message alone (bad data, missing file, ...)."""
