"""``rigfleet status``: a row per host (``rows``), its drift from the inventory (``drift``)."""
