"""Training jobs whose saved models the checkpoint tests reload (CPU: tests/test_train_checkpoint.py;
GPU: tests/gpu/test_zero3_save_gpu.py).

Each job runs in a child process of its own (``python tests/checkpoint_jobs.py ENGINE OUT PORT
[--lora]``): DeepSpeed and FSDP set up a process group and accelerate's process-wide state, which
must not leak into the test process.  It builds the smoke task's tiny model from a config (no
download), fine-tunes it for two steps with ``cudal1.train.sft.run_sft`` under ``ENGINE``
(``zero3``: DeepSpeed ZeRO-3 in one process, which partitions every parameter already; ``fsdp2``:
FSDP2 with a sharded state dict, GPU only), and writes ``OUT/captured.safetensors``: every
parameter's full trained value, gathered from the engine at the end of training (a callback),
with the names the trainer's model has (``base_model.model...`` under LoRA).  The test then
compares the saved directory with that.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ZERO3 = {"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True},
         "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
         "gradient_clipping": "auto", "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}}
FSDP2 = {"fsdp": "full_shard", "fsdp_config": {"version": 2, "state_dict_type": "SHARDED_STATE_DICT",
                                               "transformer_layer_cls_to_wrap": ["Qwen2DecoderLayer"]}}
LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "q_proj,v_proj"}


def engine_settings(engine: str) -> dict:
    """The ``trl:`` block that selects ``engine`` for one process."""
    if engine == "zero3":
        return {"deepspeed": ZERO3}
    if engine == "fsdp2":
        return FSDP2
    raise ValueError(f"unknown engine {engine!r}")


def _gathered(model) -> dict:
    """Every parameter of ``model`` at its full shape, on the CPU (a collective under the engines)."""
    params = dict(model.named_parameters())
    if any(hasattr(p, "ds_id") for p in params.values()):
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(params.values())):
            return {n: p.detach().to("cpu", copy=True).contiguous() for n, p in params.items()}
    full = {}
    for name, p in params.items():
        value = p.full_tensor() if hasattr(p, "full_tensor") else p  # FSDP2 parameters are DTensors
        full[name] = value.detach().to("cpu", copy=True).contiguous()
    return full


def run(engine: str, out: Path, port: int, lora: bool) -> dict:
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    from safetensors.torch import save_file
    from transformers import TrainerCallback

    from cudal1.train.config import load_config
    from cudal1.train.sft import run_sft
    from cudal1.train.smoke_stages import tiny_base, verified_records

    captured: dict = {}

    class Capture(TrainerCallback):
        def on_train_end(self, args, state, control, model=None, **kwargs):
            captured.update(_gathered(model))

    records = verified_records()
    base = tiny_base(out / "base", records)
    overrides = {"max_steps": 2, "save_steps": 1, "save_total_limit": 2, "learning_rate": 1e-2,
                 "trl": engine_settings(engine), "lora": lora, "lora_config": LORA}
    cfg = load_config("sft", "smoke", overrides)
    summary = run_sft(str(base), records, cfg, out / "sft", callbacks=(Capture(),))
    save_file(captured, str(out / "captured.safetensors"))
    return summary | {"base": str(base), "captured": len(captured)}


if __name__ == "__main__":
    engine_, out_, port_ = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    print(json.dumps(run(engine_, out_, port_, "--lora" in sys.argv[4:])), flush=True)
