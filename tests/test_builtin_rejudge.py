"""benchmarks/builtin_rejudge.py and ``builtin_kernelbench.py --rejudge``: a task's verdicts,
baselines, re-timings, skips and finished mark under the current judge config leave the run for
``OUT/rejudged.jsonl`` (other tasks and configurations untouched), and a wrong task id is one
line and a non-zero exit with nothing changed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cudal1.store import RunStore
from cudal1.types import Candidate, EvalResult, Status, Task

REPO = Path(__file__).resolve().parents[1]
SRC = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x + {}\n"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import builtin_kernelbench
    import builtin_rejudge

    return builtin_kernelbench, builtin_rejudge


def verdict(task: Task, cand: str, config: str, status: Status = Status.OK, speedup: float | None = 1.0) -> EvalResult:
    return EvalResult(status=status, task_name=task.name, task_hash=task.hash, candidate_hash=cand,
                      config_hash=config, speedup=speedup)


def a_run(out: Path, bench) -> list[Task]:
    """Two finished tasks under config ``cfg`` (one also judged under ``old``), as a run leaves them."""
    bk, _ = bench
    tasks = [Task(name=f"t{i}", source=SRC.format(i), level=1, problem_id=i) for i in (1, 2)]
    bk.save_selection(out, tasks, {t.task_id: ["all"] for t in tasks})
    with RunStore(out / "cudal1.sqlite") as store:
        for t in tasks:
            store.add_task(t)
            store.add_candidate(Candidate(source=t.source, label="builtin:r1"), t.hash)
            store.record_evaluation(verdict(t, "ref", "cfg", Status.REJECTED, None))
            store.record_evaluation(verdict(t, "c1", "cfg", speedup=0.7))
            store.record_evaluation(verdict(t, "c1", "old", speedup=0.69))
            store.record_baseline(t.hash, "compile-default", "env", "cfg", verdict(t, "baseline", "cfg", speedup=0.58))
    ids = [t.task_id for t in tasks]
    (out / "confirm.json").write_text(json.dumps({f"{i}|{k}": {"status": "ok"} for i in ids for k in ("c1", "mode:x")}))
    (out / "baseline_skips.json").write_text(json.dumps({i: {"compile-max-autotune": "no graphs"} for i in ids}))
    (out / "baselines_done.json").write_text(json.dumps(ids))
    return tasks


def test_a_rejudged_task_leaves_the_run_with_everything_kept_in_the_log(bench, tmp_path):
    bk, rj = bench
    t1, t2 = a_run(tmp_path, bench)
    entries = rj.rejudge(tmp_path, [t1, t2], [t1.task_id, t1.task_id], "cfg", "judged before the fix")
    assert len(entries) == 1 and "2 verdict(s) (rejected, ok), 1 baseline(s), 2 re-timing(s)" in rj.summary(entries[0])
    logged = [json.loads(line) for line in (tmp_path / rj.LOG).read_text().splitlines()]
    assert logged == entries and logged[0]["reason"] == "judged before the fix"
    assert [e["candidate_hash"] for e in logged[0]["evaluations"]] == ["ref", "c1"]
    assert logged[0]["baselines"][0]["result"]["speedup"] == 0.58 and logged[0]["baselines_done"] is True
    assert logged[0]["baseline_skips"] == {"compile-max-autotune": "no graphs"}
    # the task is unfinished under cfg; its other configuration, its programs and the other task stay
    assert set(json.loads((tmp_path / "confirm.json").read_text())) == {f"{t2.task_id}|c1", f"{t2.task_id}|mode:x"}
    assert set(json.loads((tmp_path / "baseline_skips.json").read_text())) == {t2.task_id}
    assert json.loads((tmp_path / "baselines_done.json").read_text()) == [t2.task_id]
    with RunStore(tmp_path / "cudal1.sqlite") as store:
        assert [(r.candidate_hash, r.config_hash) for r in store.evaluations(t1.hash)] == [("c1", "old")]
        assert store.get_baseline(t1.hash, "compile-default", "env", "cfg") is None
        assert len(store.candidates(t1.hash)) == 1 and len(store.evaluations(t2.hash)) == 3
    assert bk.PACKED.count(rj.LOG) == 1  # the log travels with the run's state
    # the report names it
    assert rj.recorded(tmp_path) == [{"task": t1.task_id, "at": entries[0]["at"], "reason": "judged before the fix",
                                      "verdicts": 2, "baselines": 1}]
    import builtin_figures

    summary = builtin_figures.builtin_figures(tmp_path, [t1, t2], "cfg", {t1.task_id: [], t2.task_id: []},
                                              ["compile-default"]) | {"rejudged": rj.recorded(tmp_path)}
    text = builtin_figures.markdown(summary, ["compile-default"])
    assert f"judged again with the current judge (earlier verdicts in rejudged.jsonl): {t1.task_id} at " in text
    assert t1.task_id in summary["unfinished"]


def test_one_baseline_timed_again_leaves_the_verdicts_and_other_baselines(bench, tmp_path):
    """``TASK:MODE``: only that baseline leaves the store (with the task's re-timings and finished
    mark, since its best compile mode may change); its verdicts, skips and other baselines stay,
    and the log and the report say which mode."""
    _, rj = bench
    t1, t2 = a_run(tmp_path, bench)
    with RunStore(tmp_path / "cudal1.sqlite") as store:
        store.record_baseline(t1.hash, "cudagraph", "env", "cfg", verdict(t1, "baseline", "cfg", speedup=0.9))
        store.record_baseline(t1.hash, "compile-max-autotune-no-cudagraphs", "env", "cfg",
                              verdict(t1, "baseline", "cfg", Status.TIMEOUT, None))
    entries = rj.rejudge(tmp_path, [t1, t2], [f"{t1.task_id}:compile-max-autotune-no-cudagraphs"], "cfg", "limit")
    assert entries[0]["mode"] == "compile-max-autotune-no-cudagraphs" and "evaluations" not in entries[0]
    assert rj.summary(entries[0]) == (f"timing {t1.task_id}'s compile-max-autotune-no-cudagraphs baseline again: "
                                      f"took out 1 baseline(s) (timeout), 2 re-timing(s); kept in {rj.LOG}")
    with RunStore(tmp_path / "cudal1.sqlite") as store:
        assert len(store.evaluations(t1.hash)) == 3  # every verdict stays
        assert store.get_baseline(t1.hash, "compile-max-autotune-no-cudagraphs", "env", "cfg") is None
        assert store.get_baseline(t1.hash, "compile-default", "env", "cfg") is not None
        assert store.get_baseline(t1.hash, "cudagraph", "env", "cfg") is not None
    assert set(json.loads((tmp_path / "baseline_skips.json").read_text())) == {t1.task_id, t2.task_id}
    assert json.loads((tmp_path / "baselines_done.json").read_text()) == [t2.task_id]
    assert set(json.loads((tmp_path / "confirm.json").read_text())) == {f"{t2.task_id}|c1", f"{t2.task_id}|mode:x"}
    assert rj.recorded(tmp_path)[0]["task"] == f"{t1.task_id} (compile-max-autotune-no-cudagraphs)"
    with pytest.raises(ValueError, match="not a baseline mode: eager-ish"):
        rj.rejudge(tmp_path, [t1, t2], [f"{t1.task_id}:eager-ish"], "cfg")


def test_every_tasks_baselines_timed_again_leave_every_verdict(bench, tmp_path):
    """``all:baselines``: every baseline of every task leaves the store (with the re-timings and
    finished marks), every verdict and skip stays; one log entry per task."""
    _, rj = bench
    t1, t2 = a_run(tmp_path, bench)
    with RunStore(tmp_path / "cudal1.sqlite") as store:
        store.record_baseline(t1.hash, "cudagraph", "env", "cfg", verdict(t1, "baseline", "cfg", speedup=0.9))
    entries = rj.rejudge(tmp_path, [t1, t2], ["all:baselines"], "cfg", "the judge fixed")
    assert [e["task"] for e in entries] == [t1.task_id, t2.task_id] and {e["mode"] for e in entries} == {"baselines"}
    assert rj.summary(entries[0]) == (f"timing {t1.task_id}'s baselines again: took out 2 baseline(s) (ok, ok), "
                                      f"2 re-timing(s); kept in {rj.LOG}")
    with RunStore(tmp_path / "cudal1.sqlite") as store:
        for t in (t1, t2):
            assert len(store.evaluations(t.hash)) == 3
            assert store.get_baseline(t.hash, "compile-default", "env", "cfg") is None
        assert store.get_baseline(t1.hash, "cudagraph", "env", "cfg") is None
    assert json.loads((tmp_path / "baselines_done.json").read_text()) == []
    assert json.loads((tmp_path / "confirm.json").read_text()) == {}
    assert set(json.loads((tmp_path / "baseline_skips.json").read_text())) == {t1.task_id, t2.task_id}
    with pytest.raises(ValueError, match="not a baseline mode: base"):
        rj.rejudge(tmp_path, [t1, t2], ["all:base"], "cfg")


def test_what_each_re_judge_took_out_is_read_back_for_the_runs_cost(bench, tmp_path):
    """``replaced``: one entry per log line, with its time, task and scope (a whole task, its
    baselines, or one baseline mode); no log, no entries."""
    _, rj = bench
    assert rj.replaced(tmp_path) == []
    t1, t2 = a_run(tmp_path, bench)
    rj.rejudge(tmp_path, [t1, t2], ["all:baselines"], "cfg")
    rj.rejudge(tmp_path, [t1, t2], [t1.task_id], "cfg")
    rj.rejudge(tmp_path, [t1, t2], [f"{t2.task_id}:cudagraph"], "cfg")
    got = rj.replaced(tmp_path)
    assert [(e["task"], e["scope"]) for e in got] == [(t1.task_id, "baselines"), (t2.task_id, "baselines"),
                                                     (t1.task_id, "verdicts"), (t2.task_id, "mode")]
    assert all(isinstance(e["at"], str) and "T" in e["at"] for e in got)


@pytest.mark.cpu
def test_a_task_the_run_does_not_hold_changes_nothing(bench, tmp_path):
    _, rj = bench
    a_run(tmp_path, bench)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    env = dict(os.environ, CUDAL1_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "builtin_kernelbench.py"), "kernelbench:level1",
                           "--out", str(tmp_path), "--device", "cpu", "--rejudge", "level9/1"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith("--rejudge: not a task of this run: level9/1")
    assert "Traceback" not in done.stderr
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name in before} == before
    assert not (tmp_path / rj.LOG).exists()
