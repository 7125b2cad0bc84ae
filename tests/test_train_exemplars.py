"""CPU tier: ``train grpo --exemplars-from``: an earlier run's verified programs seed the exemplar
pool, judged here under this run's judge config (a verdict recorded under the same config is
copied, not judged again); unverified, suspected and anchor programs are never seeded; sources
are read, never written."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from cudal1.recorded import RecordedJudge
from cudal1.store import RunStore
from cudal1.train import smoke
from cudal1.train.stages.exemplars import SeedError, choose, seed_pool, store_file
from cudal1.types import Candidate, EvalResult, Status, reference_candidate


def _source(tmp_path: Path, config_hash: str) -> Path:
    """A collect-style output: data.jsonl with its store data.sqlite holding five judged programs."""
    task = smoke.smoke_task()
    data = tmp_path / "collect" / "data.jsonl"
    data.parent.mkdir(parents=True)
    data.write_text("")
    rows = [("broadcast", Status.OK, 5.0, config_hash, []),  # same judge config: its verdict is copied
            ("einsum", Status.OK, 3.0, "another-judge", []),  # judged anew here
            ("mm", Status.OK, 2.0, "another-judge", ["reviewer_suspects"]),  # never seeded
            ("wrong", Status.INCORRECT, None, config_hash, [])]
    with RunStore(data.with_suffix(".sqlite")) as store:
        store.add_task(task)
        codes = {**smoke.VARIANTS, **smoke.FAILURES}
        for name, status, speedup, ch, flags in rows:
            cand = Candidate(codes[name], task_hash=task.hash)
            store.add_candidate(cand, task.hash, {"policy": "teacher"})
            store.record_evaluation(
                EvalResult(
                    status=status, task_name=task.name, task_hash=task.hash, candidate_hash=cand.hash,
                    speedup=speedup,
                    speedup_ci=(speedup * 0.9, speedup * 1.1) if speedup else None,
                    config_hash=ch,
                    flags=list(flags),
                )
            )
        anchor = reference_candidate(task)
        store.add_candidate(anchor, task.hash, {"policy": "reference"})
        store.record_evaluation(
            EvalResult(
                status=Status.OK, task_hash=task.hash, candidate_hash=anchor.hash, speedup=1.0, config_hash=config_hash
            )
        )
    return data


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.cpu
def test_seeding_judges_verified_programs_here(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDAL1_CACHE_DIR", str(tmp_path / "cache"))
    config = smoke.smoke_judge_config()
    task = smoke.smoke_task()
    data = _source(tmp_path, config.hash())
    before = _digest(data.with_suffix(".sqlite"))
    picks = choose([task], [data], per_task=1)[task.hash]
    assert [c.source for c, _, _ in picks] == [smoke.VARIANTS["broadcast"]]  # fastest first, anchor and suspects out

    with RunStore(tmp_path / "grpo" / "cudal1.sqlite") as store:
        recorded = RecordedJudge(config, store)
        summary = seed_pool(recorded, [task], [str(data)], per_task=4)
        assert summary | {"sources": None} == {
            "sources": None, "tasks": 1, "seeded": 2, "reused": 1, "judged": 1, "ok": 2,
        }
        assert recorded.judged == 1  # einsum judged here; broadcast's verdict under this config copied
        ok = {e.candidate_hash: e.speedup for e in recorded.pool(task).ok}
        broadcast, einsum = (Candidate(smoke.VARIANTS[k], task_hash=task.hash).hash for k in ("broadcast", "einsum"))
        assert ok[broadcast] == 5.0 and ok[einsum] != 3.0  # einsum's speedup is this judge's measurement
        import json
        import sqlite3

        with sqlite3.connect(tmp_path / "grpo" / "cudal1.sqlite") as con:
            metas = [json.loads(m) for (m,) in con.execute("SELECT meta_json FROM candidates")]
        assert {m.get("policy") for m in metas} == {"seed"} and all(m["from"] == str(data) for m in metas)
        # seeding again (a resumed run) judges nothing more
        again = seed_pool(recorded, [task], [str(data)], per_task=4)
        assert again["seeded"] == 2 and recorded.judged == 1
    assert _digest(data.with_suffix(".sqlite")) == before  # the source is read, never written


def test_bad_sources_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(SeedError, match="no run store"):
        store_file(tmp_path / "nowhere")
    junk = tmp_path / "junk.sqlite"
    junk.write_text("not a database")
    from cudal1.train.stages.exemplars import read_verified

    with pytest.raises(SeedError, match="not a run store|cannot read"):
        read_verified(junk, set())
    pytest.importorskip("trl")
    from cudal1.cli.main import main as cli_main

    assert (
        cli_main(
            ["train", "grpo", "--smoke", "--exemplars-from", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--exemplars-from" in err[0] and err[0].startswith("cudal1: error:")
