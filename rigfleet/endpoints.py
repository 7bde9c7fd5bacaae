"""``rigfleet endpoints``: ask every host's front, and each balancer once per stack, for a short
answer (over HTTPS trusting only the host data's CA where the front has TLS).
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

from rigfleet.balancer.plan import fleet_plan, url_host
from rigfleet.balancer.status import balancer_url
from rigfleet.errors import RigfleetError
from rigfleet.hostdata import BalancerSettings, FrontTls, HostSettings, validate_host
from rigfleet.hostside.verify.client import tls_context
from rigfleet.inventory import InventoryHost
from rigfleet.validate import secret_text


@dataclass(frozen=True)
class EndpointCheck:
    host: str
    url: str
    status: int | str
    model: str
    answer: str
    seconds: float


def front_url(host: InventoryHost, settings: HostSettings) -> str:
    """The host's serving endpoint: ``front_url`` in host data, else ssh host + front port."""
    if settings.front_url:
        return settings.front_url.rstrip("/")
    return f"{settings.front_scheme}://{url_host(host.ssh_target[0])}:{settings.front_port}"


def front_context(tls: FrontTls | None) -> ssl.SSLContext | None:
    """The TLS context clients of a front (or balancer) with ``tls`` use (None: the defaults)."""
    return tls_context(tls.ca_file) if tls else None


def read_key(settings: HostSettings | BalancerSettings) -> str:
    return secret_text(settings.api_key_file)


def chat(url: str, key: str, prompt: str, model: str, timeout: float = 60,
         context: ssl.SSLContext | None = None) -> dict:
    body = json.dumps({"model": model,
                       "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": 40, "temperature": 0}).encode()
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json",
                                          "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
        return json.load(resp)


QUESTION = "What is the capital of France? One short sentence."


def ask(name: str, url: str, key: str, context: ssl.SSLContext | None, model: str,
        timeout: float = 60) -> EndpointCheck:
    """One short question to ``url`` for ``model``; never raises (the row says what happened)."""
    started = time.monotonic()
    try:
        reply = chat(url, key, QUESTION, model, timeout=timeout, context=context)
        text = reply["choices"][0]["message"].get("content") or ""
        return EndpointCheck(name, url, 200, reply.get("model", ""), text.strip(),
                             time.monotonic() - started)
    except urllib.error.HTTPError as exc:
        return EndpointCheck(name, url, exc.code, "", exc.reason, time.monotonic() - started)
    except (OSError, KeyError, ValueError) as exc:
        return EndpointCheck(name, url, "down", "", str(exc), time.monotonic() - started)


def check(host: InventoryHost, timeout: float = 60) -> EndpointCheck:
    try:
        settings = validate_host(host.name, host.data)
        key = read_key(settings)
    except (RigfleetError, OSError) as exc:
        return EndpointCheck(host.name, "-", "bad data", "", str(exc), 0.0)
    return ask(host.name, front_url(host, settings), key, front_context(settings.front_tls),
               settings.spec.served_model_name, timeout)


def check_balancer(lb: InventoryHost, hosts: Sequence[InventoryHost],
                   timeout: float = 60) -> list[EndpointCheck]:
    """Ask balancer ``lb`` one short question per stack (``/stacks/<stack>``)."""
    try:
        plan = fleet_plan(lb, hosts)
        key = read_key(plan.settings)
    except (RigfleetError, OSError) as exc:
        return [EndpointCheck(lb.name, "-", "bad data", "", str(exc), 0.0)]
    base = balancer_url(plan, lb)
    context = front_context(plan.settings.tls)
    return [ask(lb.name, f"{base}{pool.prefix}", key, context, pool.served_model_name, timeout)
            for pool in plan.pools]
