"""``rigfleet status``: one row per host (``rows``), what drifted from its ``DesiredHost``
(``drift``, pure), the command (``cli``)."""
