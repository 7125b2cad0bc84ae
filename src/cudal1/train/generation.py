"""Offline generation for self-supervised rounds and evaluation: vLLM when chosen (or installed),
else transformers; work sharded over the training processes.

Contract:

* :func:`shard` splits ``n`` work items (task x sample slots) over ``world`` processes whose vLLM
  engines span ``tp`` GPUs each (``world`` a multiple of ``tp``): the ranks of one engine group
  (``rank // tp``) generate the same contiguous block of items together (vLLM's
  ``external_launcher`` mode, one seed per group, so every rank of the group holds the same
  outputs), and each rank then judges its own share of that block (every ``tp``-th item).  With
  ``tp == 1`` each rank generates and judges its own block.  Every item is generated once and
  judged once over all ranks.
* :func:`generate` returns one completion text per prompt (prompts repeat for several samples)
  from a local model directory: :class:`VLLMEngine` (``vllm.LLM``; tensor parallelism, memory
  share and context length from the settings), or the ``hf`` policy (transformers).
* :class:`VLLMPolicy` is the same engine behind the policy interface (``generate(prompts, n)``),
  for ``cudal1 evaluate --policy vllm``.

Engine teardown between rounds frees the GPU memory vLLM took (``del`` the engine, its model
parallel groups destroyed, the CUDA cache emptied) before the round's fine-tuning starts.

Tested on the CPU against a fake ``vllm`` package (``tests/fake_vllm``) that records what the
engine is given — tensor-parallel size, memory share, context length, seed, executor, sampling
settings — and answers from a script; the real engine's behaviour (its memory, its teardown) is
vLLM's and is not exercised there.
"""

from __future__ import annotations

import gc
import importlib.util
import logging
from dataclasses import dataclass
from typing import Any

from cudal1.config import SAMPLING_TEMPERATURE
from cudal1.types import Completion, Prompt

log = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class Shard:
    """One rank's part of ``n`` items (see :func:`shard`)."""

    generate: range  # items this rank's engine group generates (the same block on every rank of the group)
    judge: list[int]  # items this rank judges (a subset of ``generate``)
    group: int  # engine group index (ranks sharing one vLLM engine)
    groups: int


def shard(n: int, rank: int, world: int, tp: int = 1) -> Shard:
    """Split ``n`` items over ``world`` ranks in engine groups of ``tp`` (see the module docstring)."""
    if tp < 1 or world < 1 or world % tp or not 0 <= rank < world:
        raise ValueError(f"cannot shard over world {world} with tensor parallel size {tp} (rank {rank})")
    groups, group, member = world // tp, rank // tp, rank % tp
    size, extra = divmod(n, groups)
    start = group * size + min(group, extra)
    block = range(start, start + size + (1 if group < extra else 0))
    return Shard(block, list(block)[member::tp], group, groups)


def use_vllm(backend: str) -> bool:
    """Whether ``backend`` means vLLM here (``auto``: when it is installed); raises ValueError for
    ``vllm`` without the package."""
    installed = importlib.util.find_spec("vllm") is not None
    if backend == "vllm" and not installed:
        raise ValueError("generation backend 'vllm' needs the vllm package (pip install vllm)")
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


def generate(model: str, prompts: list[Prompt], settings: GenerationSettings, *, seed: int, world: int = 1) -> list[str]:
    """One completion text per prompt from ``model`` (see the module docstring).  Under several
    processes with vLLM every rank must call it, with or without prompts: starting the engines is
    collective."""
    vllm = use_vllm(settings.backend)
    if not prompts and not (vllm and world > 1):
        return []
    if vllm:
        engine = VLLMEngine(model, settings, seed=seed, world=world)
        try:
            return [batch[0] for batch in engine.texts(prompts)] if prompts else []
        finally:
            engine.close()
    from cudal1.policy.hf_policy import HFPolicy

    policy = HFPolicy(model_path=model, temperature=settings.temperature, top_p=settings.top_p,
                      max_tokens=settings.max_new_tokens, batch_size=settings.batch_size, seed=seed)
    try:
        return [batch[0].text for batch in policy.generate(prompts, 1)]
    finally:
        policy.close()


class VLLMPolicy:
    """The policy interface over :class:`VLLMEngine` (``cudal1 evaluate --policy vllm``): ``n``
    samples per prompt in one offline batch; a failed batch becomes error completions."""

    name = "vllm"

    def __init__(self, model_path: str, settings: GenerationSettings, seed: int = 0) -> None:
        use_vllm("vllm")
        self.model = model_path
        self.engine = VLLMEngine(model_path, settings, seed=seed)

    def generate(self, prompts: list[Prompt], n: int | None = None) -> list[list[Completion]]:
        n = 1 if n is None else n
        try:
            texts = self.engine.texts(prompts, n)
        except Exception as exc:  # noqa: BLE001 - the policy contract: failures are recorded, never raised
            error = f"generation failed: {type(exc).__name__}: {str(exc)[:500]}"
            return [[Completion(text="", policy=self.name, model=self.model, error=error) for _ in range(n)] for _ in prompts]
        return [[Completion(text=t, policy=self.name, model=self.model) for t in batch] for batch in texts]

    def close(self) -> None:
        self.engine.close()


__all__ = ["GenerationSettings", "Shard", "VLLMEngine", "VLLMPolicy", "engine_tp", "generate", "shard", "use_vllm"]
