"""The fleet endpoint: HAProxy on the hosts of inventory group ``balancers``.

By concern: ``plan`` makes the pools (one per stack) from the inventory's GPU hosts (pure),
``haproxy`` renders HAProxy's config and reads its runtime stats (pure), ``status`` asks a
balancer over SSH which hosts are in rotation. ``roles/balancer.py`` deploys it;
docs/balancer.md explains the settings.

    plan = plan_balancer("lb1", settings, gpu_hosts)
    render_config(plan)
"""

from rigfleet.balancer.haproxy import HOST_PATHS, HostPaths, render_config
from rigfleet.balancer.plan import BalancerError, BalancerPlan, GpuHost, plan_balancer

__all__ = ["HOST_PATHS", "BalancerError", "BalancerPlan", "GpuHost", "HostPaths",
           "plan_balancer", "render_config"]
