"""A stand-in for vLLM's offline API (``LLM``, ``SamplingParams``) for CPU tests: what cudal1 hands
the engine is recorded, and the answers are scripted.

Put ``tests/fake_vllm`` first on the import path.  ``FAKE_VLLM_LOG``: a JSONL file that gets one
line per event — ``init`` (the constructor's keyword arguments, the process's ``RANK``), ``chat``
(how many prompts, the sampling parameters) and ``destroy`` (model-parallel groups torn down).
``FAKE_VLLM_ANSWERS``: a JSON list of completion texts, handed out in turn (every engine starts at
the first; one engine's ``n`` samples of a prompt are consecutive answers).  It loads no model and
needs no GPU; it is not a vLLM package to TRL (no distribution metadata).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

__version__ = "0.0.0+fake"


def record(event: str, **data: Any) -> None:
    path = os.environ.get("FAKE_VLLM_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"event": event, "rank": int(os.environ.get("RANK", "0")), **data}, default=str) + "\n")


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = 16
    extra: dict = field(default_factory=dict)

    def __init__(
        self, n: int = 1, temperature: float = 1.0, top_p: float = 1.0, max_tokens: int | None = 16, **extra: Any
    ):
        self.n, self.temperature, self.top_p, self.max_tokens, self.extra = n, temperature, top_p, max_tokens, extra


@dataclass
class CompletionOutput:
    text: str
    index: int = 0


@dataclass
class RequestOutput:
    outputs: list


class LLM:
    def __init__(self, model: str, **kwargs: Any) -> None:
        self.model, self.kwargs = model, kwargs
        record("init", model=model, kwargs=kwargs)
        path = os.environ.get("FAKE_VLLM_ANSWERS")
        self._answers = json.loads(open(path).read()) if path else ["fake answer"]
        self._next = 0

    def _answer(self) -> str:
        text = self._answers[self._next % len(self._answers)]
        self._next += 1
        return text

    def chat(self, messages: list, sampling_params: SamplingParams | None = None, use_tqdm: bool = True,
             **kwargs: Any) -> list[RequestOutput]:
        params = sampling_params or SamplingParams()
        record("chat", model=self.model, prompts=len(messages), params=asdict(params),
               roles=[[m["role"] for m in conv] for conv in messages[:1]])
        return [RequestOutput([CompletionOutput(self._answer(), i) for i in range(params.n)]) for _ in messages]
