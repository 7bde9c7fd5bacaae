"""Ask every host's front for a short answer: proof that the fleet serves.

    rigfleet endpoints --inventory inventory/testbed.py

A front with TLS (host data ``front_tls_cert_file``) is asked over HTTPS, trusting only the
host data's CA (``front_tls_ca_file``, else the front's own certificate), with the
certificate's name checked against the URL's host.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from rigfleet.errors import RigfleetError
from rigfleet.hostdata import HostSettings, validate_host
from rigfleet.inventory import InventoryHost


@dataclass(frozen=True)
class EndpointCheck:
    """One host's answer (``--json`` prints these as objects)."""

    host: str
    url: str
    status: int | str
    model: str
    answer: str
    seconds: float


def front_url(host: InventoryHost, settings: HostSettings) -> str:
    """The host's serving endpoint: ``front_url`` in host data, else ssh host + front port
    (``https://`` when the front serves TLS)."""
    if settings.front_url:
        return settings.front_url.rstrip("/")
    return f"{settings.front_scheme}://{host.ssh_target[0]}:{settings.front_port}"


def front_context(settings: HostSettings) -> ssl.SSLContext | None:
    """The TLS context clients of this host's front use (None: plain HTTP, or the system's
    trust store for an ``https://`` ``front_url`` without front TLS in host data)."""
    return settings.front_tls.client_context() if settings.front_tls else None


def read_key(settings: HostSettings) -> str:
    return Path(settings.api_key_file).read_text().strip()


def chat(url: str, key: str, prompt: str, max_tokens: int = 40, timeout: float = 60,
         context: ssl.SSLContext | None = None) -> dict:
    body = json.dumps({
        "model": "qwen3.6-27b-autoround",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens, "temperature": 0,
    }).encode()
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json",
                                          "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
        return json.load(resp)


def check(host: InventoryHost) -> EndpointCheck:
    """Ask ``host``'s front one short question; never raises (the row says what happened)."""
    started = time.monotonic()
    try:
        settings = validate_host(host.name, host.data)
    except RigfleetError as exc:
        return EndpointCheck(host.name, "-", "bad data", "", str(exc).splitlines()[0][:160], 0.0)
    url = front_url(host, settings)
    try:
        reply = chat(url, read_key(settings), "What is the capital of France? One short sentence.",
                     context=front_context(settings))
        text = reply["choices"][0]["message"].get("content") or ""
        return EndpointCheck(host.name, url, 200, reply.get("model", ""), text.strip()[:80],
                             time.monotonic() - started)
    except urllib.error.HTTPError as exc:
        return EndpointCheck(host.name, url, exc.code, "", exc.reason, time.monotonic() - started)
    except (OSError, KeyError, ValueError) as exc:
        return EndpointCheck(host.name, url, "down", "", str(exc)[:80], time.monotonic() - started)
