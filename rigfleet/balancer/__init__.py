"""The fleet endpoint: HAProxy on the hosts of group ``balancers`` (docs/balancer.md): ``plan``
makes the pools, ``haproxy`` renders the config and reads stats, ``status`` asks a balancer.
"""
