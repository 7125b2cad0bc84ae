"""Offline generation with vLLM: the engine (``vllm.LLM`` on a local model directory) and the
``vllm`` policy over it.

Contract: :class:`VLLMEngine` returns ``n`` texts per prompt with the settings' sampling,
tensor parallelism, memory share and context length; under several processes one engine spans a
group of ranks (``external_launcher``).  :meth:`VLLMEngine.close` frees the GPU memory vLLM took
(the engine dropped, its model-parallel groups destroyed, the CUDA cache emptied).
:class:`VLLMPolicy` is the engine behind the policy interface (registered as ``vllm``).
:class:`GenerationSettings` is what offline generation needs, also for the transformers
backend (:mod:`cudal1.train.generation` picks the backend and shards the work for training).

Tested on the CPU against a fake ``vllm`` package (``tests/fake_vllm``) that records what the
engine is given and answers from a script; the real engine's behaviour (its memory, its teardown)
is vLLM's and is not exercised there.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any

from cudal1.config import SAMPLING_TEMPERATURE
from cudal1.extras import is_available, require
from cudal1.policy.base import PolicyConfig, error_completion, resolve_config
from cudal1.types import Completion, Prompt


@dataclass(frozen=True)
class GenerationSettings:
    """What offline generation needs (from ``SSLConfig`` or ``evaluate``'s flags)."""

    backend: str = "auto"  # auto (vLLM when installed) | vllm | transformers
    temperature: float = SAMPLING_TEMPERATURE
    top_p: float = 0.95
    max_new_tokens: int = 4096
    batch_size: int = 8  # transformers: prompts per generate() batch
    tensor_parallel_size: int = 0  # vLLM GPUs per engine; 0: all visible GPUs alone, 1 per rank otherwise
    gpu_memory_utilization: float = 0.9  # vLLM: share of each engine GPU
    max_model_length: int | None = None  # vLLM context length; None: the model's own


def use_vllm(backend: str) -> bool:
    """Whether ``backend`` means vLLM here (``auto``: when it is installed); ``vllm`` without the
    package is :class:`~cudal1.extras.MissingExtra` (one line)."""
    installed = is_available("vllm")
    if backend == "vllm":
        require("generation backend 'vllm'", "vllm")
    return backend == "vllm" or (backend == "auto" and installed)


def engine_tp(settings: GenerationSettings, world: int) -> int:
    """The tensor-parallel size of each vLLM engine for ``world`` processes (the ``0`` default:
    every visible GPU in one process, one GPU per rank under several)."""
    if settings.tensor_parallel_size:
        return settings.tensor_parallel_size
    if world > 1:
        return 1
    import torch

    return max(1, torch.cuda.device_count())


class VLLMEngine:
    """``vllm.LLM`` on a local model directory; under several processes one engine per group of
    ``tp`` ranks (``external_launcher``: the ranks are the engine's workers, as TRL colocates it)."""

    def __init__(self, model: str, settings: GenerationSettings, *, seed: int, world: int = 1) -> None:
        from vllm import LLM

        self.settings, self.tp = settings, engine_tp(settings, world)
        kwargs: dict[str, Any] = dict(model=model, seed=seed, tensor_parallel_size=self.tp,
                                      gpu_memory_utilization=settings.gpu_memory_utilization,
                                      max_model_len=settings.max_model_length)
        if world > 1:
            kwargs["distributed_executor_backend"] = "external_launcher"
        self.llm = LLM(**kwargs)

    def texts(self, prompts: list[Prompt], n: int = 1) -> list[list[str]]:
        from vllm import SamplingParams

        s = self.settings
        params = SamplingParams(n=n, temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_new_tokens)
        outputs = self.llm.chat([p.messages() for p in prompts], params, use_tqdm=False)
        return [[o.text for o in out.outputs] for out in outputs]

    def close(self) -> None:
        if getattr(self, "llm", None) is None:
            return
        self.llm = None
        gc.collect()
        try:
            from vllm.distributed.parallel_state import destroy_model_parallel

            destroy_model_parallel()
        except (ImportError, AssertionError, RuntimeError):  # older vLLM, or groups already gone
            pass
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class VLLMPolicy:
    """The policy interface over :class:`VLLMEngine` (``cudal1 evaluate --policy vllm``): ``n``
    samples per prompt in one offline batch from ``model_path``, with the config's sampling
    settings (``temperature``, ``top_p``, ``max_tokens``, ``seed``) and ``tensor_parallel_size``; a
    failed batch becomes error completions."""

    name = "vllm"

    def __init__(self, config: PolicyConfig | None = None, **options: Any) -> None:
        self.config = cfg = resolve_config(config, options)
        use_vllm("vllm")
        settings = GenerationSettings(backend="vllm", temperature=cfg.temperature, top_p=cfg.top_p,
                                      max_new_tokens=cfg.max_tokens, tensor_parallel_size=cfg.tensor_parallel_size)
        self.model = cfg.model_path
        self.engine = VLLMEngine(cfg.model_path, settings, seed=cfg.seed or 0)

    def generate(self, prompts: list[Prompt], n: int | None = None) -> list[list[Completion]]:
        n = 1 if n is None else n
        try:
            texts = self.engine.texts(prompts, n)
        except Exception as exc:  # noqa: BLE001 - the policy contract: failures are recorded, never raised
            error = f"generation failed: {type(exc).__name__}: {str(exc)[:500]}"
            return [[error_completion(self.name, error, self.model) for _ in range(n)] for _ in prompts]
        return [[Completion(text=t, policy=self.name, model=self.model) for t in batch] for batch in texts]

    def close(self) -> None:
        self.engine.close()


__all__ = ["GenerationSettings", "VLLMEngine", "VLLMPolicy", "engine_tp", "use_vllm"]
