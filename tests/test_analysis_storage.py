"""CPU tier: the model's Performance Analysis is stored with every response — by the search loop
(``cudal1 optimize``), by GRPO's reward (``JudgeReward`` over the run store) and by ``cudal1
evaluate`` — and where training checks it (GRPO, evaluate), the check travels with the candidate
(``meta.analysis_check``) and, with ``reward.analysis_bonus``, into the reward.  Answers come from
the scripted OpenAI-compatible server (cudal1/train/smoke/server.py) or are handed to the reward directly;
every program is judged for real on the CPU."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from cudal1.prompts import check_analysis, parse_response
from cudal1.recorded import RecordedJudge
from cudal1.train import smoke

pytestmark = pytest.mark.cpu

ANALYSES = ["The reference materialises an N x N diagonal matrix and multiplies it: N cubed work for N squared output.",
            "Scaling each row of B in place reads B once; the matrix product reads a whole N x N temporary as well.",
            "Broadcasting the vector over the rows fuses the scaling into one pass over memory, with no temporary."]
PROGRAMS = [smoke.VARIANTS["broadcast"], smoke.VARIANTS["einsum"], smoke.FAILURES["wrong"]]


def _answers() -> list[str]:
    return [smoke.answer(code, analysis) for code, analysis in zip(PROGRAMS, ANALYSES)]


def _meta(store: Path) -> dict[str, dict]:
    con = sqlite3.connect(store)
    try:
        return {h: json.loads(m) for h, m in con.execute("SELECT hash, meta_json FROM candidates")}
    finally:
        con.close()


def _stored(store: Path, policy: str) -> list[dict]:
    from cudal1.store import RunStore

    with RunStore(store) as s:
        return [r for r in s.responses() if r["policy"] == policy]


def test_search_stores_each_answers_analysis(tmp_path, monkeypatch):
    pytest.importorskip("openai")
    from cudal1.policy import make_policy
    from cudal1.search import SearchConfig, optimize
    from cudal1.train.smoke.server import ScriptedLLMServer

    monkeypatch.setenv("CUDAL1_CACHE_DIR", str(tmp_path / "cache"))
    with ScriptedLLMServer(_answers()) as srv:
        policy = make_policy("openai", base_url=srv.url, model="m", concurrency=1)
        try:
            optimize([smoke.smoke_task()], policy, SearchConfig(rounds=1, samples=3, exemplars=0, seed=0),
                     RecordedJudge(smoke.smoke_judge_config(), hardware="CPU"), tmp_path / "out")
        finally:
            policy.close()
    rows = [r for r in _stored(tmp_path / "out" / "cudal1.sqlite", "openai") if r["round"] == 1]
    assert sorted(r["analysis"] for r in rows) == sorted(ANALYSES)
    assert all(r["analysis"] == parse_response(r["response"]).analysis for r in rows)


def test_grpo_reward_stores_the_analysis_and_its_check_and_pays_the_bonus(tmp_path, monkeypatch):
    pytest.importorskip("trl")
    from cudal1.prompts import build_prompt
    from cudal1.store import RunStore
    from cudal1.train.judging import RolloutJudge
    from cudal1.train.reward import RewardConfig, RunningStats
    from cudal1.train.stages.contrast import ContrastivePrompts
    from cudal1.train.stages.grpo import JudgeReward
    from cudal1.types import Exemplar, reference_candidate

    monkeypatch.setenv("CUDAL1_CACHE_DIR", str(tmp_path / "cache"))
    task = smoke.smoke_task()
    measured = [f"{ANALYSES[0]} Implementation 1 (1.00x) is the reference; at 3.10x the broadcast avoids that memory "
                "traffic.", ANALYSES[1], ANALYSES[2]]
    texts = [smoke.answer(code, analysis) for code, analysis in zip(PROGRAMS, measured)]
    with RunStore(tmp_path / "grpo.sqlite") as store:
        judge = RolloutJudge(RecordedJudge(smoke.smoke_judge_config(), store), "grpo")
        contrast = ContrastivePrompts(judge, [task])
        shown = [Exemplar(reference_candidate(task).source, 1.0), Exemplar(smoke.VARIANTS["broadcast"], 3.1)]
        prompt = build_prompt(task, shown, "CPU")  # what a prompt with two exemplars shows
        contrast.issued[(task.task_id, prompt.user)] = prompt
        completions = [[{"role": "assistant", "content": t}] for t in texts]
        paid = RewardConfig(analysis_bonus=0.05)
        rewards = JudgeReward(judge, contrast, paid, RunningStats(64))([prompt.messages()] * 3, completions,
                                                                       [task.task_id] * 3)
        unpaid = JudgeReward(judge, contrast, RewardConfig(), RunningStats(64))([prompt.messages()] * 3, completions,
                                                                                [task.task_id] * 3)
    rows = [r for r in _stored(tmp_path / "grpo.sqlite", "grpo")][:3]
    assert [r["analysis"] for r in rows] == measured
    assert all(r["prompt"]["user"] == prompt.user for r in rows)  # the prompt it answered, exemplars included
    meta = _meta(tmp_path / "grpo.sqlite")
    checks = [meta[r["candidate_hash"]]["analysis_check"] for r in rows]
    assert checks == [check_analysis(a, prompt.user).to_dict() for a in measured]
    assert checks[0]["score"] == 1.0 and checks[1]["score"] == checks[2]["score"] == 0.0
    # the bonus is the stored check's score times analysis_bonus, on top of the same verdicts' rewards
    assert [p - u for p, u in zip(rewards, unpaid)] == pytest.approx([paid.analysis_bonus * c["score"] for c in checks])


def test_evaluate_stores_each_answers_analysis_and_its_check(tmp_path, monkeypatch, capsys):
    pytest.importorskip("openai")
    from cudal1.cli.main import main as cli_main
    from cudal1.train.smoke.server import ScriptedLLMServer

    monkeypatch.setenv("CUDAL1_CACHE_DIR", str(tmp_path / "cache"))
    task = tmp_path / "diag_scale.py"
    task.write_text(smoke.TASK_SOURCE)
    out = tmp_path / "eval"
    with ScriptedLLMServer(_answers()) as srv:
        assert (
            cli_main(
                [
                    "evaluate", str(task), "--base-url", srv.url, "--model", "m", "--samples", "3", "--out",
                    str(out), "--device", "cpu", "--trials", "2", "--timing-trials", "10", "--json",
                ]
            )
            == 0
        )
    capsys.readouterr()
    rows = _stored(out / "cudal1.sqlite", "evaluate")
    assert sorted(r["analysis"] for r in rows) == sorted(ANALYSES)
    meta = _meta(out / "cudal1.sqlite")
    for r in rows:
        check = meta[r["candidate_hash"]]["analysis_check"]
        assert check == check_analysis(r["analysis"], r["prompt"]["user"]).to_dict()
        assert check["present"] and check["shown"] == 0 and check["score"] == 0.0  # one-shot: nothing measured shown
