"""CPU tier: tiny-model training with the real TRL trainers and the real judge.

* SFT: parameters change after a step, the loss mask covers the assistant turn only, the saved
  model loads with the ``hf`` policy, ``metrics.jsonl`` and a checkpoint with ``config.json``.
* GRPO (the learning test): the ``--smoke`` run — a tiny policy primed on fast, slow, wrong and
  cheating programs, rewarded by the judge — raises ``reward_mean``; every rollout is in the run
  store; the parameters moved; ``metrics.jsonl`` carries the contract's keys.
* The tiny model's tokenizer is the same in every process (hash seeds), so every run primes the
  same model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")

from cudal1.cli.main import main as cli_main
from cudal1.train import smoke

pytestmark = pytest.mark.cpu  # starts processes: the CPU tier (tests/tiers.py)


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _changed(a: dict, b: dict) -> list[str]:
    import torch

    return [k for k in a if k in b and not torch.equal(a[k], b[k])]


def test_sft_step_changes_parameters_and_masks_the_prompt(tmp_path):
    from transformers import AutoTokenizer

    from cudal1.train.config import SFTConfig
    from cudal1.train.smoke.stages import verified_records
    from cudal1.train.smoke.tiny import build_tiny_model, common_lines
    from cudal1.train.stages.sft import run_sft

    records = verified_records()
    texts = [m["content"] for r in records for m in r["messages"]]
    base = build_tiny_model(
        tmp_path / "base", texts, hidden=32, fixed=common_lines(texts[:1]) + common_lines(texts[1:2])
    )
    tok = AutoTokenizer.from_pretrained(base)
    enc = tok.apply_chat_template(
        records[0]["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    mask = enc["assistant_masks"]
    assert 0 < sum(mask) < len(mask) and mask[0] == 0  # the assistant turn only ...
    last = max(i for i, m in enumerate(mask) if m)
    assert enc["input_ids"][last] == tok.eos_token_id  # ... with its end token (the model learns to stop)
    cfg = SFTConfig(learning_rate=1e-2, max_steps=2, batch_size=3, gradient_accumulation_steps=1, max_length=2048,
                    warmup_ratio=0.0, bf16=False, gradient_checkpointing=False, logging_steps=1, save_steps=1)
    out = tmp_path / "sft"
    summary = run_sft(str(base), records, cfg, out)
    assert summary["steps"] == 2
    changed = _changed(_weights(base), _weights(out))
    assert len(changed) > 10, changed
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2] and all(x["loss"] is not None and x["loss"] > 0 for x in lines)
    assert (out / "checkpoint-2" / "config.json").is_file() and (out / "config.json").is_file()

    from cudal1.policy.hf_policy import HFPolicy
    from cudal1.prompts import build_prompt

    policy = HFPolicy(model_path=str(out), max_tokens=8, temperature=0.0, device="cpu")
    try:
        [[completion]] = policy.generate([build_prompt(smoke.smoke_task(), [], "CPU")], 1)
    finally:
        policy.close()
    assert not completion.error


def test_the_smoke_tokenizer_is_the_same_in_every_process(tmp_path):
    """The smoke's tiny model is built from the same texts in every process: its tokenizer's added
    tokens (the fixed lines) must not take their ids from a set's hash-seeded order, or each run
    (and the test session's priming) starts from a different model."""
    import os
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from cudal1.train.smoke import fixed_strings, priming_records, smoke_task\n"
        "from cudal1.train.smoke.tiny import train_tokenizer\n"
        "records = priming_records(smoke_task(), 32)\n"
        "tok = train_tokenizer([m['content'] for r in records for m in r['messages']], 2048, fixed_strings(records))\n"
        "tok.save_pretrained(sys.argv[1])\n"
    )
    saved = []
    for seed in ("1", "2"):
        out = tmp_path / f"tok{seed}"
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run([sys.executable, "-c", script, str(out)], check=True, env=env, timeout=300)
        saved.append((out / "tokenizer.json").read_text())
    assert saved[0] == saved[1]


def test_grpo_smoke_learns_to_prefer_fast_verified_programs(tmp_path, monkeypatch, capsys, seed_primed):
    monkeypatch.setenv("CUDAL1_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "grpo"
    seed_primed(out)  # the smoke's own priming, built once per session
    assert cli_main(["train", "grpo", "--smoke", "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    grpo = [x for x in lines if x["stage"] == "grpo"]
    assert len(grpo) == summary["steps"] >= 10
    for key in ("step", "loss", "reward_mean", "reward_std", "success_rate", "kl", "judged", "judge_s"):
        assert all(key in x for x in grpo), key
    rewards = [x["reward_mean"] for x in grpo]
    third = len(rewards) // 3
    # the start (first three steps) against the end (last third): the policy learns within the
    # first third already, and a collapse into answers without code (reward -2.0) fails this
    first, last = sum(rewards[:3]) / 3, sum(rewards[-third:]) / third
    assert last > first + 0.3, rewards
    assert summary["collapses"] == [] and summary["memory_shortfalls"] == []  # reported by the run when they happen
    success = [x["success_rate"] for x in grpo]
    assert sum(success[-third:]) >= sum(success[:third]), success
    # every rollout is stored (and judged once per distinct program)
    from cudal1.store import RunStore

    with RunStore(out / "cudal1.sqlite") as store:
        responses = [r for r in store.responses() if r["policy"] == "grpo"]
        assert len(responses) == sum(sum(x["judged"].values()) for x in grpo)
        judged_programs = {r["candidate_hash"] for r in responses if r["candidate_hash"]}
        assert sum(x["evaluated"] for x in grpo) == len(judged_programs)
    assert _changed(_weights(Path(summary["base_model"])), _weights(out))  # the policy moved
    config = (out / "config.yaml").read_text()
    assert "group_size" in config and "judge:" in config
    assert (out / f"checkpoint-{summary['steps']}" / "config.json").is_file()

    # --resume continues from the last checkpoint; the priming is reused, nothing recorded is lost
    steps = summary["steps"]
    assert (
        cli_main(["train", "grpo", "--smoke", "--resume", "--max-steps", str(steps + 2), "--out", str(out), "--json"])
        == 0
    )
    resumed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert resumed["resumed_from"].endswith(f"checkpoint-{steps}") and resumed["steps"] == steps + 2
    after = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in after if x["stage"] == "grpo"] == list(range(1, steps + 3))
    with RunStore(out / "cudal1.sqlite") as store:
        assert len([r for r in store.responses() if r["policy"] == "grpo"]) > len(responses)
