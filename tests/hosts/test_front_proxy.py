"""The front: nginx up, answering with the API key, refusing without it (asked from here, the
control side, as a client would: ``rigfleet.endpoints.front_url``, i.e. ``front_url`` in host
data, else ``http://<ssh host>:<front_port>``).

    pytest tests/hosts/test_front_proxy.py --inventory inventory/home.py
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request

import pytest

from rigfleet.endpoints import front_context, front_url


def call(url: str, key: str | None, data: bytes | None = None,
         context: ssl.SSLContext | None = None) -> tuple[int | str, str]:
    """(status, body) of one request; ``context``: the TLS trust of a front serving HTTPS."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30, context=context) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError as e:
        return f"no answer ({e})", ""


@pytest.fixture(scope="module")
def base(rig) -> str:
    """The front's URL as clients reach it."""
    return front_url(rig.host, rig.want.settings)


@pytest.fixture(scope="module")
def tls(rig) -> ssl.SSLContext | None:
    """Trust for a TLS front (``front_tls_ca_file``, else its certificate); None for HTTP."""
    return front_context(rig.want.settings.front_tls)


@pytest.fixture(scope="module")
def model(rig) -> str:
    """The model id the desired stack serves."""
    return rig.want.current.spec.served_model_name


def test_nginx_running_and_enabled(host, rig, fail_if):
    nginx = host.service("nginx")
    problems = []
    if not nginx.is_running:
        problems.append("nginx is not running")
    if not nginx.is_enabled:
        problems.append("nginx is not enabled at boot")
    fail_if("front", problems)


def test_front_answers_with_the_key(rig, base, tls, model, require):
    url = f"{base}/v1/models"
    status, body = call(url, rig.api_key(), context=tls)
    require(
        status == 200, f"{rig.name}: GET {url} with the API key answered {status}: {body[:300]}"
    )
    try:
        ids = [m.get("id") for m in json.loads(body).get("data", [])]
    except (ValueError, AttributeError):
        ids = []
    require(
        model in ids,
        f"{rig.name}: GET {url} lists models {ids}, expected {model}",
    )


def test_front_refuses_without_the_key(base, tls, model, fail_if):
    chat = json.dumps(
        {
            "model": model,
            "max_tokens": 1,
            "messages": [{"role": "user", "content": "hi"}],
        }
    ).encode()
    cases = [
        ("GET /v1/models without a key", f"{base}/v1/models", None, None),
        ("GET /v1/models with a wrong key", f"{base}/v1/models", "not-the-key", None),
        ("POST /v1/chat/completions without a key", f"{base}/v1/chat/completions", None, chat),
        ("GET /health without a key", f"{base}/health", None, None),
    ]
    problems = []
    for what, url, key, data in cases:
        status, body = call(url, key, data, tls)
        if status != 401:
            problems.append(f"{what} answered {status}, expected 401: {body[:120]}")
    fail_if(f"front {base} lets requests through without the key", problems)
