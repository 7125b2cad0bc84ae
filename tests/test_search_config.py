"""search.SearchConfig and how ``cudal1 optimize`` resolves it: strict YAML, defaults stated once,
flags over file over defaults, and the policy settings a run saves (never an API key)."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from cudal1.cli.main import build_parser
from cudal1.cli.main import main as cli_main
from cudal1.cli.optimize import search_config
from cudal1.config import ConfigError
from cudal1.policy.base import PolicyConfig, policy_settings
from cudal1.search import SearchConfig


def _args(*flags: str):
    return build_parser().parse_args(["optimize", "task.py", *flags])


def test_yaml_loads_and_unknown_keys_are_errors(tmp_path):
    good = tmp_path / "s.yaml"
    good.write_text("rounds: 5\nsamples: 2\ntau: 2\nbudget_minutes: 30\n")
    cfg = SearchConfig.from_yaml(good)
    assert (cfg.rounds, cfg.samples, cfg.tau, cfg.budget_minutes) == (5, 2, 2.0, 30.0)
    assert isinstance(cfg.tau, float)  # YAML 2 and CLI 2.0 are the same config
    bad = tmp_path / "bad.yaml"
    bad.write_text("rounds: 5\nsample: 2\n")
    with pytest.raises(ConfigError, match="sample"):
        SearchConfig.from_yaml(bad)
    for text in ("- 1\n- 2\n", "rounds: [\n"):
        bad.write_text(text)
        with pytest.raises(ConfigError):
            SearchConfig.from_yaml(bad)
    with pytest.raises(ConfigError):
        SearchConfig.from_yaml(tmp_path / "missing.yaml")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert SearchConfig.from_yaml(empty) == SearchConfig()


@pytest.mark.parametrize("bad", [{"rounds": -1}, {"samples": 0}, {"exemplars": -1}, {"strategy": "greedy"},
                                 {"tau": 0}, {"budget_minutes": 0}, {"max_evaluations": 0},
                                 {"template": "contrastive_v0"}],
                         ids=lambda d: next(iter(d)))
def test_bad_values_are_config_errors(bad):
    with pytest.raises(ConfigError):
        SearchConfig.from_dict(bad)


def test_round_trip_and_replace_ignores_none():
    cfg = SearchConfig(rounds=1, max_evaluations=9, feedback=False)
    assert SearchConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.replace(rounds=None, samples=3) == dataclasses.replace(cfg, samples=3)
    with pytest.raises(ConfigError):
        cfg.replace(samples=0)


def test_cli_flags_default_to_the_dataclass_and_override_the_file(tmp_path):
    assert search_config(_args()) == SearchConfig()  # no flag restates a default
    parser_defaults = vars(_args())
    for dest in ("rounds", "samples", "exemplars", "strategy", "tau", "feedback", "budget_minutes", "max_evaluations",
                 "search_seed", "api_key_env", "temperature"):
        assert parser_defaults[dest] is None, dest
    f = tmp_path / "s.yaml"
    f.write_text("rounds: 7\nsamples: 2\nfeedback: false\nstrategy: best\n")
    cfg = search_config(_args("--search-config", str(f), "--samples", "5", "--tau", "0.5"))
    assert (cfg.rounds, cfg.samples, cfg.feedback, cfg.strategy, cfg.tau) == (7, 5, False, "best", 0.5)
    assert search_config(_args("--no-feedback")).feedback is False


def test_cli_unknown_search_key_is_a_one_line_usage_error(tmp_path, capsys):
    f = tmp_path / "s.yaml"
    f.write_text("roundz: 2\n")
    rc = cli_main(["optimize", "no-such-task.py", "--search-config", str(f), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("cudal1: error:") and "roundz" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_policy_settings_never_hold_the_api_key():
    class LLM:
        name = "openai"
        model = "served-model"
        config = PolicyConfig(base_url="http://h/v1", api_key="sk-secret-123", temperature=0.3)

    saved = policy_settings(LLM())
    assert saved["name"] == "openai" and saved["model"] == "served-model" and saved["base_url"] == "http://h/v1"
    assert saved["temperature"] == 0.3 and "api_key" not in saved
    assert "sk-secret" not in yaml.safe_dump(saved)

    class Coded:
        name = "builtin"

        def settings(self):
            return {"passes": ["algebraic"], "device": "cpu"}

    assert policy_settings(Coded()) == {"name": "builtin", "passes": ["algebraic"], "device": "cpu"}
