"""Training: CUDA-L1's three stages on TRL (see ``docs/training.md``).

* :mod:`.collect` — stage 0: sample teachers (OpenAI-compatible endpoints) or read a published
  set, judge every program, keep only the verified ones, write chat-format JSONL with provenance.
* :mod:`.sft` — stage 1: TRL's ``SFTTrainer``, loss on assistant turns only, optional LoRA.
* :mod:`.ssl` — stage 2: rounds of generate → judge → keep successes → fine-tune.
* :mod:`.grpo` — stage 3: TRL's ``GRPOTrainer``; contrastive prompts built at sampling time from
  the run store; the judge as the reward (:mod:`.reward` shapes it).

The layer knows the judge only through :mod:`cudal1.harness`'s front door and the result types.
Everything heavy (``trl``, ``transformers``, ``peft``, ``datasets``, ``accelerate``) is the
``train`` extra, imported inside the functions that need it; :mod:`.reward`, :mod:`.config` and
this package import without it.  :func:`require_train` gives the one-line error naming the extra.
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
