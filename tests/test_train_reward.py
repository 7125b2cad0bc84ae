"""Unit tier: GRPO reward shaping (pure functions) and the training config loader (strict keys)."""

from __future__ import annotations

import math

import pytest
import yaml

from cudal1.config import ConfigError
from cudal1.train.config import GRPOConfig, SFTConfig, SSLConfig, load_config, presets
from cudal1.train.reward import (
    FAILURE_KINDS,
    FORMAT,
    Outcome,
    RewardConfig,
    RunningStats,
    normalized,
    outcome_of,
    shape_rewards,
)
from cudal1.types import EvalResult, Status


def ok(s: float, degenerate: bool = False) -> Outcome:
    return Outcome("ok", s, degenerate)


def test_running_stats_window_mean_and_population_std():
    st = RunningStats(3)
    st.push([1.0, 2.0, 3.0, 4.0])  # 1.0 falls out of the window
    assert list(st.values) == [2.0, 3.0, 4.0]
    assert st.mean == pytest.approx(3.0)
    assert st.std == pytest.approx(math.sqrt(2 / 3))
    assert RunningStats(5).std == 0.0 and RunningStats(5).mean == 0.0


def test_normalized_is_z_score_clipped_at_k():
    cfg = RewardConfig(clip=1.5, min_std=0.01)
    st = RunningStats(10)
    st.push([1.0, 3.0])  # mean 2, std 1
    assert normalized(2.5, st, cfg) == pytest.approx(0.5)
    assert normalized(1.0, st, cfg) == pytest.approx(-1.0)
    assert normalized(10.0, st, cfg) == 1.5  # clipped at +k
    assert normalized(0.01, st, cfg) == -1.5  # clipped at -k


def test_min_std_floor_keeps_noise_from_becoming_k():
    cfg = RewardConfig(min_std=0.5)
    st = RunningStats(10)
    st.push([2.0, 2.0, 2.02])
    assert abs(normalized(2.02, st, cfg)) < 0.05  # not +1.5 although the std is tiny


def test_log_speedup_normalises_logs():
    cfg = RewardConfig(log_speedup=True, min_std=1e-6)
    st = RunningStats(10)
    rewards = shape_rewards([ok(1.0), ok(4.0)], st, cfg)
    assert list(st.values) == pytest.approx([0.0, math.log(4.0)])
    assert rewards == pytest.approx([-1.0, 1.0])


def test_batch_enters_the_statistics_before_it_is_scored():
    cfg = RewardConfig(min_std=1e-6)
    st = RunningStats(100)
    rewards = shape_rewards([ok(1.0), ok(3.0), Outcome("incorrect")], st, cfg)
    assert len(st) == 2  # failures never enter the statistics
    assert rewards[:2] == pytest.approx([-1.0, 1.0])
    assert rewards[2] == cfg.incorrect


def test_failures_get_fixed_negatives_and_rejected_is_lowest():
    cfg = RewardConfig()
    st = RunningStats(100)
    kinds = list(FAILURE_KINDS)
    rewards = shape_rewards([Outcome(k) for k in kinds] + [ok(0.01), ok(100.0)], st, cfg)
    by_kind = dict(zip(kinds, rewards))
    assert by_kind["rejected"] == cfg.rejected == min(rewards)
    assert by_kind[FORMAT] == cfg.format and by_kind["compile_error"] == cfg.compile_error
    assert by_kind["runtime_error"] == cfg.runtime_error and by_kind["timeout"] == cfg.timeout
    assert by_kind["incorrect"] == cfg.incorrect
    # defaults: any verified program outranks any failure, however slow
    assert min(rewards[-2:]) > max(rewards[:-2])


def test_degenerate_success_gets_its_own_reward_and_no_statistics():
    cfg = RewardConfig(degenerate=0.25)
    st = RunningStats(10)
    assert shape_rewards([ok(50.0, degenerate=True)], st, cfg) == [0.25]
    assert len(st) == 0


def test_reward_config_validation():
    with pytest.raises(ValueError, match="rejected"):
        RewardConfig(rejected=-1.0)  # above -clip and the other failures
    with pytest.raises(ValueError, match="rejected"):
        RewardConfig(rejected=-2.5, format=-2.6)
    with pytest.raises(ValueError):
        RewardConfig(clip=0)
    with pytest.raises(KeyError, match="unknown failure kind"):
        RewardConfig().failure("segfault")


def test_outcome_of_eval_results():
    assert outcome_of(None) == Outcome(FORMAT)
    res = EvalResult(status=Status.OK, speedup=2.0, flags=["cpu_timing"])
    assert outcome_of(res) == Outcome("ok", 2.0, False) and outcome_of(res).success
    deg = EvalResult(status=Status.OK, speedup=9.0, flags=["degenerate_task"])
    assert outcome_of(deg).degenerate and not outcome_of(deg).success
    bad = EvalResult(status=Status.REJECTED, speedup=5.0, flags=["input_mutation"])
    assert outcome_of(bad) == Outcome("rejected", None, False)


def test_presets_load_and_are_typed():
    assert {"smoke", "default"} <= set(presets("grpo")) and {"smoke", "default", "lora"} <= set(presets("sft"))
    g = load_config("grpo", "default")
    assert isinstance(g, GRPOConfig) and g.reward.clip == 1.5
    assert isinstance(load_config("ssl", "smoke").sft, SFTConfig)
    assert isinstance(load_config("ssl", "default"), SSLConfig)
    assert load_config("sft", "lora").lora and load_config("sft", "lora").lora_config.r == 32


def test_strict_keys_and_overrides(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text("group_size: 4\nreward:\n  clip: 2.0\n  windw: 10\n")
    with pytest.raises(ConfigError, match="windw"):
        load_config("grpo", path)
    path.write_text("group_size: 4\nlearning_rte: 0.1\n")
    with pytest.raises(ConfigError, match="learning_rte"):
        load_config("grpo", path)
    path.write_text("group_size: 4\nreward:\n  clip: 2\n")
    cfg = load_config("grpo", path, {"max_steps": 7, "reward.window": 9, "beta": None})
    assert (cfg.group_size, cfg.max_steps, cfg.reward.clip, cfg.reward.window) == (4, 7, 2.0, 9)
    assert cfg.beta == GRPOConfig().beta  # None overrides are ignored
    with pytest.raises(ConfigError, match="unknown grpo preset"):
        load_config("grpo", "nonexistent")
    with pytest.raises(ConfigError, match="group_size"):
        load_config("grpo", None, {"group_size": 1})


def test_a_runs_saved_config_reproduces_it(tmp_path):
    from cudal1.config import EvalConfig, read_config_file, write_config_file

    cfg = load_config("grpo", "smoke", {"max_steps": 3, "reward.clip": 2.0, "trl": {"max_grad_norm": 0.5}})
    write_config_file(tmp_path, judge=EvalConfig(device="cpu"), grpo=cfg,
                      run={"command": "train grpo", "stage": "grpo", "smoke": True, "args": {"out": str(tmp_path)}})
    again = load_config("grpo", tmp_path / "config.yaml")  # the run's OUT/config.yaml: its grpo section
    assert again == cfg and again.trl == {"max_grad_norm": 0.5}
    assert load_config("grpo", tmp_path / "config.yaml", {"max_steps": 5}).max_steps == 5
    # the same file every other command reads: its judge section too
    assert read_config_file(tmp_path / "config.yaml", ("judge", "grpo"))["judge"]["device"] == "cpu"
    # a training run of cudal1 0.1 (its record keys beside the sections) still reproduces
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump({"cudal1": "0.1.0", "stage": "grpo", "smoke": True, "processes": 1,
                                   "grpo": cfg.to_dict(), "judge": {"device": "cpu"}, "args": {}}))
    assert load_config("grpo", old) == cfg
    with pytest.raises(ConfigError, match="group_size"):
        GRPOConfig.from_dict({"group_size": "one"})  # the config base coerces and names the key


def test_analysis_bonus_is_off_by_default_and_keeps_the_orderings():
    stats = RunningStats(16)
    plain = shape_rewards([Outcome("format", analysis=1.0)], stats, RewardConfig())
    assert plain == [RewardConfig().format]  # off by default
    cfg = RewardConfig(analysis_bonus=0.05)
    got = shape_rewards([Outcome("format", analysis=1.0), Outcome("rejected", analysis=0.5)], stats, cfg)
    assert got == [pytest.approx(-2.0 + 0.05), pytest.approx(-3.0 + 0.025)]
    with pytest.raises(ConfigError, match="outrank"):
        RewardConfig(analysis_bonus=0.2)  # incorrect (-1.6) + 0.2 would reach -clip (-1.5)
    with pytest.raises(ConfigError, match=">= 0"):
        RewardConfig(analysis_bonus=-0.1)
    with pytest.raises(ConfigError, match="rejected"):
        RewardConfig(analysis_bonus=0.05, rejected=-2.01, format=-2.0)


def test_rollouts_carry_their_analysis_score(tmp_path):
    from cudal1.prompts import build_prompt
    from cudal1.recorded import RecordedJudge
    from cudal1.store import RunStore
    from cudal1.train import smoke
    from cudal1.train.judging import RolloutJudge
    from cudal1.types import Exemplar

    task = smoke.smoke_task()
    shown = build_prompt(
        task, [Exemplar(smoke.VARIANTS["matmul"], 1.0), Exemplar(smoke.VARIANTS["broadcast"], 3.2)], "CPU"
    )
    one_shot = build_prompt(task, [], "CPU")
    text = (
        "### Performance Analysis\nThe 1.00x version materialises an N x N diagonal matrix and multiplies it; at 3.20x "
        "the broadcast avoids that memory traffic for a row scaling.\n\nNo code this time."
    )
    with RunStore(tmp_path / "s.sqlite") as store:
        judge = RolloutJudge(RecordedJudge(smoke.smoke_judge_config(), store))
        [(res, outcome), (_, bare)] = judge.judge([(task, text), (task, text)], prompts=[shown, one_shot])
    assert res is None and outcome.kind == FORMAT and outcome.analysis == 1.0
    assert bare.analysis == 0.0  # a one-shot prompt showed nothing measured to check it against
