"""CPU tier: saves that load.

* DeepSpeed ZeRO-3 (one process on the CPU: every parameter is already partitioned) trains the
  tiny model two steps; the final model and the intermediate checkpoint reload with plain
  transformers, every tensor at its full shape and equal to the trained value gathered from the
  engine (a ``model.save_pretrained`` of the unwrapped model writes zero-size tensors here).
* The same run with LoRA: the saved model is the base with ``B @ A * alpha / r`` added to exactly
  the adapted weights; the LoRA checkpoint is an adapter the ``hf`` policy merges when it loads it.
* A ZeRO-3 config without 16-bit gathering is refused before training; the ``trl:`` block of the
  training configs reaches TRL's classes, which check it.

FSDP is not here: accelerate turns FSDP on only for accelerator devices, never for a CPU process
group (tests/gpu/test_zero3_save_gpu.py runs it on a GPU).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("deepspeed")

HERE = Path(__file__).resolve().parent


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(engine: str, out: Path, lora: bool, env: dict | None = None, timeout: float = 300) -> dict:
    """Run tests/checkpoint_jobs.py in a child process; its JSON summary."""
    import os

    child_env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    child_env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **(env or {}))
    cmd = [sys.executable, str(HERE / "checkpoint_jobs.py"), engine, str(out), str(_port())] + (["--lora"] if lora else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def _reloaded(path: Path) -> dict:
    from transformers import AutoModelForCausalLM

    return {k: v.detach() for k, v in AutoModelForCausalLM.from_pretrained(path).state_dict().items()}


def check_full_model(out: Path, dtype=None) -> None:
    """The final model and the last checkpoint reload at full shape with the gathered trained values."""
    import torch

    base = _reloaded(out / "base")
    captured = _weights(out / "captured.safetensors")
    for where in (out / "sft", out / "sft" / "checkpoint-2"):
        saved = _reloaded(where)
        assert set(saved) == set(base)
        for name, value in saved.items():
            assert value.shape == base[name].shape and value.numel() > 0, (where, name, value.shape)
            expected = captured[name].to(dtype or value.dtype)
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


def test_zero3_final_and_checkpoint_reload_with_full_trained_tensors(tmp_path):
    summary = run_job("zero3", tmp_path, lora=False, env={"CUDA_VISIBLE_DEVICES": ""})
    assert summary["steps"] == 2 and summary["captured"] > 0
    check_full_model(tmp_path)


def test_zero3_lora_merge_and_adapter_checkpoint(tmp_path):
    from checkpoint_jobs import LORA

    summary = run_job("zero3", tmp_path, lora=True, env={"CUDA_VISIBLE_DEVICES": ""})
    assert summary["steps"] == 2
    check_lora_merge(tmp_path, LORA["alpha"] / LORA["r"])

    # an intermediate LoRA checkpoint is an adapter; the hf policy merges it when it loads it
    from cudal1.policy.hf_policy import HFPolicy
    from cudal1.prompts import build_prompt
    from cudal1.train import smoke
    from cudal1.train.checkpoint import is_adapter_dir

    ckpt = tmp_path / "sft" / "checkpoint-2"
    assert is_adapter_dir(ckpt)
    policy = HFPolicy(model_path=str(ckpt), max_tokens=4, temperature=0.0, device="cpu")
    try:
        [[completion]] = policy.generate([build_prompt(smoke.smoke_task(), [], "CPU")], 1)
    finally:
        policy.close()
    assert not completion.error
    assert not hasattr(policy._model, "peft_config")  # merged into a plain model


def test_zero3_without_16bit_gathering_is_refused_before_training(tmp_path, monkeypatch):
    from cudal1.train.checkpoint import CheckpointError, check_engine

    class Plugin:
        deepspeed_config = {"zero_optimization": {"stage": 3}}

    class State:
        deepspeed_plugin = Plugin()

    class Trainer:
        class accelerator:
            state = State()

    with pytest.raises(CheckpointError, match="zero3_save_16bit_model"):
        check_engine(Trainer())
    Plugin.deepspeed_config = {"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True}}
    check_engine(Trainer())
    Plugin.deepspeed_config = {"zero_optimization": {"stage": 2}}
    check_engine(Trainer())


def test_trl_block_reaches_trls_classes(tmp_path):
    from cudal1.config import ConfigError
    from cudal1.train.config import load_config
    from cudal1.train.grpo import grpo_arguments
    from cudal1.train.sft import sft_arguments

    sft = sft_arguments(load_config("sft", "smoke", {"trl": {"max_grad_norm": 0.25, "lr_scheduler_type": "linear"}}), tmp_path)
    assert sft.max_grad_norm == 0.25 and sft.lr_scheduler_type.value == "linear"  # a default cudal1 picks, overridden
    grpo = grpo_arguments(load_config("grpo", "smoke", {"trl": {"vllm_enable_sleep_mode": True, "mask_truncated_completions": True}}),
                          tmp_path)
    assert grpo.vllm_enable_sleep_mode and grpo.mask_truncated_completions
    with pytest.raises(ConfigError, match="not a field of trl.GRPOConfig"):
        grpo_arguments(load_config("grpo", "smoke", {"trl": {"num_generashuns": 4}}), tmp_path)
    with pytest.raises(ConfigError, match="num_generations is set by cudal1 itself"):
        grpo_arguments(load_config("grpo", "smoke", {"trl": {"num_generations": 4}}), tmp_path)
    with pytest.raises(ConfigError, match="trl.GRPOConfig refused"):
        grpo_arguments(load_config("grpo", "smoke", {"trl": {"generation_batch_size": 16, "steps_per_generation": 2}}), tmp_path)
    with pytest.raises(ConfigError, match="mapping"):
        load_config("grpo", "smoke", {"trl": ["max_grad_norm"]})
