"""Saves that load: the final model and checkpoints as plain transformers directories, whatever
the engine (one process, DDP, DeepSpeed ZeRO-2/3, FSDP), LoRA merged.

Contract:

* :func:`save_final` writes ``out`` as a model directory that ``AutoModelForCausalLM.from_pretrained``
  (and ``vllm serve``, ``cudal1 evaluate --policy hf``) loads with every tensor at its full shape.
  It goes through the trainer's own ``save_model``, which gathers the state dict the way the
  engine needs: under ZeRO-3 DeepSpeed's 16-bit consolidation (``stage3_gather_16bit_weights_on_model_save``),
  under FSDP a full state dict (a run that checkpoints sharded, ``SHARDED_STATE_DICT``, is switched
  to a full state dict for this save, as accelerate documents).  Every rank must call it (the
  gathers are collectives); rank 0 writes, and every rank returns once the directory is complete.
* LoRA: the gathered adapter is saved to ``out/adapter`` (peft's format), then rank 0 loads the
  base model named in its ``adapter_config.json`` on the CPU, applies the adapter, merges it and
  saves the merged model to ``out``.  This needs host memory for the base model in its own dtype
  (about 2 bytes per parameter in bf16: 64 GB for 32B), not GPU memory.
* :func:`check_engine` refuses, before any training step, a ZeRO-3 run whose DeepSpeed config
  does not gather 16-bit weights on save: without it DeepSpeed writes only its partitioned
  checkpoint, and neither the checkpoints nor the final model would load.
* Intermediate ``checkpoint-N`` directories are the trainer's (``Trainer._save_checkpoint`` also
  goes through ``save_model``, so their weights are gathered too): full models, or adapters under
  LoRA (``cudal1 evaluate --policy hf --model-path OUT/checkpoint-N`` merges those when it loads
  them), plus the optimizer and engine state ``--resume`` needs.

Not covered: tensor-parallel (DeepSpeed AutoTP) sharding, and FSDP's CPU-offloaded full state
dict on a host without the memory for it.
"""

from __future__ import annotations

import json
import logging
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

log = logging.getLogger(__name__)

ADAPTER_DIR = "adapter"
WEIGHT_FILES = (
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
)


class CheckpointError(ValueError):
    """A run whose saves would not load (one line, naming the setting to change)."""


def last_checkpoint(out: str | Path) -> Path | None:
    """The ``checkpoint-N`` directory with the highest N under ``out`` (None when there is none)."""
    out = Path(out)
    if not out.is_dir():
        return None
    found = [
        (int(m.group(1)), p) for p in out.iterdir() if p.is_dir() and (m := re.fullmatch(r"checkpoint-(\d+)", p.name))
    ]
    return max(found)[1] if found else None


def has_weights(path: str | Path) -> bool:
    """Whether ``path`` holds a full model's weights (single file or sharded index)."""
    return any((Path(path) / name).is_file() for name in WEIGHT_FILES)


def is_adapter_dir(path: str | Path) -> bool:
    """A peft adapter directory (``adapter_config.json``) without a full model of its own."""
    path = Path(path)
    return (path / "adapter_config.json").is_file() and not (path / "config.json").is_file()


def _is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "merge_and_unload")


def check_engine(trainer: Any) -> None:
    """Raise :class:`CheckpointError` when the trainer's engine would save weights that do not
    load (ZeRO-3 without 16-bit gathering; see the module docstring).  Cheap; call it before
    ``trainer.train()``."""
    plugin = getattr(getattr(getattr(trainer, "accelerator", None), "state", None), "deepspeed_plugin", None)
    if plugin is None:
        return
    zero = (getattr(plugin, "deepspeed_config", None) or {}).get("zero_optimization", {})
    if zero.get("stage") == 3 and not zero.get("stage3_gather_16bit_weights_on_model_save"):
        raise CheckpointError("DeepSpeed ZeRO-3 saves need 16-bit gathering: set zero3_save_16bit_model: true in the "
                              "accelerate config (or stage3_gather_16bit_weights_on_model_save: true in the DeepSpeed "
                              "config); without it no checkpoint loads")


def _full_state_dict_for_fsdp(trainer: Any) -> None:
    """Under FSDP, make ``save_model`` gather a full state dict (it saves nothing for a sharded one)."""
    if not getattr(trainer, "is_fsdp_enabled", False):
        return
    plugin = trainer.accelerator.state.fsdp_plugin
    if "FULL_STATE_DICT" not in str(plugin.state_dict_type):
        plugin.set_state_dict_type("FULL_STATE_DICT")


def save_gathered(trainer: Any, target: str | Path) -> None:
    """The trainer's model, gathered as its engine needs, written to ``target`` by rank 0 (a full
    model, or the adapter of a peft model).  A collective: every rank calls it."""
    _full_state_dict_for_fsdp(trainer)
    trainer.save_model(str(target))


@contextmanager
def _plain_loading() -> Iterator[None]:
    """``from_pretrained`` as outside any engine: a ZeRO-3 run registers its DeepSpeed config
    process-wide, and transformers would then load the base partitioned (and refuse a device map)."""
    from transformers.integrations import deepspeed as hf_ds

    ref = getattr(hf_ds, "_hf_deepspeed_config_weak_ref", None)  # no public getter: kept to restore it
    live = ref() if ref is not None else None
    hf_ds.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        if live is not None:
            hf_ds.set_hf_deepspeed_config(live)


def merge_adapter(adapter: str | Path, out: str | Path, base: str | None = None) -> Path:
    """Load ``base`` (default: the adapter's ``base_model_name_or_path``) on the CPU, apply the
    peft adapter in ``adapter``, merge it and save the merged model to ``out``.  Returns ``out``."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapter, out = Path(adapter), Path(out)
    base = base or json.loads((adapter / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base:
        raise CheckpointError(f"{adapter}: adapter_config.json names no base model")
    with _plain_loading():
        model = AutoModelForCausalLM.from_pretrained(base, dtype="auto", device_map="cpu")  # the base's own dtype
        merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
        merged.save_pretrained(out)
    return out


def save_final(trainer: Any, out: str | Path, tokenizer: Any) -> Path:
    """Save the trained model to ``out`` as a plain model directory, LoRA merged (see the module
    docstring).  Every rank calls it; every rank returns once rank 0 has written ``out``."""
    from cudal1.train.dist import barrier

    out = Path(out)
    model = trainer.accelerator.unwrap_model(trainer.model) if hasattr(trainer, "accelerator") else trainer.model
    lora = _is_peft(model)
    target = out / ADAPTER_DIR if lora else out
    save_gathered(trainer, target)
    if getattr(trainer.args, "should_save", True):
        if lora:
            merge_adapter(target, out)
        elif not has_weights(out):
            raise CheckpointError(f"the trainer saved no model weights to {out} (engine state only)")
        tokenizer.save_pretrained(out)
    barrier()
    return out


__all__ = ["ADAPTER_DIR", "CheckpointError", "check_engine", "has_weights", "is_adapter_dir", "last_checkpoint",
           "merge_adapter", "save_final", "save_gathered"]
