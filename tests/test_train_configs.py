"""The shipped configurations for real runs (docs/training.md) load through the engines
themselves: the GRPO preset becomes a valid TRL ``GRPOConfig`` with vLLM colocate generation for
one 8-GPU node, and every accelerate config (DDP, ZeRO-2, ZeRO-3) parses with accelerate's own
config class.  No GPU, vLLM or DeepSpeed needed: TRL and accelerate validate the fields."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl")

CONFIGS = Path(__file__).resolve().parent.parent / "src" / "cudal1" / "train" / "configs"


def test_grpo_default_preset_is_a_valid_trl_config_with_vllm_colocate(tmp_path: Path) -> None:
    from cudal1.train.config import load_config
    from cudal1.train.grpo import grpo_arguments

    cfg = load_config("grpo", "default")
    args = grpo_arguments(cfg, tmp_path, processes=8)
    assert args.use_vllm and args.vllm_mode == "colocate" and args.vllm_gpu_memory_utilization == pytest.approx(0.3)
    assert args.num_generations == cfg.group_size == 8
    # 8 prompts x 8 completions per optimizer step, spread over 8 ranks
    assert args.per_device_train_batch_size * 8 * args.gradient_accumulation_steps == cfg.group_size * cfg.prompts_per_step
    assert args.beta == pytest.approx(cfg.beta) and args.loss_type == cfg.loss_type
    with pytest.raises(ValueError, match="divisible"):
        grpo_arguments(cfg, tmp_path, processes=7)


@pytest.mark.parametrize("name, kind, stage", [("ddp", "MULTI_GPU", None), ("zero2", "DEEPSPEED", 2), ("zero3", "DEEPSPEED", 3)])
def test_accelerate_configs_load_with_accelerate(name: str, kind: str, stage: int | None) -> None:
    from accelerate.commands.config.config_args import ClusterConfig

    cfg = ClusterConfig.from_yaml_file(str(CONFIGS / f"accelerate-{name}.yaml"))
    assert cfg.distributed_type.name == kind and cfg.num_processes == 8 and cfg.num_machines == 1
    assert (cfg.deepspeed_config or {}).get("zero_stage") == stage
