"""A small OpenAI-compatible HTTP client (urllib only, SSE streaming) that never raises for
HTTP or transport problems (``status`` 0: no HTTP answer) and never shows the API key::

    client = Client("https://rig-a.lan:8000", api_key=key, ca_file="front-ca.pem")
    r = client.request("GET", "/v1/models", timeout=5)          # HttpResult
    c = client.chat({"model": m, "messages": msgs, "max_tokens": 30}, timeout=60, stream=True)
    c.status, c.content, c.tool_calls, c.usage, c.seconds, c.ttft, c.error
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

USER_AGENT = "rigfleet-verify/1"
CA_FILE_ENV = "RIGFLEET_CA_FILE"

# Finish reasons of a reply the engine gave up on (vLLM's ``abort``; ``error``, answered 500).
ENGINE_GAVE_UP = ("abort", "error")


@dataclass
class HttpResult:
    status: int  # 0: no HTTP response at all
    body: bytes = b""
    seconds: float = 0.0
    error: str = ""  # transport problem, or (a chat) an in-stream error

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error

    def json(self) -> Any:
        try:
            return json.loads(self.body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return None

    def error_message(self) -> str:
        """vLLM/OpenAI's ``{"error": {"message": ...}}`` (or the transport error)."""
        if self.error:
            return self.error
        if isinstance(data := self.json(), dict):
            err = data.get("error", data.get("detail"))
            if isinstance(err, dict):
                return str(err.get("message") or err)
            if err is not None:
                return str(err)
            if "message" in data:
                return str(data["message"])
        return self.body.decode("utf-8", "replace")[:300]


@dataclass
class ChatResult(HttpResult):
    """A chat completion, streamed or not (``body``: a non-streamed or failed exchange's)."""

    ttft: float | None = None  # streaming: seconds to the first content/tool byte
    first_token: float | None = None  # streaming: to the first token of any kind (decode start)
    first_tokens: int | None = None  # continuous usage: the tokens the first such chunk held
    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None

    @property
    def completion_tokens(self) -> int | None:
        v = (self.usage or {}).get("completion_tokens")
        return v if isinstance(v, int) else None

    @property
    def prompt_tokens(self) -> int | None:
        v = (self.usage or {}).get("prompt_tokens")
        return v if isinstance(v, int) else None

    def tool_names(self) -> list[str]:
        return [str((c.get("function") or {}).get("name") or "") for c in self.tool_calls]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Never follow redirects: urllib would resend the Authorization header."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


class Client:
    """Talks to one server; ``base_url`` without a trailing ``/v1``."""

    def __init__(self, base_url: str, api_key: str | None = None, ca_file: str | None = None):
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self._api_key = api_key or None
        self.ca_file = ca_file or os.environ.get(CA_FILE_ENV) or None
        # No proxies from the environment: the key has no business going through one.
        self._opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), _NoRedirect,
            urllib.request.HTTPSHandler(context=tls_context(self.ca_file)))

    def __repr__(self) -> str:
        return f"Client({self.base_url!r}, api_key={'***' if self._api_key else None})"

    def _request(self, method: str, path: str, body: Any | None) -> urllib.request.Request:
        data = None if body is None else json.dumps(body, ensure_ascii=False).encode("utf-8")
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json, text/event-stream",
                   **({"Content-Type": "application/json"} if data is not None else {}),
                   **({"Authorization": f"Bearer {self._api_key}"} if self._api_key else {})}
        return urllib.request.Request(self.base_url + path, data=data, headers=headers,
                                      method=method)

    def _transport_error(self, exc: BaseException) -> str:
        """The socket layer's text (never the request headers, nor the URL's password: urllib
        takes ``password@host`` of a URL without a port for the port)."""
        if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError):
            exc = exc.reason if isinstance(exc.reason, BaseException) else exc
        if isinstance(exc, TimeoutError | socket.timeout):
            return "timed out"
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        password = urllib.parse.urlsplit(self.base_url).password
        return text.replace(password, "***") if password else text

    def _failure(self, exc: Exception, t0: float) -> HttpResult:
        """An HTTP error status with its body, or a transport problem (status 0)."""
        if isinstance(exc, urllib.error.HTTPError):
            try:
                data = exc.read()
            except (OSError, http.client.HTTPException):
                data = b""
            return HttpResult(exc.code, data, time.monotonic() - t0)
        return HttpResult(0, b"", time.monotonic() - t0, self._transport_error(exc))

    def request(self, method: str, path: str, body: Any | None = None,
                timeout: float = 30.0) -> HttpResult:
        t0 = time.monotonic()
        try:
            with self._opener.open(self._request(method, path, body), timeout=timeout) as resp:
                return HttpResult(resp.status, resp.read(), time.monotonic() - t0)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            return self._failure(exc, t0)

    def models(self, timeout: float) -> tuple[list[dict[str, Any]], int, str]:
        """(cards, HTTP status, why there are none) from ``/v1/models``; cards[0] is a dict."""
        m = self.request("GET", "/v1/models", timeout=timeout)
        data = m.json() if m.status == 200 else None
        cards = data.get("data") if isinstance(data, dict) else None
        if cards and isinstance(cards, list) and isinstance(cards[0], dict):
            return cards, m.status, ""
        return [], m.status, m.error_message() if m.status != 200 else "no model listed"

    def version(self, timeout: float) -> str:
        """``/version``'s version, or ""."""
        v = self.request("GET", "/version", timeout=timeout)
        data = v.json() if v.status == 200 else None
        return str(data["version"]) if isinstance(data, dict) and data.get("version") else ""

    def chat(self, body: dict[str, Any], timeout: float, stream: bool = False) -> ChatResult:
        """POST /v1/chat/completions. ``timeout`` bounds the whole exchange, stream included."""
        if stream:
            # continuous usage (vLLM's extension): each chunk says how many tokens so far
            body = {**body, "stream": True,
                    "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        t0 = time.monotonic()
        try:
            resp = self._opener.open(self._request("POST", "/v1/chat/completions", body),
                                     timeout=timeout)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            return ChatResult(**vars(self._failure(exc, t0)))
        with resp:
            if stream and "text/event-stream" in (resp.headers.get("content-type") or ""):
                return self._read_stream(resp, t0, timeout)
            try:
                data = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                return ChatResult(resp.status, seconds=time.monotonic() - t0,
                                  error=self._transport_error(exc))
            return _parse_completion(resp.status, data, time.monotonic() - t0)

    def _read_stream(self, resp: Any, t0: float, timeout: float) -> ChatResult:
        out = ChatResult(resp.status)
        calls: dict[int, dict[str, Any]] = {}
        done = False
        sock = getattr(getattr(getattr(resp, "fp", None), "raw", None), "_sock", None)
        try:
            while True:
                left = timeout - (time.monotonic() - t0)
                try:
                    if left <= 0:
                        raise TimeoutError  # the deadline passed between two reads
                    if sock is not None:  # a read waits for what is left, not a whole timeout
                        sock.settimeout(left)
                    line = resp.readline()
                except TimeoutError:
                    if time.monotonic() - t0 < timeout:
                        raise
                    out.error = f"timed out after {timeout:.0f}s (stream still running)"
                    break
                if not line:
                    break
                text = line.decode("utf-8", "replace").strip()
                if not text.startswith("data:"):
                    continue  # blank separators, ": keep-alive" comments, "event:" lines
                payload = text[len("data:"):].strip()
                if payload == "[DONE]":
                    done = True
                    break
                try:
                    event = json.loads(payload)
                except ValueError:
                    out.error = f"unparsable SSE event: {payload[:120]!r}"
                    break
                if not isinstance(event, dict):
                    continue
                if "error" in event:  # vLLM reports mid-stream failures as an error event
                    err = event["error"]
                    out.error = "stream error: " + str(
                        err.get("message") if isinstance(err, dict) else err)
                    break
                if isinstance(usage := event.get("usage"), dict):
                    out.usage = usage
                try:
                    _read_choices(out, event, calls, t0)
                except (AttributeError, TypeError, KeyError):
                    out.error = f"malformed SSE event: {payload[:120]!r}"
                    break
        except (OSError, http.client.HTTPException) as exc:
            out.error = self._transport_error(exc)
        if not done and not out.error:
            out.error = "stream ended without [DONE] (connection dropped)"
        out.tool_calls = [calls[i] for i in sorted(calls)]
        out.seconds = time.monotonic() - t0
        return out


def max_model_len(card: dict[str, Any]) -> int | None:
    mml = card.get("max_model_len")
    return mml if isinstance(mml, int) and mml > 0 else None


def tls_context(ca_file: str | None = None) -> ssl.SSLContext:
    """Verifies against ``ca_file`` only (a pinned leaf works too), else the system store."""
    ctx = ssl.create_default_context(cafile=ca_file)
    if ca_file:
        ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return ctx


def check_ca_file(ca_file: str | None = None) -> None:
    """ValueError (a Client: OSError) when ``ca_file`` (else ``$RIGFLEET_CA_FILE``) cannot load."""
    if not (path := ca_file or os.environ.get(CA_FILE_ENV)):
        return
    try:
        tls_context(path)
    except OSError as exc:
        where = "--ca-file" if ca_file else f"${CA_FILE_ENV}"
        raise ValueError(f"{where} {path}: cannot be loaded ({exc.strerror or exc}); allowed: "
                         "a readable PEM file of CA (or server) certificates") from None


def _read_choices(out: ChatResult, event: dict[str, Any], calls: dict[int, dict[str, Any]],
                  t0: float) -> None:
    """One event's choices into ``out``; AttributeError/TypeError for a malformed one."""
    usage = event.get("usage")
    for choice in event.get("choices") or []:
        delta = choice.get("delta") or {}
        piece, rpiece = _texts(delta)
        out.content += piece
        out.reasoning += rpiece
        for tc in delta.get("tool_calls") or []:
            _merge_tool_delta(calls, tc)
        if (piece or rpiece or delta.get("tool_calls")) and out.first_token is None:
            out.first_token = time.monotonic() - t0
            so_far = (usage if isinstance(usage, dict) else {}).get("completion_tokens")
            out.first_tokens = so_far if isinstance(so_far, int) else None
        if (piece or delta.get("tool_calls")) and out.ttft is None:
            out.ttft = time.monotonic() - t0
        if choice.get("finish_reason"):
            _finished(out, choice["finish_reason"])


def _finished(out: ChatResult, reason: Any) -> None:
    """A reply the engine gave up on failed."""
    out.finish_reason = reason
    if reason in ENGINE_GAVE_UP and not out.error:
        out.error = f'the engine gave up on the reply (finish_reason "{reason}"): see its log'


def _merge_tool_delta(calls: dict[int, dict[str, Any]], tc: dict[str, Any]) -> None:
    """Streamed tool calls come in pieces keyed by index: name first, arguments in parts."""
    if not isinstance(index := tc.get("index", len(calls)), int):
        raise TypeError("tool call index is not an integer")  # they are sorted at the end
    call = calls.setdefault(index, {
        "id": "", "type": "function", "function": {"name": "", "arguments": ""}})
    if tc.get("id"):
        call["id"] = tc["id"]
    fn = tc.get("function") or {}
    for key in ("name", "arguments"):
        call["function"][key] += fn.get(key) or ""


def _texts(msg: dict[str, Any]) -> tuple[str, str]:
    """A message's (or a stream delta's) content and reasoning; TypeError if not strings."""
    content = msg.get("content") or ""
    reasoning = msg.get("reasoning_content") or msg.get("reasoning") or ""
    if not isinstance(content, str) or not isinstance(reasoning, str):
        raise TypeError("content is not a string")
    return content, reasoning


def _parse_completion(status: int, data: bytes, seconds: float) -> ChatResult:
    out = ChatResult(status, data, seconds)
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        out.error = "response is not JSON"
        return out
    if not isinstance(obj, dict):
        out.error = "response is not a JSON object"
        return out
    out.usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
    try:
        if choices := obj.get("choices"):
            choice = choices[0]
            msg = choice.get("message") or {}
            out.content, out.reasoning = _texts(msg)
            out.tool_calls = [c for c in msg.get("tool_calls") or [] if isinstance(c, dict)]
            _finished(out, choice.get("finish_reason"))
    except (AttributeError, TypeError, KeyError, IndexError):
        out.error = f"malformed response: {data[:120].decode('utf-8', 'replace')!r}"
    return out


def redact_url(url: str) -> str:
    """``url`` without any ``user:password@`` part (reports must not carry credentials)."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    # The host as written (an IPv6 address keeps its brackets, a name its case).
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
