"""Fleet metrics on the control side: the metric-name table (``names``), the monitor's
Prometheus API reached over SSH (``query``) and the self-contained HTML page (``page``)."""
