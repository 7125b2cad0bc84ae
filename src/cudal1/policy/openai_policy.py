"""``openai`` policy: any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, Ollama, hosted).

Contract: sends ``Prompt.messages()`` with the configured temperature, top_p, max_tokens (and seed
and ``extra_body`` when set), asks for ``n`` samples in one request and, when a server rejects
``n > 1`` (HTTP 400/422) or returns fewer choices than asked, makes the missing ones as separate
requests (and remembers that for later calls).  At most ``concurrency`` requests are in flight per
policy object, across concurrent ``generate`` calls.  The client's own retries are off; this module
retries 408/409/429/5xx, timeouts and connection errors ``max_retries`` times with exponential
backoff and jitter (honouring a server's ``Retry-After`` up to ``backoff_max_s``), logs each
retry at INFO and counts them (``retries``).  :func:`check_endpoint` is the one request a command
makes before any work, so that a dead endpoint fails in seconds.  Everything else (other 4xx,
malformed responses) fails at once.  Failures become error completions; a request that still fails
after its retries fails the rest of its prompt's samples with the same error instead of retrying each of them.

Recorded per completion: ``usage`` (the request's ``prompt_tokens``/``completion_tokens`` divided
evenly over its choices, so sums over completions equal what was billed; the undivided numbers are
in ``meta["request_usage"]``), ``latency_s`` (the successful attempt), and in ``meta`` the
``finish_reason``, ``attempts`` and ``wall_s`` (backoff included).

Not covered: streaming, tool calls, the Responses API, reasoning fields (``reasoning_content``
is ignored; only ``message.content`` is the answer).
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from cudal1.extras import require
from cudal1.policy.base import PolicyConfig, error_completion, resolve_config
from cudal1.types import Completion, Prompt

log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 409, 429}) | frozenset(range(500, 600))
_ERROR_CHARS = 500  # error messages are truncated: a server may echo a whole prompt back
HOSTED_URL = "https://api.openai.com/v1"  # the openai client's endpoint when none is configured
CHECK_TIMEOUT_S = 5.0


class EndpointUnreachable(Exception):
    """Nothing answers at an endpoint, or not the OpenAI API (one line naming the URL)."""


def endpoint_url(base_url: str | None) -> str:
    """The endpoint the client will talk to: ``base_url``, else ``$OPENAI_BASE_URL``, else OpenAI's."""
    return (base_url or os.environ.get("OPENAI_BASE_URL") or HOSTED_URL).rstrip("/")


def check_endpoint(url: str, timeout: float = CHECK_TIMEOUT_S) -> None:
    """One ``GET {url}/models``, no retry: raise :class:`EndpointUnreachable` when nothing answers
    there (connection refused, no route, DNS, ``timeout``) or the answer is 404: every
    OpenAI-compatible server (vLLM, SGLang, Ollama, llama.cpp, hosted APIs) lists its models
    there, so a 404 is a wrong base URL (one without ``/v1``, say) or something else answering in
    its place, and its chat requests would fail alike.  Any other HTTP answer, 401 included,
    counts as reachable: the chat endpoint's own errors are reported per request."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(f"{url.rstrip('/')}/models", timeout=timeout).close()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise EndpointUnreachable(f"{url} does not serve the OpenAI API: GET {url.rstrip('/')}/models "
                                      "answered 404 (a base URL without /v1?)") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise EndpointUnreachable(f"{url} is unreachable: {reason}") from None


@dataclass
class _Result:
    """One request's outcome after retries: completions, or an error."""

    completions: list[Completion] = field(default_factory=list)
    error: str = ""
    status: int | None = None


class OpenAIPolicy:
    """Chat completions from an OpenAI-compatible endpoint (see the module docstring)."""

    name = "openai"

    def __init__(self, config: PolicyConfig | None = None, **options: Any) -> None:
        require("the openai policy", "openai", extra="llm")
        import openai

        self.config = cfg = resolve_config(config, options)
        self._openai = openai
        base_url = cfg.base_url or os.environ.get("OPENAI_BASE_URL", "")
        key = cfg.api_key or os.environ.get(cfg.api_key_env, "")
        if not key:
            if not base_url:
                raise ValueError(
                    f"no API key for the hosted OpenAI endpoint: set ${cfg.api_key_env} (or name another "
                    "variable with --api-key-env), or give --base-url for a local server"
                )
            key = "EMPTY"  # local servers (vLLM, SGLang, Ollama) accept any key
        self._client = openai.OpenAI(api_key=key, base_url=base_url or None, timeout=cfg.timeout_s, max_retries=0)
        self._slots = threading.BoundedSemaphore(cfg.concurrency)
        self._n_supported: bool | None = None  # learned from the server: does it honour n > 1?
        self._closed = False
        self.retries = 0  # requests retried so far (each retry is logged at INFO: -v shows them)
        self._retry_lock = threading.Lock()
        self.model = cfg.model or self._discover_model()

    # ---- public ---------------------------------------------------------------------------
    def generate(self, prompts: list[Prompt], n: int | None = None) -> list[list[Completion]]:
        """For each prompt, ``n`` completions (``None``: ``config.n``); never raises for a failure."""
        n = self.config.n if n is None else n
        if n < 1 or not prompts:
            return [[] for _ in prompts]
        per_unit = n if self._n_supported is not False else 1
        units = [(i, per_unit) for i in range(len(prompts)) for _ in range(n // per_unit)]
        results: list[list[Completion]] = [[] for _ in prompts]
        workers = min(self.config.concurrency, len(units))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cudal1-openai") as pool:
            futures = [(i, pool.submit(self._sample, prompts[i], k)) for i, k in units]
            for i, fut in futures:
                try:
                    results[i].extend(fut.result())
                except Exception as exc:  # a bug here must still not lose the prompt's samples
                    log.exception("openai policy: unexpected failure")
                    results[i].append(error_completion(self.name, f"{type(exc).__name__}: {exc}", self.model))
        for comps in results:  # exactly n per prompt, whatever happened above
            comps[n:] = []
            while len(comps) < n:
                comps.append(error_completion(self.name, "missing sample", self.model))
        return results

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._client.close()

    def __enter__(self) -> "OpenAIPolicy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- one prompt's k samples -----------------------------------------------------------
    def _sample(self, prompt: Prompt, k: int) -> list[Completion]:
        out: list[Completion] = []
        n_rejected = False
        if k > 1 and self._n_supported is not False:
            res = self._request(prompt, k)
            if res.error and res.status in (400, 422):
                n_rejected = True  # maybe the n parameter; confirmed if a single request works
            elif res.error:
                return [error_completion(self.name, res.error, self.model) for _ in range(k)]
            else:
                out.extend(res.completions[:k])
                if len(res.completions) < k:
                    self._n_supported = False
                    log.info("openai policy: server returned %d of %d choices; asking one at a time", len(out), k)
                else:
                    self._n_supported = True
        while len(out) < k:
            res = self._request(prompt, 1)
            if res.error:  # already retried: fail the rest alike rather than hammer the server
                out.extend(error_completion(self.name, res.error, self.model) for _ in range(k - len(out)))
                break
            if n_rejected and self._n_supported is None:
                self._n_supported = False
                log.info("openai policy: server rejected n=%d; asking one sample per request", k)
            out.extend(res.completions[:1])
        return out

    def _request(self, prompt: Prompt, k: int) -> _Result:
        """One chat-completions request for ``k`` choices, retried as the module docstring says."""
        cfg, openai = self.config, self._openai
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": prompt.messages(),
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "max_tokens": cfg.max_tokens,
            "timeout": cfg.timeout_s,
        }
        if k > 1:
            kwargs["n"] = k
        if cfg.seed is not None:
            kwargs["seed"] = cfg.seed
        if cfg.extra_body:
            kwargs["extra_body"] = dict(cfg.extra_body)
        start = time.monotonic()
        for attempt in range(cfg.max_retries + 1):
            retry_after = 0.0
            try:
                with self._slots:
                    sent = time.monotonic()
                    response = self._client.chat.completions.create(**kwargs)
                    latency = time.monotonic() - sent
            except openai.APIStatusError as exc:
                status = exc.status_code
                error = f"HTTP {status}: {_message(exc)}"
                if status not in RETRYABLE_STATUS:
                    return _Result(error=error, status=status)
                retry_after = _retry_after(exc)
            except openai.APITimeoutError:
                status, error = None, f"timeout after {cfg.timeout_s:g}s"
            except openai.APIConnectionError as exc:
                status, error = None, f"connection error: {_message(exc)}"
            except Exception as exc:  # noqa: BLE001 - malformed response and the like: not transient, not retried
                return _Result(error=f"bad response: {type(exc).__name__}: {str(exc)[:_ERROR_CHARS]}")
            else:
                return self._parse(response, k, latency, attempt + 1, time.monotonic() - start)
            if attempt == cfg.max_retries:
                attempts = cfg.max_retries + 1
                return _Result(error=f"{error} (gave up after {attempts} attempt{'s' * (attempts > 1)})", status=status)
            delay = self._backoff(attempt, retry_after)
            with self._retry_lock:
                self.retries += 1
            log.info("openai policy: %s; retry %d/%d in %.2fs", error, attempt + 1, cfg.max_retries, delay)
            time.sleep(delay)
        raise AssertionError("unreachable")

    def _backoff(self, attempt: int, retry_after: float) -> float:
        cfg = self.config
        delay = min(cfg.backoff_max_s, cfg.backoff_base_s * 2**attempt)
        delay *= 0.5 + random.random() / 2  # jitter: concurrent requests do not retry in lockstep
        return max(delay, min(retry_after, cfg.backoff_max_s))

    def _parse(self, response: Any, k: int, latency: float, attempts: int, wall: float) -> _Result:
        choices = list(getattr(response, "choices", None) or [])
        if not choices:
            return _Result(error="bad response: no choices")
        usage_obj = getattr(response, "usage", None)
        request_usage = {
            key: int(getattr(usage_obj, key, 0) or 0) for key in ("prompt_tokens", "completion_tokens")
        } if usage_obj is not None else {}
        model = getattr(response, "model", None) or self.model
        completions = []
        for j, choice in enumerate(choices[:k]):
            message = getattr(choice, "message", None)
            text = getattr(message, "content", None) or ""
            meta = {
                "finish_reason": getattr(choice, "finish_reason", None),
                "attempts": attempts,
                "wall_s": wall,
                "request_usage": request_usage,
            }
            usage = {key: _share(total, j, len(choices)) for key, total in request_usage.items()}
            completions.append(
                Completion(text=text, policy=self.name, model=model, usage=usage, latency_s=latency, meta=meta)
            )
        return _Result(completions=completions)

    def _discover_model(self) -> str:
        """The server's first listed model (single-model servers such as vLLM); loud on failure."""
        try:
            models = self._client.models.list(timeout=min(self.config.timeout_s, 30.0))
            first = next(iter(models), None)
        except Exception as exc:  # noqa: BLE001 - any failure to list is one usage error
            raise ValueError(f"no --model given and listing the server's models failed: {_message(exc)}") from None
        if first is None:
            raise ValueError("no --model given and the server lists no models")
        log.info("openai policy: using the server's model %s", first.id)
        return str(first.id)


def _share(total: int, index: int, parts: int) -> int:
    """``total`` split over ``parts`` integers that sum to it (remainder to the first ones)."""
    return total // parts + (1 if index < total % parts else 0)


def _message(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return str(text)[:_ERROR_CHARS]


def _retry_after(exc: Any) -> float:
    """Seconds from a ``Retry-After`` header (the delta-seconds form only), else 0."""
    try:
        return max(0.0, float(exc.response.headers.get("retry-after", "")))
    except (AttributeError, TypeError, ValueError):
        return 0.0
