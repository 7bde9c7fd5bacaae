"""Fleet status (``rigfleet status``): one row per host, what it runs and whether it drifted
from inventory + pins. ``rows`` probes the hosts and builds the rows, ``drift`` decides what
differs from the host's ``DesiredHost`` (pure), ``cli`` is the command and prints them.
"""
