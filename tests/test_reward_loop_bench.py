"""CPU tier: ``benchmarks/reward_loop.py --cpu-small`` runs one GRPO step end to end — the scripted
OpenAI-compatible server answering through TRL's ``rollout_func``, the real judge, the update — and
reports each phase's seconds, the verdicts of the answer mix, and rollouts per GPU-hour."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

pytestmark = pytest.mark.cpu


def test_one_step_of_scripted_answers_is_timed_phase_by_phase(tmp_path, monkeypatch, capsys):
    import reward_loop

    monkeypatch.setenv("CUDAL1_CACHE_DIR", str(tmp_path / "cache"))
    args = ["--cpu-small", "--out", str(tmp_path), "--rollouts", "8", "--group", "4", "--answer-tokens", "300",
            "--mix", "correct=1,wrong=1,repeat=1,nocode=1"]
    assert reward_loop.main(args) == 0
    table = capsys.readouterr().out.strip().splitlines()
    assert (
        table[-2].split()[:3] == ["step", "generation_s", "judge_s"] and table[-1].split()[0] == "1"
    )  # the table, last
    result = json.loads((tmp_path / "reward_loop.json").read_text())
    (step,) = result["steps"]
    # two groups of the mix: a correct program and its repeat, a wrong one, an answer without code
    assert step["judged"] == {"ok": 4, "incorrect": 2, "format": 2}
    assert step["evaluated"] == 4  # every group's programs are new answers; a repeat is read from the cache
    assert 240 <= result["answer_tokens"][0] <= result["answer_tokens"][1] <= 375  # about the tokens asked for
    assert step["judge_s"] > 0 and step["generation_s"] > 0 and step["step_s"] >= step["judge_s"] + step["generation_s"]
    assert step["rollouts_per_gpu_hour"] == pytest.approx(8 * 3600 / step["step_s"])
    assert json.loads((tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()[0])["judge_s"] == step["judge_s"]
