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
compares the saved directory with that (:func:`check_full_model`, :func:`check_lora_merge`).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
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




def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(engine: str, out: Path, lora: bool, env: dict | None = None, timeout: float = 300) -> dict:
    """Run tests/checkpoint_jobs.py in a child process; its JSON summary."""
    import os

    child_env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    child_env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **(env or {}))
    cmd = [sys.executable, __file__, engine, str(out), str(_port())] + (["--lora"] if lora else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env)
    if proc.returncode != 0:
        raise AssertionError(proc.stderr[-4000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def _reloaded(path: Path) -> dict:
    from transformers import AutoModelForCausalLM

    return {k: v.detach() for k, v in AutoModelForCausalLM.from_pretrained(path).state_dict().items()}


def check_full_model(out: Path, checkpoint: bool = True) -> None:
    """The final model (and the last checkpoint, when ``checkpoint``) reload at full shape with the
    gathered trained values."""
    import torch

    base = _reloaded(out / "base")
    captured = _weights(out / "captured.safetensors")
    for where in [out / "sft"] + ([out / "sft" / "checkpoint-2"] if checkpoint else []):
        saved = _reloaded(where)
        assert set(saved) == set(base)
        for name, value in saved.items():
            assert value.shape == base[name].shape and value.numel() > 0, (where, name, value.shape)
            expected = captured[name].to(value.dtype)
            assert torch.equal(value.to(expected.dtype), expected), (where, name)
        assert sum(not torch.equal(saved[k].float(), base[k].float()) for k in base) > 10  # trained


def check_lora_merge(out: Path, alpha_over_r: float, atol: float = 1e-6) -> None:
    """The final model is the base plus the gathered adapters, merged into q_proj and v_proj only."""
    import torch

    base = _reloaded(out / "base")
    captured = _weights(out / "captured.safetensors")
    saved = _reloaded(out / "sft")
    assert set(saved) == set(base)
    merged = 0
    for name, value in saved.items():
        assert value.shape == base[name].shape, name
        module, kind = name.rsplit(".", 1)
        a = captured.get(f"base_model.model.{module}.lora_A.default.weight") if kind == "weight" else None
        if a is None:
            assert torch.equal(value.float(), base[name].float()), name  # not adapted: the base's value
            continue
        b = captured[f"base_model.model.{module}.lora_B.default.weight"]
        expected = base[name].float() + alpha_over_r * (b.float() @ a.float())
        assert torch.allclose(value.float(), expected, atol=atol, rtol=0), name
        assert not torch.equal(value.float(), base[name].float()), name  # B moved off zero in training
        merged += 1
    assert merged == 4  # q_proj and v_proj of two layers
    assert (out / "sft" / "adapter" / "adapter_config.json").is_file()


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
