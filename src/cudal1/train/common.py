"""Pieces every stage shares: device facts, report_to, LoRA settings, trainer arguments.
Checkpoints and the final save are :mod:`.checkpoint`'s."""

from __future__ import annotations

from typing import Any

REPORT_TO = ("none", "tensorboard", "wandb", "mlflow")


def report_to(value: str | None) -> list[str] | str:
    """``--report-to`` (comma-separated) checked against :data:`REPORT_TO`; ``none`` when empty."""
    names = [v.strip() for v in (value or "none").split(",") if v.strip()]
    unknown = [n for n in names if n not in REPORT_TO]
    if unknown:
        raise ValueError(f"--report-to: unknown {', '.join(unknown)}; known: {', '.join(REPORT_TO)}")
    if "none" in names:
        return "none"
    from cudal1.extras import is_available, require

    for name in names:  # transformers' TensorBoard callback takes tensorboardX too
        if not (name == "tensorboard" and is_available("tensorboardX")):
            require(f"--report-to {name}", name)
    return names


def check_model(model: str) -> None:
    """FileNotFoundError (one line) when ``model`` names a local path that does not exist; a hub
    name (``org/name``, no such local path) is left to the loader."""
    import os
    from pathlib import Path

    text = str(model)
    if Path(text).exists():
        return
    if os.path.isabs(text) or text.startswith((".", "~")) or text.count("/") > 1 or os.sep + os.sep in text:
        raise FileNotFoundError(f"no such model directory: {text}")


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
    return PeftLora(
        r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets, task_type="CAUSAL_LM"
    )


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


def trainer_arguments(
    cls: type, ours: dict[str, Any], defaults: dict[str, Any], extra: dict[str, Any], where: str
) -> Any:
    """``cls(**defaults | extra | ours)``: a TRL config from cudal1's settings (``ours``: each
    key -> value, set from a cudal1 field or pinned because cudal1's code depends on it), its
    overridable ``defaults``, and the config's ``trl:`` block ``extra`` (any other field of
    ``cls``).  TRL's own class validates the result.  Raises
    :class:`~cudal1.config.ConfigError` (one line) for a ``trl:`` key that is not a field of
    ``cls``, one cudal1 sets itself, or values ``cls`` refuses."""
    import dataclasses

    from cudal1.config import ConfigError

    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(extra) - names)
    if unknown:
        raise ConfigError(
            f"{where}.trl: {', '.join(unknown)} {'is not a field' if len(unknown) == 1 else 'are not fields'} "
            f"of trl.{cls.__name__}"
        )
    taken = sorted(set(extra) & set(ours))
    if taken:
        raise ConfigError(f"{where}.trl: {', '.join(taken)} {'is' if len(taken) == 1 else 'are'} set by cudal1 itself; "
                          f"use the {where} config's own fields")
    try:
        args = cls(**(defaults | extra | ours))
    except (TypeError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"{where}: trl.{cls.__name__} refused the settings: {first}") from None
    if getattr(args, "deepspeed", None):
        deepspeed_comm()
    return args


def deepspeed_comm() -> None:
    """Under several processes, give DeepSpeed's communication layer the process group that exists.

    cudal1's barriers may set the group up (through ``accelerate.PartialState``) before a trainer
    whose ``deepspeed`` setting comes from the ``trl:`` block (``torchrun`` rather than ``accelerate
    launch`` with a DeepSpeed config) exists; the trainer then finds the state made and skips
    DeepSpeed's own initialisation, and ZeRO-3's loading sees a world of one process (its batch
    check fails).  ``deepspeed.init_distributed`` on an initialised group adopts it."""
    from cudal1.train import dist

    if not dist.distributed():
        return
    import torch.distributed as td

    dist.barrier()  # the group exists from here on
    import deepspeed

    deepspeed.init_distributed(dist_backend=str(td.get_backend()))
