"""GPU tier: saves that load, under the engines large models train with (needs deepspeed for ZeRO-3).

Each job (tests/checkpoint_jobs.py, in a child process) trains a tiny model built from a config
for two steps in one process on the GPU, in bf16, and reloads what it saved with plain
transformers:

* DeepSpeed ZeRO-3: the final model and the intermediate checkpoint hold every tensor at its full
  shape, equal to the trained values gathered from the engine;
* ZeRO-3 with LoRA: the saved model is the base plus ``B @ A * alpha / r`` of the gathered
  adapters, on exactly the adapted weights;
* FSDP2 with a sharded state dict for checkpoints: the final model is gathered to a full one.

The same checks run on the CPU under two processes, with resume (tests/test_train_checkpoint.py).
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from checkpoint_jobs import LORA, check_full_model, check_lora_merge, run_job

pytestmark = pytest.mark.gpu


def test_zero3_save_reloads_full_trained_tensors_gpu(tmp_path):
    pytest.importorskip("deepspeed")
    summary = run_job("zero3", tmp_path, lora=False, timeout=420)
    assert summary["steps"] == 2
    check_full_model(tmp_path)


def test_zero3_lora_merge_gpu(tmp_path):
    pytest.importorskip("deepspeed")
    assert run_job("zero3", tmp_path, lora=True, timeout=420)["steps"] == 2
    check_lora_merge(tmp_path, LORA["alpha"] / LORA["r"], atol=1e-5)


def test_fsdp2_final_save_is_gathered_gpu(tmp_path):
    assert run_job("fsdp2", tmp_path, lora=False, timeout=420)["steps"] == 2
    check_full_model(tmp_path, checkpoints=())  # sharded checkpoints are for --resume, not for loading
