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
  from a local model directory: the vLLM engine (:mod:`cudal1.policy.vllm_policy`; tensor
  parallelism, memory share and context length from the settings), or the ``hf`` policy
  (transformers).  The engine is closed after each call, so its GPU memory is free before the
  round's fine-tuning starts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from cudal1.policy.vllm_policy import GenerationSettings, VLLMEngine, engine_tp, use_vllm
from cudal1.types import Prompt

log = logging.getLogger(__name__)


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


def generate(
    model: str, prompts: list[Prompt], settings: GenerationSettings, *, seed: int, world: int = 1
) -> list[str]:
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


__all__ = ["GenerationSettings", "Shard", "VLLMEngine", "engine_tp", "generate", "shard", "use_vllm"]
