"""benchmarks/builtin_baseline_plan.py and its use by builtin_kernelbench.py and the cost probe:
which baselines a task needs timed (the search's verdict of a mode stands in for it; the graphed
compile modes wait for the task's CUDA-graph replay and are not timed where it did not pay), in
which order, what is written down for the skipped ones, and how the report counts them."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]
MODES = ["compile-default", "compile-max-autotune-no-cudagraphs", "compile-reduce-overhead", "compile-max-autotune",
         "cudagraph"]


@pytest.fixture
def plan(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import builtin_baseline_plan

    return builtin_baseline_plan


def row(task: str, cudagraph: tuple[float, float, float] | None = None, chains: list | None = None,
        status: str = "ok") -> dict:
    """A task row as builtin_figures.task_rows writes it; ``cudagraph``: (speedup, CI low, CI high)."""
    r = {"task": task, "chains": chains or [], "modes": {}, "mode_status": {}, "mode_ci": {}}
    if cudagraph is not None:
        value, lo, hi = cudagraph
        r["modes"]["cudagraph"] = value if status == "ok" else 1.0
        r["mode_status"]["cudagraph"] = status
        if status == "ok":
            r["mode_ci"]["cudagraph"] = [lo, hi]
    return r


def test_graphed_modes_are_timed_after_the_rest(plan):
    assert plan.phases(MODES) == [["compile-default", "compile-max-autotune-no-cudagraphs", "cudagraph"],
                                  ["compile-reduce-overhead", "compile-max-autotune"]]
    assert plan.phases(["compile-default"]) == [["compile-default"]]  # no empty phase
    assert plan.phases(["compile-max-autotune"]) == [["compile-max-autotune"]]


def test_the_modes_timed_in_the_searchs_batch_need_nothing_of_the_search(plan):
    """Neither a graphed mode (it waits for the task's ``cudagraph`` verdict) nor the mode the
    builtin proposes in its first round (its own verdict stands in)."""
    assert plan.ahead(MODES) == ["compile-max-autotune-no-cudagraphs", "cudagraph"]
    assert plan.ahead(["compile-default"]) == [] and plan.ahead([]) == []
    assert plan.ahead(["compile-max-autotune", "compile-reduce-overhead"]) == []


def test_graphed_modes_are_skipped_only_where_cuda_graph_replay_measurably_did_not_pay(plan):
    rows = [row("slow", (0.89, 0.88, 0.91)), row("noisy", (0.99, 0.95, 1.02)), row("pays", (1.4, 1.3, 1.5)),
            row("untimed"), row("failed", (0, 0, 0), status="runtime_error")]
    todo, skipped = plan.plan(rows, ["compile-reduce-overhead", "compile-max-autotune"])
    assert set(skipped) == {"slow"} and set(skipped["slow"]) == {"compile-reduce-overhead", "compile-max-autotune"}
    reason = skipped["slow"]["compile-max-autotune"]
    assert "0.890x" in reason and "up to 0.910" in reason and "compile-max-autotune-no-cudagraphs" in reason
    # mode by mode, every other task timed (an interval reaching 1.0, a gain, no replay or a failed one)
    assert todo == [(t, m) for m in ("compile-reduce-overhead", "compile-max-autotune")
                    for t in ("noisy", "pays", "untimed", "failed")]
    # the rule touches only the graphed compile modes
    todo, skipped = plan.plan(rows[:1], ["compile-default", "compile-max-autotune-no-cudagraphs", "cudagraph"])
    assert skipped == {} and len(todo) == 3


def test_a_mode_the_search_judged_and_verified_is_not_timed_again(plan):
    r = row("t", chains=[["compile-default", "ok", 1.1], ["compile-max-autotune-no-cudagraphs", "runtime_error", None],
                         ["compile-default+cudagraph", "ok", 1.2], ["cudagraph", "ok", 0.6]])
    todo, skipped = plan.plan([r], ["compile-default", "cudagraph", "compile-max-autotune-no-cudagraphs"])
    assert skipped == {"t": {"compile-default": "the search's own verdict of this mode stands in"}}
    # a failed chain stands for nothing; the policy's CUDA-graph replay clones its outputs, the baseline's does not
    assert todo == [("t", "cudagraph"), ("t", "compile-max-autotune-no-cudagraphs")]


def test_skips_are_merged_into_the_run_directory(plan, tmp_path):
    plan.record_skips(tmp_path, {"a": {"compile-max-autotune": "x"}})
    plan.record_skips(tmp_path, {"a": {"compile-reduce-overhead": "y"}, "b": {"compile-max-autotune": "z"}})
    assert plan.load_skips(tmp_path) == {"a": {"compile-max-autotune": "x", "compile-reduce-overhead": "y"},
                                         "b": {"compile-max-autotune": "z"}}
    assert not (tmp_path / (plan.SKIPS + ".tmp")).exists()


class FakeJudge:
    """Records what the benchmark asks to be timed; ``store`` maps (task, mode) to the row values the
    next ``task_rows`` call shows (as the run store would after the batch)."""

    def __init__(self, measured: dict[tuple[str, str], tuple[float, float, float]]) -> None:
        self.measured, self.timed, self.batches = measured, {}, []

    def baselines(self, tasks, modes, **_):
        self.batches.append([(t.task_id, m) for m in modes for t in tasks])

    def baselines_for(self, pairs, **_):
        self.batches.append([(t.task_id, m) for t, m in pairs])
        for t, m in pairs:
            self.timed[(t.task_id, m)] = self.measured.get((t.task_id, m), (1.0, 0.9, 1.1))

    def rows(self, out, chunk, config_hash, rules_of, modes):
        rows = []
        for t in chunk:
            r = row(t.task_id, chains=[["compile-default", "ok", 1.3]] if t.task_id == "searched" else [])
            for (task, m), (v, lo, hi) in self.timed.items():
                if task == t.task_id:
                    r["modes"][m], r["mode_status"][m], r["mode_ci"][m] = v, "ok", [lo, hi]
            rows.append(r)
        return rows


def test_the_benchmark_times_the_plan_in_two_phases_and_writes_the_skips(plan, tmp_path, monkeypatch):
    import builtin_kernelbench

    judge = FakeJudge({("flat", "cudagraph"): (0.8, 0.75, 0.85), ("launchy", "cudagraph"): (1.6, 1.5, 1.7)})
    monkeypatch.setattr(builtin_kernelbench, "task_rows", judge.rows)
    chunk = [SimpleNamespace(task_id=t) for t in ("flat", "launchy", "searched")]
    builtin_kernelbench.time_baselines(tmp_path, judge, chunk, MODES, "h", levers=True)
    first, second = judge.batches
    assert {m for _, m in first} == {"compile-default", "compile-max-autotune-no-cudagraphs", "cudagraph"}
    assert ("searched", "compile-default") not in first and len(first) == 8
    assert second == [("launchy", "compile-reduce-overhead"), ("searched", "compile-reduce-overhead"),
                      ("launchy", "compile-max-autotune"), ("searched", "compile-max-autotune")]
    skips = json.loads((tmp_path / plan.SKIPS).read_text())
    assert set(skips) == {"flat", "searched"} and set(skips["flat"]) == {"compile-reduce-overhead",
                                                                         "compile-max-autotune"}
    assert list(skips["searched"]) == ["compile-default"]
    assert plan.load_done(tmp_path) == {"flat", "launchy", "searched"}  # listed once all their baselines ran
    # levers off: every mode of every task, in one batch
    off = FakeJudge({})
    builtin_kernelbench.time_baselines(tmp_path, off, chunk, MODES, "h", levers=False)
    assert off.batches == [[(t.task_id, m) for m in MODES for t in chunk]]


def test_a_skipped_mode_is_named_and_left_out_of_its_figures(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    from builtin_figures import markdown, summarize

    def full(task: str, skipped: bool) -> dict:
        modes = {"compile-default": 1.2, "compile-max-autotune": None if skipped else 0.9}
        return {"task": task, "level": 1, "rules": [], "judged": True, "degenerate": False, "pending": 0, "rounds": 1,
                "candidates": 1, "verified": 1, "best": 1.5, "best_passes": "algebraic", "best_hash": "h",
                "modes": modes, "mode_status": {"compile-default": "ok",
                                                "compile-max-autotune": "skipped" if skipped else "ok"},
                "mode_ci": {}, "mode_source": {"compile-default": "search" if skipped else "baseline"},
                "mode_skipped": {"compile-max-autotune": "graphs do not pay"} if skipped else {},
                "best_mode": "compile-default", "best_mode_value": 1.2, "best_confirmed": None,
                "mode_confirmed": None, "chains": [("algebraic", "ok", 1.5)], "environments": []}

    rows = [full("a", True), full("b", False)]
    modes = ["compile-default", "compile-max-autotune"]
    s = summarize(rows, modes) | {"rows": rows}
    assert s["overall"]["compile-max-autotune"]["n"] == 1 and s["over"]["compile-max-autotune"]["n"] == 1
    assert s["overall"]["compile-default"]["n"] == 2
    text = markdown(s, modes)
    per_task = {line.split()[0]: line.split() for line in text.splitlines()[:4] if line[:2] in ("a ", "b ")}
    assert per_task["a"][6] == "skipped" and per_task["b"][6] == "0.90"  # the compile-max-autotune column
    assert "modes taken from the search's own verdict: 1; modes not timed because CUDA-graph replay did not pay " \
           "on the task: 1" in text


def test_the_probe_decides_the_graph_rule_on_its_own_measurement(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import builtin_cost

    def verdict(speedup, lo, hi, status="ok"):
        return SimpleNamespace(status=SimpleNamespace(value=status), speedup=speedup, speedup_ci=(lo, hi))

    t = SimpleNamespace(task_id="t")
    run_row = row("t", (1.5, 1.4, 1.6), chains=[["compile-default", "ok", 1.2]])
    run_row["modes"]["compile-default"], run_row["mode_status"]["compile-default"] = 1.2, "ok"
    measured = builtin_cost._as_measured(run_row, [(t, "cudagraph")], [verdict(0.9, 0.85, 0.95)])
    assert measured["modes"] == {"compile-default": 1.2, "cudagraph": 0.9}  # the searched mode kept, the rest its own
    assert measured["mode_ci"]["cudagraph"] == [0.85, 0.95] and measured["chains"] == run_row["chains"]


def test_a_task_whose_baselines_have_not_run_is_unfinished(monkeypatch):
    """A search's own compile-mode candidates stand in for those modes, but until the task's
    baselines ran they are not its row: the stride-5 run once counted 8 searched tasks against
    compile default alone, as if no other mode had been timed."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    from builtin_figures import baselines_pending, finished, summarize

    modes = ["compile-default", "compile-max-autotune", "cudagraph"]
    assert baselines_pending(modes, {"compile-default": "search"}, False)  # searched, no baseline yet
    assert baselines_pending(modes, {"compile-default": "search", "cudagraph": "baseline"}, False)  # cut short
    assert not baselines_pending(modes, {"compile-default": "search", "cudagraph": "baseline"}, True)  # marked done
    assert not baselines_pending(modes, dict.fromkeys(modes, "baseline"), False)  # runs from before the mark
    assert not baselines_pending([], {}, False)  # --modes none
    row = {"task": "a", "level": 1, "judged": True, "pending": 0, "rounds": 2, "degenerate": False,
           "baselines_pending": True}
    assert not finished(row) and finished(row | {"baselines_pending": False})
    assert finished({k: v for k, v in row.items() if k != "baselines_pending"})  # rows of older reports
    assert summarize([row | {"verified": 1, "best": 2.0, "best_passes": "x", "modes": {}, "mode_status": {},
                             "best_mode": None, "best_mode_value": None, "best_confirmed": None,
                             "mode_confirmed": None, "chains": [], "environments": []}], modes)["unfinished"] == ["a"]
