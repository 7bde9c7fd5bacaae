"""The OpenAI-compatible HTTP API (stdlib ``http.server``, HTTP/1.1).

Routes and their auth follow vLLM: ``--api-key`` protects ``/v1/*`` only; ``/health``,
``/version``, ``/metrics``, ``/tokenize``, ``/detokenize``, ``/ping``, ``/load`` and
``/invocations`` stay open. Errors use vLLM's ``{"error": {...}}`` shape, 401 is
``{"error": "Unauthorized"}``, unknown routes are FastAPI's ``{"detail": "Not Found"}``.
Streaming responses are SSE over chunked transfer encoding.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from vllm.sim import chat, logs, tokenizer
from vllm.sim.args import ServeConfig
from vllm.sim.engine import Delta, Engine, EngineDeadError, Finished, GenRequest
from vllm.sim.metrics import Metrics
from vllm.sim.responder import ChatTask, Reply, respond, respond_completion, seed_of

_MAX_BODY = 64 * 1024 * 1024
_OPEN_GET = ("/health", "/ping", "/version", "/metrics", "/load")


class ApiError(Exception):
    """An error answered as vLLM's ErrorResponse."""

    def __init__(self, status: int, message: str, err_type: str = "BadRequestError",
                 param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.err_type, "param": self.param,
                          "code": self.status}}


class App:
    """State shared by request handlers."""

    def __init__(self, cfg: ServeConfig, engine: Engine, metrics: Metrics, version: str,
                 max_model_len: int, hang: bool = False):
        self.cfg = cfg
        self.engine = engine
        self.metrics = metrics
        self.version = version
        self.max_model_len = max_model_len
        self.hang = hang
        self.created = int(time.time())

    @property
    def model_name(self) -> str:
        return self.cfg.served_model_names[0]

    def check_model(self, body: dict[str, Any]) -> str:
        name = body.get("model")
        if name is None or name == "":
            return self.model_name
        if name not in self.cfg.served_model_names:
            raise ApiError(404, f"The model `{name}` does not exist.", "NotFoundError", "model")
        return str(name)

    # -- shared request preparation --------------------------------------------------------
    def budget(self, body: dict[str, Any], prompt_tokens: int) -> int:
        if prompt_tokens > self.max_model_len:
            raise ApiError(400, f"This model's maximum context length is {self.max_model_len} "
                                f"tokens. However, your request has {prompt_tokens} input "
                                "tokens. Please reduce the length of the input messages.")
        raw = body.get("max_completion_tokens")
        if raw is None:
            raw = body.get("max_tokens")
        room = self.max_model_len - prompt_tokens
        if raw is None:
            if room < 1:
                raise ApiError(400, f"This model's maximum context length is "
                                    f"{self.max_model_len} tokens. However, your request has "
                                    f"{prompt_tokens} input tokens. Please reduce the length of "
                                    "the input messages.")
            return room
        if not isinstance(raw, int) or isinstance(raw, bool):
            raise ApiError(400, "max_tokens must be an integer", param="max_tokens")
        if raw < 1:
            raise ApiError(400, f"max_tokens must be at least 1, got {raw}.", param="max_tokens")
        if raw > room:
            raise ApiError(400, f"'max_tokens' or 'max_completion_tokens' is too large: {raw}. "
                                f"This model's maximum context length is {self.max_model_len} "
                                f"tokens and your request has {prompt_tokens} input tokens "
                                f"({raw} > {self.max_model_len} - {prompt_tokens}).",
                           param="max_tokens")
        return raw


def _stop_list(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list):
        return [str(s) for s in stop if s]
    raise ApiError(400, "stop must be a string or a list of strings", param="stop")


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion,
            "completion_tokens": completion, "prompt_tokens_details": None}


class Handler(BaseHTTPRequestHandler):
    """One HTTP connection (keep-alive, HTTP/1.1)."""

    protocol_version = "HTTP/1.1"
    server: SimHTTPServer

    def version_string(self) -> str:  # the "server" header, as uvicorn sends it
        return "uvicorn"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # access lines are written by _access in uvicorn's format

    @property
    def app(self) -> App:
        return self.server.app

    # -- plumbing ---------------------------------------------------------------------------
    def _access(self, status: int) -> None:
        client = f"{self.client_address[0]}:{self.client_address[1]}"
        logs.access(client, self.command, self.path, status)

    def _send(self, status: int, body: bytes, ctype: str = "application/json",
              extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.wfile.flush()
        self._access(status)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj, ensure_ascii=False).encode("utf-8"))

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
            data = bytearray()
            while True:
                line = self.rfile.readline(1024)
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline(1024)
                    return bytes(data)
                data += self.rfile.read(size)
                self.rfile.readline(1024)
                if len(data) > _MAX_BODY:
                    raise ApiError(413, "Request body too large")
        length = int(self.headers.get("content-length") or 0)
        if length > _MAX_BODY:
            raise ApiError(413, "Request body too large")
        return self.rfile.read(length) if length else b""

    def _json_body(self) -> dict[str, Any]:
        raw = self._read_body()
        try:
            body = json.loads(raw.decode("utf-8") or "null")
        except (UnicodeDecodeError, ValueError) as exc:
            raise ApiError(400, f"JSON decode error: {exc}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "Input should be a valid dictionary or object to extract "
                                "fields from")
        return body

    def _authorized(self) -> bool:
        keys = self.app.cfg.api_keys
        if not keys or not self.path.startswith("/v1"):
            return True
        header = self.headers.get("authorization") or ""
        return any(header == f"Bearer {k}" for k in keys)

    def _hang_if_faulty(self) -> None:
        if self.app.hang:
            # SIM_FAULT_HANG: the connection is accepted, then nothing ever comes back.
            threading.Event().wait()

    # -- dispatch ---------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        self._hang_if_faulty()
        path = self.path.split("?", 1)[0]
        routes = {
            "/health": ("GET", self._health), "/ping": ("GET", self._health),
            "/version": ("GET", self._version), "/metrics": ("GET", self._metrics),
            "/load": ("GET", self._load), "/v1/models": ("GET", self._models),
            "/v1/chat/completions": ("POST", self._chat),
            "/v1/completions": ("POST", self._completions),
            "/tokenize": ("POST", self._tokenize), "/detokenize": ("POST", self._detokenize),
            "/invocations": ("POST", self._invocations),
        }
        try:
            if path not in routes:
                self._json(404, {"detail": "Not Found"})
                return
            want, fn = routes[path]
            if path == "/ping" and method == "POST":
                want = "POST"
            if method != want and not (method == "HEAD" and want == "GET"):
                self._drain()
                self._json(405, {"detail": "Method Not Allowed"})
                return
            if not self._authorized():
                self._drain()
                self._json(401, {"error": "Unauthorized"})
                return
            fn()
        except ApiError as err:
            self._json(err.status, err.body())
        except EngineDeadError as err:
            self._json(500, ApiError(500, str(err), "InternalServerError").body())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _drain(self) -> None:
        try:
            self._read_body()
        except (ApiError, ValueError):
            self.close_connection = True

    # -- simple routes ----------------------------------------------------------------------
    def _health(self) -> None:
        if self.command == "POST":
            self._drain()
        self._send(503 if self.app.engine.dead else 200, b"")

    def _version(self) -> None:
        self._json(200, {"version": self.app.version})

    def _load(self) -> None:
        self._json(200, {"server_load": self.app.metrics.running})

    def _metrics(self) -> None:
        self._send(200, self.app.metrics.render().encode("utf-8"),
                   "text/plain; version=0.0.4; charset=utf-8")

    def _models(self) -> None:
        app = self.app
        data = [{
            "id": name, "object": "model", "created": app.created, "owned_by": "vllm",
            "root": app.cfg.model, "parent": None, "max_model_len": app.max_model_len,
            "permission": [{
                "id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                "created": app.created, "allow_create_engine": False, "allow_sampling": True,
                "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                "allow_fine_tuning": False, "organization": "*", "group": None,
                "is_blocking": False,
            }],
        } for name in app.cfg.served_model_names]
        self._json(200, {"object": "list", "data": data})

    def _tokenize(self) -> None:
        body = self._json_body()
        self.app.check_model(body)
        if "messages" in body:
            try:
                msgs = chat.normalise(body["messages"])
            except chat.ChatFormatError as exc:
                raise ApiError(400, str(exc)) from None
            ctk = {**self.app.cfg.default_chat_template_kwargs,
                   **(body.get("chat_template_kwargs") or {})}
            text = chat.render(msgs, body.get("tools") or None,
                               add_generation_prompt=body.get("add_generation_prompt", True),
                               enable_thinking=bool(ctk.get("enable_thinking", True)))
        elif "prompt" in body:
            text = str(body["prompt"])
        else:
            raise ApiError(400, "Either 'prompt' or 'messages' is required")
        ps = tokenizer.pieces(text)
        self._json(200, {
            "count": len(ps), "max_model_len": self.app.max_model_len,
            "tokens": [tokenizer.piece_id(p) for p in ps],
            "token_strs": ps if body.get("return_token_strs") else None,
        })

    def _detokenize(self) -> None:
        body = self._json_body()
        self.app.check_model(body)
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise ApiError(400, "tokens must be a list of integers", param="tokens")
        try:
            self._json(200, {"prompt": tokenizer.decode(ids)})
        except (ValueError, OverflowError) as exc:
            raise ApiError(400, f"Invalid token id: {exc}") from None

    def _invocations(self) -> None:
        body = self._json_body()
        if "messages" in body:
            self._chat(body)
        elif "prompt" in body:
            self._completions(body)
        else:
            raise ApiError(400, "Cannot determine the request type from the body")

    # -- chat --------------------------------------------------------------------------------
    def _chat(self, body: dict[str, Any] | None = None) -> None:
        app = self.app
        cfg = app.cfg
        body = self._json_body() if body is None else body
        model = app.check_model(body)
        try:
            msgs = chat.normalise(body.get("messages"))
        except chat.ChatFormatError as exc:
            raise ApiError(400, str(exc)) from None
        tools = body.get("tools") or []
        if not isinstance(tools, list):
            raise ApiError(400, "tools must be a list", param="tools")
        tool_choice = body.get("tool_choice", "auto" if tools else "none")
        if tools and tool_choice == "auto" and not (cfg.enable_auto_tool_choice
                                                     and cfg.tool_call_parser):
            raise ApiError(400, '"auto" tool choice requires --enable-auto-tool-choice and '
                                "--tool-call-parser to be set")
        if tool_choice not in ("auto", "none", "required") and not (
                isinstance(tool_choice, dict) and tool_choice.get("type") == "function"):
            raise ApiError(400, f"Invalid tool_choice: {tool_choice!r}", param="tool_choice")
        if isinstance(tool_choice, dict):
            wanted = (tool_choice.get("function") or {}).get("name")
            if not any(((t.get("function") or {}).get("name") == wanted) for t in tools):
                raise ApiError(400, f"Tool '{wanted}' has not been passed in `tools`.",
                               param="tool_choice")
        ctk = {**cfg.default_chat_template_kwargs, **(body.get("chat_template_kwargs") or {})}
        thinking = bool(ctk.get("enable_thinking", True))
        prompt = chat.render(msgs, tools or None, add_generation_prompt=True,
                             enable_thinking=thinking)
        prompt_ids = tokenizer.encode(prompt)
        max_tokens = app.budget(body, len(prompt_ids))
        stop = _stop_list(body)
        n = int(body.get("n") or 1)
        stream = bool(body.get("stream"))
        opts = body.get("stream_options") or {}
        base_seed = seed_of(prompt, body.get("seed") if isinstance(body.get("seed"), int) else None)
        reqs = []
        for i in range(n):
            seed = base_seed ^ (i * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF)
            reply = respond(ChatTask(msgs, tools, tool_choice, thinking, seed))
            reqs.append(GenRequest(prompt_ids, reply, max_tokens, seed, thinking, stop))
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        if stream:
            self._stream(rid, model, reqs, opts, chat_mode=True)
        else:
            self._complete(rid, model, reqs, chat_mode=True)

    # -- completions -----------------------------------------------------------------------
    def _completions(self, body: dict[str, Any] | None = None) -> None:
        app = self.app
        body = self._json_body() if body is None else body
        model = app.check_model(body)
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompts = [prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
            prompts = [tokenizer.decode(prompt)]
        elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            prompts = list(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
            prompts = [tokenizer.decode(p) for p in prompt]
        else:
            raise ApiError(400, "prompt must be a string, a list of strings or token ids",
                           param="prompt")
        stop = _stop_list(body)
        reqs = []
        echo = bool(body.get("echo"))
        for text in prompts:
            ids = tokenizer.encode(text)
            if "max_tokens" not in body and "max_completion_tokens" not in body:
                body = {**body, "max_tokens": min(16, max(app.max_model_len - len(ids), 1))}
            max_tokens = app.budget(body, len(ids))
            seed = seed_of(text, body.get("seed") if isinstance(body.get("seed"), int) else None)
            reply = respond_completion(text, seed)
            if echo:
                reply = Reply(content=text + reply.content, kind=reply.kind)
            reqs.append(GenRequest(ids, reply, max_tokens, seed, False, stop))
        rid = f"cmpl-{uuid.uuid4().hex}"
        if body.get("stream"):
            self._stream(rid, model, reqs, body.get("stream_options") or {}, chat_mode=False)
        else:
            self._complete(rid, model, reqs, chat_mode=False)

    # -- output ------------------------------------------------------------------------------
    def _complete(self, rid: str, model: str, reqs: list[GenRequest], chat_mode: bool) -> None:
        choices = []
        p_total = c_total = 0
        for index, req in enumerate(reqs):
            reasoning, content = [], []
            calls: dict[int, dict[str, Any]] = {}
            fin: Finished | None = None
            for ev in self.app.engine.generate(req):
                if isinstance(ev, Finished):
                    fin = ev
                elif ev.channel == "reasoning":
                    reasoning.append(ev.text)
                elif ev.channel == "content":
                    content.append(ev.text)
                elif ev.channel == "tool_start" and ev.tool is not None:
                    calls[ev.tool_index] = {"id": ev.tool.id, "type": "function",
                                            "function": {"name": ev.tool.name, "arguments": ""}}
                elif ev.channel == "tool_args" and ev.tool_index in calls:
                    calls[ev.tool_index]["function"]["arguments"] += ev.text
            assert fin is not None
            p_total = fin.prompt_tokens
            c_total += fin.completion_tokens
            if chat_mode:
                text = "".join(content)
                message = {
                    "role": "assistant",
                    "content": text if (text or not calls) else None,
                    "refusal": None, "annotations": None, "audio": None,
                    "function_call": None,
                    "tool_calls": [calls[i] for i in sorted(calls)],
                }
                if self.app.cfg.reasoning_parser:
                    r = "".join(reasoning) or None
                    message["reasoning_content"] = r
                    message["reasoning"] = r
                choices.append({"index": index, "message": message, "logprobs": None,
                                "finish_reason": fin.finish_reason, "stop_reason": None})
            else:
                choices.append({"index": index, "text": "".join(content), "logprobs": None,
                                "finish_reason": fin.finish_reason, "stop_reason": None,
                                "prompt_logprobs": None})
        body = {
            "id": rid, "object": "chat.completion" if chat_mode else "text_completion",
            "created": int(time.time()), "model": model, "choices": choices,
            "usage": _usage(p_total, c_total),
        }
        if chat_mode:
            body["prompt_logprobs"] = None
            body["kv_transfer_params"] = None
        self._json(200, body)

    def _stream(self, rid: str, model: str, reqs: list[GenRequest], opts: dict[str, Any],
                chat_mode: bool) -> None:
        created = int(time.time())
        obj = "chat.completion.chunk" if chat_mode else "text_completion"
        include_usage = bool(opts.get("include_usage"))
        continuous = bool(opts.get("continuous_usage_stats")) and include_usage
        started = False

        def start() -> None:
            nonlocal started
            if started:
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream; charset=utf-8")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            started = True

        def send(payload: dict[str, Any] | str) -> None:
            start()
            data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
            raw = f"data: {data}\n\n".encode()
            self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
            self.wfile.flush()

        def chunk(index: int, delta: dict[str, Any] | None, text: str | None = None,
                  finish: str | None = None, usage: dict[str, Any] | None = None) -> dict:
            if chat_mode:
                choice: dict[str, Any] = {"index": index, "delta": delta or {}, "logprobs": None,
                                          "finish_reason": finish}
            else:
                choice = {"index": index, "text": text or "", "logprobs": None,
                          "finish_reason": finish}
            if finish is not None:
                choice["stop_reason"] = None
            out: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": model,
                                   "choices": [choice]}
            if usage is not None:
                out["usage"] = usage
            return out

        p_total = c_total = 0
        gens: list[Iterator[Delta | Finished]] = []
        try:
            for index, req in enumerate(reqs):
                gen = self.app.engine.generate(req)
                gens.append(gen)
                first = True
                produced = 0
                for ev in gen:
                    if chat_mode and first:
                        send(chunk(index, {"role": "assistant", "content": ""}))
                        first = False
                    if isinstance(ev, Finished):
                        p_total = ev.prompt_tokens
                        c_total += ev.completion_tokens
                        u = _usage(ev.prompt_tokens, ev.completion_tokens) if continuous else None
                        send(chunk(index, {}, "", ev.finish_reason, u))
                        continue
                    produced += ev.tokens  # vLLM counts tokens, not chunks
                    u = _usage(req_prompt(req), produced) if continuous else None
                    if not chat_mode:
                        if ev.channel == "content":
                            send(chunk(index, None, ev.text, usage=u))
                        continue
                    if ev.channel == "content":
                        delta: dict[str, Any] = {"content": ev.text}
                    elif ev.channel == "reasoning":
                        delta = {"reasoning_content": ev.text, "reasoning": ev.text}
                    elif ev.channel == "tool_start" and ev.tool is not None:
                        delta = {"tool_calls": [{
                            "index": ev.tool_index, "id": ev.tool.id, "type": "function",
                            "function": {"name": ev.tool.name, "arguments": ""}}]}
                    elif ev.channel == "tool_args" and ev.text:
                        delta = {"tool_calls": [{"index": ev.tool_index,
                                                 "function": {"arguments": ev.text}}]}
                    else:
                        continue
                    send(chunk(index, delta, usage=u))
            if include_usage:
                send({"id": rid, "object": obj, "created": created, "model": model,
                      "choices": [], "usage": _usage(p_total, c_total)})
            send("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            self._access(200)
        except EngineDeadError as err:
            if not started:
                raise
            # Mid-stream engine death: the connection just drops (no terminating chunk).
            logs.error("serving_chat.py:1227", f"Error in chat completion stream: {err}")
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # client went away: the generator's finally aborts
        finally:
            for g in gens:
                g.close()


def req_prompt(req: GenRequest) -> int:
    return len(req.prompt_ids)


class SimHTTPServer(ThreadingHTTPServer):
    """Bound at start-up, listening only once the engine is ready (like vLLM + uvicorn)."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], app: App | None = None):
        super().__init__(address, Handler, bind_and_activate=False)
        self.app = app  # type: ignore[assignment]
        self.server_bind()  # the port is taken now; connections are refused until listen()

    def start_listening(self) -> None:
        self.server_activate()
