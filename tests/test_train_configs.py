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


@pytest.mark.parametrize("name", ["7b-8gpu", "32b-8gpu"])
def test_recipes_load_through_trl_and_accelerate_and_fit(tmp_path: Path, name: str) -> None:
    from accelerate.commands.config.config_args import ClusterConfig

    from cudal1.train.config import load_config
    from cudal1.train.grpo import grpo_arguments
    from cudal1.train.recipes import H200_GIB, HEADROOM_GIB, RECIPES, fits, memory

    recipe = RECIPES[name]
    cfg = load_config("grpo", recipe.grpo_preset)
    args = grpo_arguments(cfg, tmp_path, processes=recipe.training_gpus)  # TRL's own class checks the settings
    assert args.use_vllm and args.vllm_mode == ("server" if recipe.vllm_gpus else "colocate")
    assert args.per_device_train_batch_size * recipe.training_gpus * args.gradient_accumulation_steps == \
        cfg.group_size * cfg.prompts_per_step
    accel = ClusterConfig.from_yaml_file(str(CONFIGS / f"{recipe.accelerate}.yaml"))
    assert accel.num_processes == recipe.training_gpus and accel.deepspeed_config["zero_stage"] == recipe.zero_stage
    if recipe.zero_stage == 3:  # saves that load (cudal1.train.checkpoint refuses ZeRO-3 without it)
        assert accel.deepspeed_config["zero3_save_16bit_model"] is True
    est = memory(recipe, cfg)
    assert fits(recipe, cfg) and est["total"] + HEADROOM_GIB <= H200_GIB
    assert est["kv_tokens"] > 0 and est["micro_batch"] >= 1
    # a preset that cannot fit is caught: the 32B model without ZeRO-3 sharding its optimizer
    import dataclasses

    assert not fits(dataclasses.replace(recipe, zero_stage=2), cfg) or recipe.model.params < 10e9


def test_ssl_recipe_for_32b_is_valid() -> None:
    from cudal1.train.config import load_config

    cfg = load_config("ssl", "32b-8gpu")
    assert cfg.backend == "vllm" and 8 % cfg.vllm_tensor_parallel_size == 0 and cfg.sft.gradient_checkpointing
