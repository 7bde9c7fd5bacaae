"""Fleet metrics on the control side: metric names, the monitor's Prometheus API, the HTML page."""
