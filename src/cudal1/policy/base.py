"""The policy interface: given prompts, return completions.

Contract (every implementation):

- ``generate(prompts, n)`` returns one list per prompt, in prompt order, each holding exactly ``n``
  :class:`~cudal1.types.Completion` objects.  A failure (HTTP error after retries, timeout,
  malformed answer, generation exception) becomes ``Completion(text="", error=...)``
  (:func:`error_completion`): it is recorded, never raised and never dropped, and a resumed
  search asks again.  A policy with nothing (more) to propose for a prompt (exhausted replay,
  builtin passes used up) answers :func:`declined_completion`: recorded, not asked again.
- ``generate`` may be called from several threads at once (the search loop optimizes the tasks of
  a suite concurrently); implementations bound their own resource use across calls.
- ``close()`` releases clients, threads and models; it is idempotent.
- Two kinds of answer.  LLM policies return text; the search loop parses the code out of it
  (:func:`cudal1.prompts.parse_response`).  Policies that write the code themselves (``builtin``)
  return a :class:`Proposal`, whose ``code`` the loop takes as is: no markdown, no parsing.
- The search loop sends :class:`PoolPrompt` objects: the prompt plus the task's reference source
  and its verified pool (:class:`PoolEntry`, slowest first, the reference anchor marked by
  ``reference``), for policies that build on earlier candidates.  LLM policies read only the
  messages.
- A policy whose first round does not read the anchor's verdict (its round-1 proposals are the
  same with or without the judged reference in the pool) may say so with a class attribute
  ``first_round_blind = True``: the search loop then judges the anchors in round 1's batch
  instead of a batch of their own (one batch, so the round's long jobs and the anchors' short ones
  share the GPU's lanes).  Absent, the anchors are judged first and round 1 sees them.
- Constructors *do* raise on bad configuration (missing extra, unknown option, missing file,
  no API key for a hosted endpoint): a misconfigured run must fail before it spends anything.

Not covered here: prompt construction and response parsing (``cudal1.prompts``) and judging
(``cudal1.harness``, which policies never import).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from cudal1.config import SAMPLING_TEMPERATURE, Config, ConfigError
from cudal1.types import Completion, Prompt

POLICY_NAMES = ("builtin", "openai", "hf", "replay", "vllm")


@dataclass
class Proposal(Completion):
    """A completion whose candidate code the policy wrote itself (no LLM): ``code`` is the whole
    candidate module and is judged as is.  ``text`` is only a readable account of how it was made
    (recorded as the response and its analysis); nothing is parsed out of it.  A failure is still
    ``Completion(text="", error=...)`` (:func:`error_completion`)."""

    code: str = ""


@dataclass(frozen=True)
class PoolEntry:
    """One verified (``ok``) candidate of a task, as the search loop shows it to a policy."""

    code: str  # the candidate module
    speedup: float  # measured speedup over the reference (the anchor's own is about 1.0)
    reference: bool = False  # the task's reference judged as itself: the 1.00x anchor of the pool


@dataclass(frozen=True)
class PoolPrompt(Prompt):
    """A :class:`~cudal1.types.Prompt` with what a code-writing policy builds on."""

    pool: tuple[PoolEntry, ...] = ()  # the task's verified candidates, slowest first (best last)
    reference_class: str = ""  # the reference's measured class (cudal1.profile: launch-bound, ...); "" unmeasured
    reference_work: str = ""  # what its kernel time goes to (profile.rules.work_of: conv, gemm, +tail); "" unmeasured

    @classmethod
    def of(cls, prompt: Prompt, **fields: Any) -> "PoolPrompt":
        """``prompt`` (its messages and provenance unchanged) with ``fields`` (``pool``,
        ``task_source``, ...) set."""
        base = {f.name: getattr(prompt, f.name) for f in dataclasses.fields(Prompt)}
        return cls(**(base | fields))

    def above_reference(self) -> list[PoolEntry]:
        """Entries measured faster than the reference anchor, best first; when the anchor is not
        in the pool (a search without it: ``SearchConfig.anchor`` off), those above 1.00x, the
        reference's own speedup."""
        anchored = any(e.reference for e in self.pool)
        out: list[PoolEntry] = []
        for entry in reversed(self.pool):
            if entry.reference or (not anchored and not (entry.speedup or 0.0) > 1.0):
                break
            out.append(entry)
        return out


@runtime_checkable
class Policy(Protocol):
    """Anything that turns prompts into completions (see the module docstring for the contract)."""

    name: str

    def generate(self, prompts: list[Prompt], n: int | None = None) -> list[list[Completion]]:
        """For each prompt, ``n`` completions (``None``: the policy's configured ``n``)."""
        ...

    def close(self) -> None:
        """Release resources; safe to call twice."""
        ...


@dataclass(frozen=True)
class PolicyConfig(Config):
    """Which policy proposes candidates and how: the ``policy`` section of a run's config.
    Field comments are the help text.

    Each policy reads the fields it needs and ignores the rest, so one resolved config can be
    saved with a run whatever the policy.  ``api_key`` is never logged, shown in ``repr`` or
    written by :meth:`to_dict`; prefer ``api_key_env`` (the *name* of the variable holding it).
    """

    SECTION = "policy"

    name: str = ""  # builtin | openai | hf | replay | vllm; "" = openai when an endpoint is configured, else builtin
    base_url: str = ""  # OpenAI-compatible endpoint, e.g. http://localhost:8000/v1; "" = client default
    model: str = ""  # model name sent to the endpoint; "" = the server's first listed model
    api_key_env: str = "OPENAI_API_KEY"  # name of the env var holding the API key
    api_key: str = field(default="", repr=False)  # explicit key (overrides api_key_env); never logged
    temperature: float = SAMPLING_TEMPERATURE  # sampling temperature; 0 = greedy (hf) / server-side greedy
    top_p: float = 0.95  # nucleus sampling mass
    max_tokens: int = 8192  # maximum new tokens per completion
    n: int = 1  # samples per prompt when generate() is called without n
    concurrency: int = 8  # maximum requests in flight per policy (shared by concurrent generate calls)
    max_retries: int = 5  # retries after the first attempt on 429/5xx/timeouts/connection errors
    timeout_s: float = 600.0  # per-request timeout (connect + read), seconds
    backoff_base_s: float = 1.0  # first retry waits about this long; doubles each retry, with jitter
    backoff_max_s: float = 60.0  # cap on one backoff wait (also caps a server's Retry-After)
    seed: int | None = None  # sampling seed (sent to the server; seeds torch for hf); None = unseeded
    extra_body: dict[str, Any] = field(default_factory=dict)  # extra JSON fields for the endpoint (e.g. vLLM top_k)
    replay_path: str = ""  # replay: JSONL file of {"task", "code"} (or "response"/"text") records
    model_path: str = ""  # hf and vllm: local model directory (what training writes)
    passes: list[str] = field(default_factory=list)  # builtin: pass names in the order to try them; [] = all
    device: str = "auto"  # hf and builtin: auto | cpu | cuda
    dtype: str = "auto"  # hf: auto | float32 | bfloat16 | float16
    batch_size: int = 8  # hf: prompts per generate() batch (each expands to n sequences)
    tensor_parallel_size: int = 0  # vllm: GPUs per engine; 0 = every visible GPU

    def validate(self) -> None:
        if self.name not in ("",) + POLICY_NAMES:
            raise ConfigError(f"unknown policy {self.name!r}; known: {', '.join(POLICY_NAMES)}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ConfigError("temperature must be >= 0 and top_p in (0, 1]")
        if self.tensor_parallel_size < 0:
            raise ConfigError("tensor_parallel_size must be >= 0")
        for name in ("max_tokens", "n", "concurrency", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1")
        if self.max_retries < 0:
            raise ConfigError("max_retries must be >= 0")
        if self.timeout_s <= 0 or self.backoff_base_s < 0 or self.backoff_max_s < 0:
            raise ConfigError("timeout_s must be positive and backoff times non-negative")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"device must be auto, cpu or cuda, not {self.device!r}")

    def to_dict(self) -> dict[str, Any]:
        """Everything except the secret (``api_key`` is reported only as set or not)."""
        d = super().to_dict()
        d["api_key"] = "<set>" if self.api_key else ""
        return d


def resolve_config(config: PolicyConfig | None, options: dict[str, Any]) -> PolicyConfig:
    """``config`` (or the defaults) with keyword ``options`` applied; unknown keys are errors."""
    return (config or PolicyConfig()).replace(**options)


def policy_settings(policy: Policy) -> dict[str, Any]:
    """What a run saves about ``policy`` (the ``policy`` section of ``OUT/config.yaml``, which
    :class:`PolicyConfig` reads back): its ``name``; its own ``settings()`` when it has that
    method (builtin: device and passes); else the fields of its :class:`PolicyConfig`
    (``policy.config``) with the model it actually uses.  Never an API key: ``api_key`` is left
    out (``api_key_env`` is only the variable's name)."""
    out: dict[str, Any] = {}
    settings = getattr(policy, "settings", None)
    config = getattr(policy, "config", None)
    if callable(settings):
        out.update(settings())
    elif isinstance(config, PolicyConfig):
        out.update(config.to_dict())
        model = getattr(policy, "model", None)
        if isinstance(model, str) and model:
            out["model"] = model  # the resolved one ("" in the config = the server's first model)
    out.pop("api_key", None)
    return {"name": getattr(policy, "name", type(policy).__name__)} | {k: v for k, v in out.items() if k != "name"}


class PolicyError(ValueError):
    """A policy configuration it cannot run with (one line, naming the flag that fixes it)."""


def policy_problem(cfg: PolicyConfig) -> str:
    """Why ``cfg`` cannot make its policy ('' when it can): what :func:`cudal1.policy.make_policy`
    checks before it builds anything."""
    import os

    name = cfg.name
    if name == "replay" and not cfg.replay_path:
        return "policy replay needs replay_path: the recorded candidates (--replay FILE.jsonl)"
    if name in ("hf", "vllm") and not (cfg.model_path or (name == "hf" and cfg.model)):
        return f"policy {name} needs model_path: a local model directory (--model-path DIR)"
    if name == "openai" and not (cfg.base_url or os.environ.get("OPENAI_BASE_URL") or cfg.api_key
                                 or os.environ.get(cfg.api_key_env)):
        return (f"policy openai needs an endpoint: --base-url URL (or $CUDAL1_BASE_URL), or an API key in "
                f"${cfg.api_key_env} for OpenAI's hosted one")
    if cfg.passes and name != "builtin":
        return "--passes applies to --policy builtin only"
    if cfg.tensor_parallel_size and name != "vllm":
        return "--tensor-parallel-size applies to --policy vllm only"
    return ""


def error_completion(policy: str, error: str, model: str = "", **meta: Any) -> Completion:
    """The recorded form of a failure: empty text, the reason in ``error``."""
    return Completion(text="", policy=policy, model=model, error=error or "unknown error", meta=dict(meta))


def declined_completion(policy: str, reason: str, model: str = "", **meta: Any) -> Completion:
    """A policy declining a request (nothing left to propose for this task: builtin passes
    exhausted, replay records used up): recorded like a failure (empty text, the reason in
    ``error``) but marked ``meta["declined"]``, so the search counts it as answered and a
    resumed run does not ask again."""
    return Completion(text="", policy=policy, model=model, error=reason or "declined", meta={**meta, "declined": True})


def wrap_code(code: str) -> str:
    """``code`` as a response the parser accepts: fenced as Python unless it already has a fence
    (for policies whose records may hold either code or a full LLM response, e.g. ``replay``)."""
    if "```" in code:
        return code
    return f"```python\n{code.rstrip()}\n```\n"
