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
    from cudal1.train.stages.grpo import grpo_arguments

    cfg = load_config("grpo", "default")
    args = grpo_arguments(cfg, tmp_path, processes=8)
    assert args.use_vllm and args.vllm_mode == "colocate" and args.vllm_gpu_memory_utilization == pytest.approx(0.3)
    assert args.num_generations == cfg.group_size == 8
    # 8 prompts x 8 completions per optimizer step, spread over 8 ranks
    assert (
        args.per_device_train_batch_size * 8 * args.gradient_accumulation_steps == cfg.group_size * cfg.prompts_per_step
    )
    assert args.beta == pytest.approx(cfg.beta) and args.loss_type == cfg.loss_type
    with pytest.raises(ValueError, match="divisible"):
        grpo_arguments(cfg, tmp_path, processes=7)


@pytest.mark.parametrize(
    "name, kind, stage", [("ddp", "MULTI_GPU", None), ("zero2", "DEEPSPEED", 2), ("zero3", "DEEPSPEED", 3)]
)
def test_accelerate_configs_load_with_accelerate(name: str, kind: str, stage: int | None) -> None:
    from accelerate.commands.config.config_args import ClusterConfig

    cfg = ClusterConfig.from_yaml_file(str(CONFIGS / f"accelerate-{name}.yaml"))
    assert cfg.distributed_type.name == kind and cfg.num_processes == 8 and cfg.num_machines == 1
    assert (cfg.deepspeed_config or {}).get("zero_stage") == stage


@pytest.mark.parametrize("name", ["7b-8gpu", "32b-8gpu"])
def test_recipes_load_through_trl_and_accelerate_and_fit(tmp_path: Path, name: str) -> None:
    from accelerate.commands.config.config_args import ClusterConfig

    from cudal1.train.config import load_config
    from cudal1.train.recipes import H200_GIB, HEADROOM_GIB, RECIPES, fits, memory, shortfalls
    from cudal1.train.stages.grpo import grpo_arguments

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
    assert (accel.deepspeed_config.get("offload_optimizer_device") == "cpu") == recipe.optimizer_offload
    est = memory(recipe, cfg)
    assert fits(recipe, cfg) and est["total"] + HEADROOM_GIB <= H200_GIB
    assert est["judge_total"] + HEADROOM_GIB <= H200_GIB  # the judge's workers fit beside the held training state
    assert est["kv_tokens"] > 0 and est["micro_batch"] >= 1
    # presets that cannot fit are caught: the 32B model without ZeRO-3 sharding its optimizer, and either recipe
    # judging KernelBench level 1 beside everything it holds (no sleep mode, no offload)
    import dataclasses

    assert not fits(dataclasses.replace(recipe, zero_stage=2), cfg) or recipe.model.params < 10e9
    held = dataclasses.replace(recipe, optimizer_offload=False)
    awake = dataclasses.replace(cfg, trl={})
    assert any("while judging" in s for s in shortfalls(held, awake)), shortfalls(held, awake)


def test_lora_merge_and_offload_need_host_memory() -> None:
    import dataclasses

    from cudal1.train.config import load_config
    from cudal1.train.recipes import RECIPES, memory, shortfalls

    recipe = dataclasses.replace(RECIPES["32b-8gpu"], host_gib=64.0)
    cfg = load_config("grpo", recipe.grpo_preset, {"lora": True})
    est = memory(recipe, cfg)
    assert est["merge_host"] == pytest.approx(2 * recipe.model.params * 1.1 / 2**30)  # 67 GiB for 32B in bf16
    assert est["optimizer"] == est["gradients"] == est["reference"] == 0.0  # LoRA: frozen base, its own reference
    assert any("the host needs 67 GiB (LoRA merge 67" in s for s in shortfalls(recipe, cfg))
    full = memory(recipe, load_config("grpo", recipe.grpo_preset))
    assert full["offload_host"] == pytest.approx(12 * recipe.model.params / 2**30)  # Adam's state of 32B, on the host


def test_ssl_recipe_for_32b_is_valid() -> None:
    from cudal1.train.config import load_config

    cfg = load_config("ssl", "32b-8gpu")
    assert cfg.backend == "vllm" and 8 % cfg.vllm_tensor_parallel_size == 0 and cfg.sft.gradient_checkpointing


def test_a_run_that_does_not_fit_says_so_before_training(tmp_path: Path, monkeypatch) -> None:
    import json
    from types import SimpleNamespace

    import torch

    from cudal1.train.config import load_config
    from cudal1.train.preflight import memory_shortfalls

    shapes = {"7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                         intermediate_size=18944, vocab_size=152064),
              "32b": dict(hidden_size=5120, num_hidden_layers=64, num_attention_heads=40, num_key_value_heads=8,
                          intermediate_size=27648, vocab_size=152064)}
    for name, shape in shapes.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(shape))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # an H200, as far as the check can tell
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=139 * 2**30))
    cfg = load_config("grpo", "default")
    zero2 = SimpleNamespace(deepspeed={"zero_optimization": {"stage": 2}})
    judge, plan = SimpleNamespace(device="cuda", workers_per_gpu=1), SimpleNamespace(backend="local")
    assert memory_shortfalls(str(tmp_path / "7b"), cfg, zero2, judge, plan, 8) == []  # the 7B recipe
    short = memory_shortfalls(str(tmp_path / "32b"), cfg, zero2, judge, plan, 8)
    assert short and short[0].startswith("a training step needs")  # 32B on the 7B recipe's ZeRO-2
    awake = load_config("grpo", "default", {"trl": {}})  # the engine keeps its share while the judge runs
    short = memory_shortfalls(str(tmp_path / "7b"), awake, zero2, judge, plan, 8)
    assert len(short) == 1 and "while judging" in short[0] and "vllm_enable_sleep_mode" in short[0]
    assert memory_shortfalls(str(tmp_path / "7b"), awake, zero2, SimpleNamespace(device="cpu"), plan, 8) == []
    assert (
        memory_shortfalls("Qwen/Qwen2.5-Coder-7B-Instruct", cfg, zero2, judge, plan, 8) == []
    )  # a hub name: not looked up
