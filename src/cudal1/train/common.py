"""Pieces every stage shares: device facts, report_to, LoRA, checkpoints and the final save.

Contract: :func:`save_final` leaves ``out`` a plain transformers model directory (``config.json``,
weights, tokenizer): LoRA adapters are merged first, so ``cudal1 optimize --policy hf
--model-path OUT`` (or ``vllm serve OUT``) uses it with no conversion step.  Intermediate
``checkpoint-N`` directories are the trainer's own (full models, or adapters under LoRA) and are
what ``--resume`` continues from.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from cudal1.train import MissingExtra

REPORT_TO = ("none", "tensorboard", "wandb", "mlflow")


def report_to(value: str | None) -> list[str] | str:
    """``--report-to`` (comma-separated) checked against :data:`REPORT_TO`; ``none`` when empty."""
    names = [v.strip() for v in (value or "none").split(",") if v.strip()]
    unknown = [n for n in names if n not in REPORT_TO]
    if unknown:
        raise ValueError(f"--report-to: unknown {', '.join(unknown)}; known: {', '.join(REPORT_TO)}")
    if "none" in names:
        return "none"
    probe = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
    import importlib.util

    absent = [n for n in names if importlib.util.find_spec(probe[n]) is None and not (
        n == "tensorboard" and importlib.util.find_spec("tensorboardX") is not None)]
    if absent:
        raise MissingExtra(f"--report-to {','.join(absent)} needs the {', '.join(absent)} package (pip install {' '.join(absent)})")
    return names


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def world_size() -> int:
    from cudal1.train.dist import world_size as ws

    return ws()


def peft_config(enabled: bool, lora) -> Any:
    if not enabled:
        return None
    from peft import LoraConfig as PeftLora

    targets: Any = lora.target_modules
    if targets != "all-linear":
        targets = [t.strip() for t in targets.split(",") if t.strip()]
    return PeftLora(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets, task_type="CAUSAL_LM")


def last_checkpoint(out: str | Path) -> Path | None:
    """The ``checkpoint-N`` directory with the highest N under ``out`` (None when there is none)."""
    out = Path(out)
    if not out.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in out.iterdir() if p.is_dir() and (m := re.fullmatch(r"checkpoint-(\d+)", p.name))]
    return max(found)[1] if found else None


def save_final(trainer, out: str | Path, tokenizer) -> Path:
    """Save the trained model to ``out`` as a plain model directory (LoRA merged).  Under several
    processes rank 0 writes (``should_save``) and every rank waits until it has, so whatever loads
    ``out`` next (the next stage, ssl's next round) finds it complete."""
    from cudal1.train.dist import barrier

    out = Path(out)
    model = trainer.accelerator.unwrap_model(trainer.model) if hasattr(trainer, "accelerator") else trainer.model
    if hasattr(model, "merge_and_unload"):  # a peft model: merge the adapters into the weights
        model = model.merge_and_unload()
    if trainer.args.should_save if hasattr(trainer.args, "should_save") else True:
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    barrier()
    return out


def warmup_kwargs(args_cls: type, ratio: float) -> dict[str, Any]:
    """A warmup ratio for ``args_cls`` (transformers < 5: ``warmup_ratio``; >= 5: a float ``warmup_steps``)."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(args_cls)}
    return {"warmup_ratio": ratio} if "warmup_ratio" in names else {"warmup_steps": float(ratio)}


def cuda_or_cpu_kwargs(args_cls: type, bf16: bool, gradient_checkpointing: bool) -> dict[str, Any]:
    """Precision and memory settings that only make sense on a GPU (dropped on a CPU).
    transformers >= 5 names gradient checkpointing ``activation_checkpointing``."""
    import dataclasses

    cuda = has_cuda()
    names = {f.name for f in dataclasses.fields(args_cls)}
    ckpt = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    return {"bf16": bool(bf16 and cuda), ckpt: bool(gradient_checkpointing and cuda), "use_cpu": not cuda}
