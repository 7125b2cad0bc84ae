"""Stage 1: supervised fine-tuning on verified programs with TRL's ``SFTTrainer``.

Contract: :func:`run_sft` trains ``model`` (a hub name or a local directory; nothing is
downloaded unless the name is not a local path) on chat-format records (``messages``: system,
user, assistant — what ``cudal1 collect`` writes) with the loss on assistant turns only
(``assistant_only_loss``; TRL swaps in a training chat template with ``{% generation %}``
markers for the model families it knows, and refuses templates it cannot mask).  Optional LoRA
through peft.  Multi-GPU: launch the CLI with ``accelerate launch`` (configs in
``cudal1/train/configs/``) or ``torchrun``: every rank calls :func:`run_sft` (data-parallel; the
data file is read by rank 0 first, then from the datasets cache by the others); rank 0 writes
``metrics.jsonl`` and the final model, and every rank returns once it is saved.  Writes
``OUT/metrics.jsonl``, checkpoints ``OUT/checkpoint-N`` and the final model (LoRA merged, the
adapter kept in ``OUT/adapter``) in ``OUT`` through :func:`~cudal1.train.checkpoint.save_final`,
which gathers the weights under ZeRO-3 and FSDP; ``resume`` continues from the last checkpoint.
Any other ``trl.SFTConfig`` field goes in the config's ``trl:`` block.  Data that trains on a
KernelBench held-out task is refused unless ``allow_held_out`` (:mod:`cudal1.train.heldout`).

Not covered: packing and padding-free batching (off: kernels are long and few), evaluation sets.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from cudal1.train import dist, require_train
from cudal1.train.checkpoint import check_engine, last_checkpoint, save_final
from cudal1.train.common import check_model, cuda_or_cpu_kwargs, peft_config, trainer_arguments, warmup_kwargs
from cudal1.train.config import SFTConfig
from cudal1.train.metrics import metrics_callback, read_metrics

log = logging.getLogger(__name__)


def load_chat_data(data: Any):
    """A ``datasets.Dataset`` with one ``messages`` column from a JSONL path, a list of records or a
    Dataset.  Records need ``messages`` (system/user/assistant dicts); other fields are dropped."""
    from datasets import Dataset, load_dataset

    if isinstance(data, (str, Path)):
        path = Path(data)
        if not path.is_file():
            raise FileNotFoundError(f"no such data file: {path}")
        ds = load_dataset("json", data_files=str(path), split="train")
    elif isinstance(data, list):
        ds = Dataset.from_list([{"messages": r["messages"]} for r in data])
    else:
        ds = data
    if "messages" not in ds.column_names:
        raise ValueError(f"training data needs a 'messages' column (has: {', '.join(ds.column_names)})")
    if len(ds) == 0:
        raise ValueError("training data is empty")
    return ds.select_columns(["messages"])


def _records(data: Any):
    """The records of ``data`` as :func:`load_chat_data` takes it (a JSONL path, a list, a Dataset)."""
    if isinstance(data, (str, Path)):
        if not Path(data).is_file():
            raise FileNotFoundError(f"no such data file: {data}")
        from cudal1.jsonl import iter_jsonl

        return (rec for _, rec in iter_jsonl(data))
    return iter(data)


def sft_arguments(cfg: SFTConfig, out: str | Path, report_to: Any = "none"):
    """``trl.SFTConfig`` from ``cfg`` (its ``trl:`` block passed through; see
    :func:`~cudal1.train.common.trainer_arguments`)."""
    import trl

    ours: dict[str, Any] = dict(
        output_dir=str(out), assistant_only_loss=True, learning_rate=cfg.learning_rate, num_train_epochs=cfg.epochs,
        max_steps=cfg.max_steps, per_device_train_batch_size=cfg.batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps, max_length=cfg.max_length,
        weight_decay=cfg.weight_decay, logging_steps=cfg.logging_steps, save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit, seed=cfg.seed, report_to=report_to,
    )
    ours.update(cuda_or_cpu_kwargs(trl.SFTConfig, cfg.bf16, cfg.gradient_checkpointing))
    ours.update(warmup_kwargs(trl.SFTConfig, cfg.warmup_ratio))
    defaults = dict(lr_scheduler_type="cosine", save_strategy="steps", packing=False, dataset_num_proc=None,
                    disable_tqdm=True)
    return trainer_arguments(trl.SFTConfig, ours, defaults, cfg.trl, "sft")


def run_sft(model: str, data: Any, cfg: SFTConfig, out: str | Path, *, resume: bool = False, report_to: Any = "none",
            stage: str = "sft", callbacks: tuple = (), allow_held_out: bool = False,
            kernelbench: str | Path | None = None) -> dict[str, Any]:
    """Fine-tune ``model`` on ``data`` into ``out`` (see the module docstring).  Returns a summary.
    ``callbacks``: more ``transformers.TrainerCallback`` objects for the trainer.  Records of
    held-out tasks are refused (:func:`~cudal1.train.heldout.refuse_records`, every rank alike)
    unless ``allow_held_out``; ``kernelbench``: a local KernelBench copy whose held-out sources are
    matched too."""
    require_train("cudal1 train sft")
    import trl
    from transformers import AutoTokenizer

    if not allow_held_out:
        from cudal1.train.heldout import HeldOut, refuse_records

        refuse_records(_records(data), "train sft", HeldOut.load(kernelbench))
    check_model(model)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with dist.main_first():  # one rank builds the datasets cache entry for a JSONL file
        dataset = load_chat_data(data)
    tokenizer = AutoTokenizer.from_pretrained(model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    trainer = trl.SFTTrainer(
        model=str(model), args=sft_arguments(cfg, out, report_to), train_dataset=dataset, processing_class=tokenizer,
        peft_config=peft_config(cfg.lora, cfg.lora_config), callbacks=[metrics_callback(out, stage), *callbacks],
    )
    check_engine(trainer)
    checkpoint = last_checkpoint(out) if resume else None
    if resume and checkpoint is None:
        log.warning("--resume: no checkpoint in %s; starting from the beginning", out)
    result = trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    save_final(trainer, out, tokenizer)
    losses = [m["loss"] for m in read_metrics(out) if m.get("stage") == stage and m.get("loss") is not None]
    return {"out": str(out), "examples": len(dataset), "steps": int(result.global_step),
            "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
            "resumed_from": str(checkpoint) if checkpoint else None, "processes": int(trainer.args.world_size)}
