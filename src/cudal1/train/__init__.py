"""Training: CUDA-L1's stages on TRL (see ``docs/training.md``), in four rooms.

* ``stages/`` — the stages and what only one of them uses: :mod:`~cudal1.train.stages.collect`
  (stage 0: verified data from teachers or a published set), :mod:`~cudal1.train.stages.sft`
  (stage 1), :mod:`~cudal1.train.stages.ssl` (stage 2: generate, judge, keep the successes,
  fine-tune), :mod:`~cudal1.train.stages.grpo` (stage 3, with its contrastive prompts, collapse
  watch and exemplar seeding).
* ``evaluation/`` — evaluating a model: ``cudal1 evaluate``, its figures, and the same figures
  during GRPO.
* ``smoke/`` — ``--smoke`` on a CPU: the bundled task and programs, the tiny model, each stage
  on them, and the scripted OpenAI-compatible server.
* beside them, what several rooms use: :mod:`.config` (every stage's settings), :mod:`.judging`
  (rollouts through the run's recorded judge), :mod:`.reward`, :mod:`.generation`, :mod:`.dist`,
  :mod:`.checkpoint`, :mod:`.metrics`, :mod:`.common` (trainer arguments), :mod:`.heldout`,
  :mod:`.recipes` and :mod:`.preflight`.

The layer knows the judge only through :mod:`cudal1.recorded` and the result types.  Everything
heavy (``trl``, ``transformers``, ``peft``, ``datasets``, ``accelerate``) is the ``train`` extra,
imported inside the functions that need it; :mod:`.reward`, :mod:`.config` and this package import
without it.  :func:`require_train` gives the one-line error naming the extra.
"""

from __future__ import annotations

from cudal1.extras import EXTRAS, MissingExtra, missing, require

TRAIN_MODULES = EXTRAS["train"]


def missing_modules(modules: tuple[str, ...] = TRAIN_MODULES) -> list[str]:
    return missing(*modules)


def require_train(what: str = "cudal1 train", modules: tuple[str, ...] = TRAIN_MODULES) -> None:
    """Raise :class:`~cudal1.extras.MissingExtra` (one line, naming the extra) unless ``modules`` are importable."""
    require(what, *modules, extra="train")


__all__ = ["MissingExtra", "TRAIN_MODULES", "missing_modules", "require_train"]
