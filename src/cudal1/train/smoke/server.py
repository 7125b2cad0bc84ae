"""The scripted OpenAI-compatible chat server (stdlib only; no LLM anywhere): the ``collect``
smoke's teacher, the tests' endpoint and ``benchmarks/reward_loop.py``'s generator.

Serves ``POST /v1/chat/completions`` and ``POST /chat/completions`` (and ``GET /v1/models``) on
127.0.0.1 with an OS-chosen port.  What it answers is scripted:

- ``script``: a list consumed one item per request (then ``default``), or a callable
  ``(body: dict, index: int) -> item``.  An item is a :class:`Reply`, a ``str`` (that text), or a
  list of strings (one per choice).
- :class:`Reply` can set an HTTP status (429/500/503/400 ...) with an error body, a delay before
  answering (for timeout tests; cut short when the server stops), raw bytes (malformed JSON),
  headers (``Retry-After``) and usage.
- ``reject_n=True`` answers 400 to any request with ``n > 1`` (servers without ``n`` support).

Every request body is recorded in ``server.requests`` (in arrival order) and the peak number of
requests handled at once in ``server.max_in_flight``.  Use it as a context manager (or through a
pytest fixture); it stops itself after ``lifetime_s`` even if a test forgets to.

    with ScriptedLLMServer(["hello"]) as srv:
        OpenAIPolicy(base_url=srv.url, model="m")...
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Union


@dataclass
class Reply:
    """One scripted answer.  ``texts`` (one per choice) wins over ``text``; ``raw`` wins over all."""

    text: str = "ok"
    texts: list[str] | None = None
    status: int = 200
    delay_s: float = 0.0
    raw: bytes | None = None  # sent verbatim as the body (e.g. b"{not json")
    headers: dict[str, str] = field(default_factory=dict)
    usage: dict[str, int] | None = None  # default: prompt_tokens=10, completion_tokens=5 per choice
    finish_reason: str = "stop"


Item = Union[Reply, str, list]
Script = Union[list, Callable[[dict, int], Item], None]


def cycle(texts: list[str]) -> Callable[[dict, int], Item]:
    """A script answering every choice of every request with the next of ``texts``, over and over."""
    lock, served = threading.Lock(), [0]

    def next_item(body: dict, index: int) -> Item:
        n = int(body.get("n") or 1)
        with lock:
            start, served[0] = served[0], served[0] + n
        return [texts[(start + i) % len(texts)] for i in range(n)]

    return next_item


def fail_first(k: int, status: int = 503, then: Item = "ok") -> Callable[[dict, int], Item]:
    """A script answering HTTP ``status`` to the first ``k`` requests and ``then`` afterwards."""
    return lambda body, index: Reply(status=status) if index < k else then


class ScriptedLLMServer:
    """See the module docstring."""

    def __init__(
        self,
        script: Script = None,
        default: Item = "ok",
        *,
        reject_n: bool = False,
        model: str = "test-model",
        lifetime_s: float = 120.0,
    ) -> None:
        self._script = list(script) if isinstance(script, (list, tuple)) else script
        self.default = default
        self.reject_n = reject_n
        self.model = model
        self.lifetime_s = lifetime_s
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._watchdog: threading.Timer | None = None

    # ---- lifecycle ----------------------------------------------------------------------
    @property
    def url(self) -> str:
        """Base URL for an OpenAI client (ends in ``/v1``)."""
        assert self._httpd is not None, "server not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def start(self) -> "ScriptedLLMServer":
        handler = type("Handler", (_Handler,), {"owner": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        self._watchdog = threading.Timer(self.lifetime_s, self.stop)
        self._watchdog.daemon = True
        self._watchdog.start()
        return self

    def stop(self) -> None:
        self._stop.set()  # wakes sleeping handlers
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._httpd is not None:
            httpd, self._httpd = self._httpd, None
            httpd.shutdown()
            httpd.server_close()

    def __enter__(self) -> "ScriptedLLMServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- scripting ----------------------------------------------------------------------
    def _next_item(self, body: dict) -> Item:
        with self._lock:
            index = len(self.requests)
            self.requests.append(body)
            if callable(self._script):
                script = self._script
            elif self._script:
                return self._script.pop(0)
            else:
                return self.default
        return script(body, index)

    def _enter(self) -> None:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def _leave(self) -> None:
        with self._lock:
            self.in_flight -= 1


class _Handler(BaseHTTPRequestHandler):
    owner: ScriptedLLMServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        pass

    def do_GET(self) -> None:
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            self._send(200, {"object": "list", "data": [{"id": self.owner.model, "object": "model"}]})
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            self._send(404, {"error": {"message": f"no route {self.path}"}})
            return
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._send(400, {"error": {"message": "request body is not JSON"}})
            return
        owner = self.owner
        owner._enter()
        try:
            item = owner._next_item(body)
            reply = (
                item if isinstance(item, Reply) else Reply(texts=item) if isinstance(item, list) else Reply(text=item)
            )
            if reply.delay_s and owner._stop.wait(reply.delay_s):
                return  # server stopping: drop the request
            n = int(body.get("n") or 1)
            if owner.reject_n and n > 1 and reply.status == 200:
                self._send(400, {"error": {"message": "n > 1 is not supported", "type": "invalid_request_error"}})
            elif reply.raw is not None:
                self._send(reply.status, reply.raw, reply.headers)
            elif reply.status != 200:
                error = {"message": f"scripted HTTP {reply.status}", "type": "scripted", "code": reply.status}
                self._send(reply.status, {"error": error}, reply.headers)
            else:
                self._send(200, _completion(body, reply, n, owner.model), reply.headers)
        finally:
            owner._leave()

    def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
            pass


def _completion(body: dict, reply: Reply, n: int, model: str) -> dict[str, Any]:
    texts = reply.texts or [reply.text]
    choices = [
        {
            "index": i,
            "message": {"role": "assistant", "content": texts[i % len(texts)]},
            "finish_reason": reply.finish_reason,
        }
        for i in range(n)
    ]
    usage = reply.usage or {"prompt_tokens": 10, "completion_tokens": 5 * n}
    usage = dict(usage, total_tokens=usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0))
    return {
        "id": f"chatcmpl-test-{id(reply)}",
        "object": "chat.completion",
        "created": 0,
        "model": body.get("model") or model,
        "choices": choices,
        "usage": usage,
    }
