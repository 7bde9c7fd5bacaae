"""The fleet endpoint: HAProxy on the hosts of group ``balancers`` (docs/balancer.md): ``plan``
makes the pools, ``haproxy`` renders the config and reads stats, ``status`` asks a balancer.
"""

from rigfleet.balancer.haproxy import HOST_PATHS, HostPaths, render_config
from rigfleet.balancer.plan import BalancerError, BalancerPlan, GpuHost, plan_balancer

__all__ = ["HOST_PATHS", "BalancerError", "BalancerPlan", "GpuHost", "HostPaths",
           "plan_balancer", "render_config"]
