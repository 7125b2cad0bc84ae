"""config.EvalConfig: strict keys, YAML, presets, hashing, validation."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cudal1.config import ConfigError, EvalConfig

class TestConfig:
    def test_unknown_key(self):
        with pytest.raises(ConfigError, match="bogus"):
            EvalConfig.from_dict({"bogus": 1, "timeout_s": 3})

    def test_unknown_key_in_yaml(self, tmp_path):
        p = tmp_path / "c.yaml"
        p.write_text("timeout_s: 3\ncorectness_trials: 4\n")
        with pytest.raises(ConfigError, match="corectness_trials"):
            EvalConfig.from_yaml(p)

    def test_yaml_loads(self, tmp_path):
        p = tmp_path / "c.yaml"
        p.write_text("timeout_s: 3\ncorrectness_trials: 4\n")
        cfg = EvalConfig.from_yaml(p)
        assert cfg.timeout_s == 3 and cfg.correctness_trials == 4

    def test_yaml_not_a_mapping(self, tmp_path):
        p = tmp_path / "c.yaml"
        p.write_text("- a\n- b\n")
        with pytest.raises(ConfigError):
            EvalConfig.from_yaml(p)

    def test_yaml_missing_file(self, tmp_path):
        with pytest.raises(ConfigError):
            EvalConfig.from_yaml(tmp_path / "nope.yaml")

    def test_yaml_empty_is_defaults(self, tmp_path):
        p = tmp_path / "c.yaml"
        p.write_text("")
        assert EvalConfig.from_yaml(p) == EvalConfig()

    @pytest.mark.parametrize("name", ["default", "fast", "thorough", "kernelbench-v0"])
    def test_presets_load(self, name):
        cfg = EvalConfig.preset(name)
        assert isinstance(cfg, EvalConfig)
        assert len(cfg.hash()) == 16

    def test_preset_contents(self):
        assert EvalConfig.preset("default") == EvalConfig()
        assert EvalConfig.preset("kernelbench-v0").tolerance == "kernelbench-v0"
        assert EvalConfig.preset("fast").correctness_trials < EvalConfig().correctness_trials
        assert EvalConfig.preset("thorough").correctness_trials > EvalConfig().correctness_trials
        hashes = {EvalConfig.preset(n).hash() for n in ("default", "fast", "thorough", "kernelbench-v0")}
        assert len(hashes) == 4

    def test_unknown_preset(self):
        with pytest.raises(ConfigError, match="nope"):
            EvalConfig.preset("nope")

    def test_hash_stable(self):
        assert EvalConfig().hash() == EvalConfig().hash()
        assert EvalConfig(timeout_s=3.5, tolerance="exact").hash() == EvalConfig(timeout_s=3.5).hash()

    def test_hash_same_for_equal_configs(self):
        assert EvalConfig(timeout_s=3) == EvalConfig(timeout_s=3.0)
        assert EvalConfig(timeout_s=3).hash() == EvalConfig(timeout_s=3.0).hash()

    def test_hash_stable_across_processes(self):
        code = "from cudal1.config import EvalConfig; print(EvalConfig(tolerance='kernelbench-v0').hash())"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        assert out == EvalConfig(tolerance="kernelbench-v0").hash()

    def test_hash_changes_with_verdict_fields(self):
        base = EvalConfig().hash()
        assert EvalConfig(tolerance="kernelbench-v0").hash() != base
        assert EvalConfig(correctness_trials=7).hash() != base
        assert EvalConfig(math_mode="torch-default").hash() != base
        assert EvalConfig(seed=1).hash() != base

    def test_hash_ignores_paths_and_workers(self, tmp_path):
        base = EvalConfig().hash()
        assert EvalConfig(cache_dir=str(tmp_path)).hash() == base
        assert EvalConfig(build_workers=3).hash() == base
        assert EvalConfig(keep_samples=False).hash() == base
        assert EvalConfig(input_seed=1234).hash() == base

    @pytest.mark.parametrize(
        "bad",
        [
            {"device": "gpu"},
            {"tolerance": "loose"},
            {"math_mode": "fast"},
            {"correctness_trials": 0},
            {"timing_trials": 0},
            {"min_timing_trials": 0},
            {"timeout_s": 0},
            {"build_timeout_s": -1},
            {"setup_timeout_s": 0},
            {"timing_budget_s": 0},
        ],
        ids=lambda d: next(iter(d)),
    )
    def test_bad_values(self, bad):
        with pytest.raises(ConfigError):
            EvalConfig(**bad)
        with pytest.raises(ConfigError):
            EvalConfig.from_dict(bad)

    def test_config_error_is_value_error(self):
        assert issubclass(ConfigError, ValueError)

    def test_replace_ignores_none(self):
        cfg = EvalConfig(timeout_s=5).replace(timeout_s=None, correctness_trials=2)
        assert cfg.timeout_s == 5 and cfg.correctness_trials == 2

    def test_replace_validates(self):
        with pytest.raises(ConfigError):
            EvalConfig().replace(device="tpu")

    def test_to_dict_round_trip(self):
        cfg = EvalConfig(timeout_s=7, tolerance="kernelbench-v0", flush_l2=False)
        assert EvalConfig.from_dict(cfg.to_dict()) == cfg

    def test_every_field_is_read_by_the_judge(self):
        """A field nothing reads must not change the config hash (it would split resumes for
        nothing): every EvalConfig field is read somewhere in the harness or the CLI."""
        import dataclasses
        from pathlib import Path

        src = Path(__file__).resolve().parent.parent / "src" / "cudal1"
        import inspect

        text = "\n".join(p.read_text() for p in src.rglob("*.py") if p.name != "config.py")
        text += inspect.getsource(EvalConfig.cache_root)  # the config's own reader of cache_dir
        unread = [f.name for f in dataclasses.fields(EvalConfig) if f".{f.name}" not in text and f'"{f.name}"' not in text]
        assert unread == []

    def test_removed_fields_are_unknown_keys(self):
        for name in ("input_sets", "input_memory_gb", "extra"):
            with pytest.raises(ConfigError, match=name):
                EvalConfig.from_dict({name: 1})

    def test_cache_root(self, tmp_path, monkeypatch):
        monkeypatch.setenv("CUDAL1_CACHE_DIR", str(tmp_path / "env"))
        assert EvalConfig().cache_root() == tmp_path / "env"
        assert EvalConfig(cache_dir=str(tmp_path / "cfg")).cache_root() == tmp_path / "cfg"
