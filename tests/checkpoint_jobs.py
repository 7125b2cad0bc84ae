"""Training jobs whose saved models the checkpoint tests reload (CPU: tests/test_train_checkpoint.py;
GPU: tests/gpu/test_zero3_save_gpu.py).

Each job runs in processes of its own — one (``python tests/checkpoint_jobs.py ENGINE OUT PORT``)
or two on gloo (``torchrun --nproc_per_node 2 tests/checkpoint_jobs.py ...``): DeepSpeed and FSDP
set up a process group and accelerate's process-wide state, which must not leak into the test
process.  A job builds the smoke task's tiny model from a config (no download) and fine-tunes it
with ``cudal1.train.stages.sft.run_sft`` under ``ENGINE`` (``zero3``: DeepSpeed ZeRO-3, which partitions
every parameter even in one process; ``fsdp2``: FSDP2 with a sharded state dict for checkpoints)
for ``--steps`` steps, saving a checkpoint every ``--save-steps``.  It writes
``OUT/captured.safetensors``: every parameter's full trained value, gathered from the engine at the
end of training (a callback; a collective under two processes), with the names the trainer's model
has (``base_model.model...`` under LoRA).  ``--resume`` continues from the last checkpoint in
``OUT/sft`` instead of starting afresh.  The test then compares the saved directory with that
(:func:`check_full_model`, :func:`check_lora_merge`, :func:`check_same_weights`).

FSDP on the CPU: accelerate enables FSDP only for accelerator process groups (a CPU group gets
plain DDP, silently); :func:`_fsdp_on_cpu` makes it treat the gloo group as it treats a GPU group,
so the same trainer, ``fully_shard`` and state-dict code runs (only the device differs).
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
    """The ``trl:`` block that selects ``engine``."""
    if engine == "zero3":
        return {"deepspeed": ZERO3}
    if engine == "fsdp2":
        return FSDP2
    raise ValueError(f"unknown engine {engine!r}")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(engine: str, out: Path, lora: bool, env: dict | None = None, timeout: float = 300, procs: int = 1,
            steps: int = 2, save_steps: int = 1, resume: bool = False) -> dict:
    """Run tests/checkpoint_jobs.py in ``procs`` processes of its own; its JSON summary (rank 0's)."""
    child_env = {k: v for k, v in os.environ.items()
                 if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    child_env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **(env or {}))
    port = _port()
    args = [__file__, engine, str(out), str(port), "--steps", str(steps), "--save-steps", str(save_steps)]
    args += (["--lora"] if lora else []) + (["--resume"] if resume else [])
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(procs), "--master_addr",
                "127.0.0.1", "--master_port", str(port)] if procs > 1 else [sys.executable]
    proc = subprocess.run(launcher + args, capture_output=True, text=True, timeout=timeout, env=child_env)
    if proc.returncode != 0:
        raise AssertionError(proc.stderr[-4000:])
    summaries = [line for line in proc.stdout.splitlines() if line.startswith('{"job"')]
    assert len(summaries) == 1, proc.stdout[-2000:]  # rank 0 alone reports
    return json.loads(summaries[0])


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def _reloaded(path: Path) -> dict:
    from transformers import AutoModelForCausalLM

    return {k: v.detach() for k, v in AutoModelForCausalLM.from_pretrained(path).state_dict().items()}


def check_full_model(out: Path, checkpoints: tuple[str, ...] = ("checkpoint-2",)) -> None:
    """The final model (and ``checkpoints``, when they hold a full model) reload at full shape with
    the gathered trained values."""
    import torch

    base = _reloaded(out / "base")
    captured = _weights(out / "captured.safetensors")
    for where in [out / "sft"] + [out / "sft" / c for c in checkpoints]:
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


def check_same_weights(a: Path, b: Path, atol: float = 1e-6) -> int:
    """Two runs' gathered weights agree tensor by tensor; returns how many tensors were compared."""
    import torch

    wa, wb = _weights(a), _weights(b)
    assert set(wa) == set(wb)
    for name in wa:
        assert torch.allclose(wa[name].float(), wb[name].float(), atol=atol, rtol=0), name
    return len(wa)


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


def _fsdp_on_cpu() -> None:
    """Let accelerate enable FSDP for a CPU (gloo) process group, as it does for a GPU group."""
    import torch
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    if torch.cuda.is_available():
        return
    init = AcceleratorState.__init__

    def patched(self, *args, fsdp_plugin=None, **kwargs):
        init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type, self.fsdp_plugin = DistributedType.FSDP, fsdp_plugin
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    AcceleratorState.__init__ = patched


def run(engine: str, out: Path, port: int, lora: bool, steps: int, save_steps: int, resume: bool) -> dict:
    if "RANK" not in os.environ:  # one process: what torchrun would set
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    if engine == "fsdp2":
        _fsdp_on_cpu()
    from safetensors.torch import save_file
    from transformers import TrainerCallback

    from cudal1.train import dist
    from cudal1.train.config import load_config
    from cudal1.train.smoke.stages import tiny_base, verified_records
    from cudal1.train.stages.sft import run_sft

    captured: dict = {}
    engine_seen: dict = {"steps_run": 0}

    class Capture(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            params = list(model.parameters())
            engine_seen.update(deepspeed=any(hasattr(p, "ds_id") for p in params),
                               fsdp2=any(hasattr(p, "full_tensor") for p in params))

        def on_step_end(self, args, state, control, **kwargs):
            engine_seen["steps_run"] += 1

        def on_train_end(self, args, state, control, model=None, **kwargs):
            captured.update(_gathered(model))

    records = verified_records()
    base = tiny_base(out / "base", records)
    overrides = {"max_steps": steps, "save_steps": save_steps, "save_total_limit": 4, "learning_rate": 1e-2,
                 "batch_size": 1, "gradient_accumulation_steps": 1, "trl": engine_settings(engine), "lora": lora,
                 "lora_config": LORA}
    cfg = load_config("sft", "smoke", overrides)
    summary = run_sft(str(base), records, cfg, out / "sft", callbacks=(Capture(),), resume=resume)
    if dist.is_main():
        save_file(captured, str(out / "captured.safetensors"))
    dist.barrier()
    return {"job": engine, **summary, "base": str(base), "captured": len(captured), "world_size": dist.world_size(),
            **engine_seen}


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("engine")
    p.add_argument("out", type=Path)
    p.add_argument("port", type=int)
    p.add_argument("--lora", action="store_true")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--save-steps", type=int, default=1)
    a = p.parse_args()
    summary = run(a.engine, a.out, a.port, a.lora, a.steps, a.save_steps, a.resume)
    from cudal1.train import dist

    if dist.is_main():
        print(json.dumps(summary), flush=True)
    dist.finish()
    dist.leave(0)
