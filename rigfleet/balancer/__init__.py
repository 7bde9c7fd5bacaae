"""The fleet endpoint: HAProxy on the hosts of group ``balancers`` (docs/balancer.md)."""
