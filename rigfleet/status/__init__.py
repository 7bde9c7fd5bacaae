"""Fleet status: one row per host, what it runs and whether it drifted from inventory + pins.

``rows`` probes hosts and builds the rows, ``drift`` decides what differs from the host's
``DesiredHost`` (pure), ``render`` prints them, ``cli`` is the command::

    render_table(fleet_status(load_inventory("inventory/home.py"))).print(Console())
"""
