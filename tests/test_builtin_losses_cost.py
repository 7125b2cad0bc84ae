"""benchmarks/builtin_losses.py and builtin_cost.py on recorded and synthetic rows: why a compile
mode beat every builtin chain (host time the figure leaves out, a pass that applies but is
slower, no pass at all), the table docs/builtin.md carries, and what a task costs in GPU time."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import builtin_cost
    import builtin_losses

    return builtin_losses, builtin_cost


def fig(gpu: float, host: float | None = None) -> dict:
    return {"gpu": {"speedup": gpu}, "host": {"speedup": gpu if host is None else host}}


def chain(name: str, gpu: float | None, host: float | None = None, status: str = "ok") -> dict:
    return {"chain": name, "status": status, "speedup": gpu, "figures": fig(gpu, host) if gpu else {}}


def test_each_reason_and_their_order(bench):
    losses, _ = bench
    mode = fig(2.0, 1.5)
    # a CUDA-graph chain saves host time the device-time figure leaves out: that reason comes first
    reason, detail = losses.classify("compile-max-autotune", mode, [
        chain("compile-default", 1.2), chain("gemm-3xtf32", 1.1), chain("gemm-3xtf32+cudagraph", 1.3, host=1.9)])
    assert reason == "host" and detail.startswith("gemm-3xtf32+cudagraph: host-inclusive 1.90x")
    # no chain wins on host time; a graph pass applied and is slower: its best chain is named
    reason, detail = losses.classify("compile-max-autotune", mode, [
        chain("compile-default", 1.2), chain("gemm-3xtf32", 1.1), chain("gemm-3xtf32+compile-default", 1.4)])
    assert reason == "slower" and detail.startswith("gemm-3xtf32+compile-default 1.40x")
    # a graph pass applied but failed: still "applies", with its status
    reason, detail = losses.classify("compile-default", mode, [chain("triton-fusion", None, status="incorrect"),
                                                               chain("cudagraph", 0.9)])
    assert reason == "slower" and detail == "triton-fusion incorrect"
    # only execution passes were judged: no pass applies, with the graph passes' reasons
    reason, detail = losses.classify("compile-max-autotune-no-cudagraphs", mode,
                                     [chain("compile-default", 1.2), chain("inductor[cd]", 1.4),
                                      chain("compile-cudagraph", 0.8)], {"algebraic": "no rewrite applies"})
    assert reason == "no_pass" and "algebraic: no rewrite applies" in detail and "inductor[cd]" in detail
    assert not any(losses.is_exec_pass(p) for p in ("algebraic", "gemm-3xtf32", "channels-last"))
    assert all(losses.is_exec_pass(p) for p in ("compile-default", "inductor[cd,gemm]", "cudagraph",
                                                 "compile-cudagraph"))


def test_the_doc_table_is_replaced_between_its_markers_only(bench, tmp_path):
    losses, _ = bench
    doc = tmp_path / "builtin.md"
    doc.write_text(f"# Builtin\nbefore\n{losses.BEGIN}\nold table\n{losses.END}\nafter\n")
    row = {"task": "level1/38", "mode": "compile-max-autotune-no-cudagraphs", "mode_speedup": 2.13, "builtin": 1.31,
           "builtin_chain": "compile-default", "ratio": 0.615, "intervals_apart": True, "mode_judged_by_builtin": False,
           "reason": "slower", "why": losses.REASONS["slower"], "detail": "triton-reduce 0.99x | x"}
    losses.write_doc(doc, {"losses": [row], "finished": 8, "environments": ["NVIDIA H200 / torch 2.11"]}, "r.json")
    text = doc.read_text()
    assert text.startswith("# Builtin\nbefore\n") and text.endswith(f"{losses.END}\nafter\n")
    assert "old table" not in text and "1 of 8 finished tasks" in text
    assert "| level1/38 | compile-max-autotune-no-cudagraphs | 2.13× | 1.31× |" in text
    assert "triton-reduce 0.99x / x" in text  # a pipe inside a cell would split it
    with pytest.raises(SystemExit, match="no losses"):
        losses.write_doc(doc, {"finished": 8}, "r.json")


def test_device_seconds_per_task_per_call(bench):
    _, cost = bench
    run = {"batches": [
        {"what": "search", "jobs": 40, "wall_s": 300.0},  # before the GPU count was kept: one GPU
        {"what": "baselines", "jobs": 20, "wall_s": 200.0},
        {"what": "search", "jobs": 10, "wall_s": 50.0, "call": "c2", "gpus": 2, "levers": "on", "workers_per_gpu": 3},
        {"what": "confirm winners", "jobs": 2, "wall_s": 10.0, "call": "c2", "gpus": 2, "levers": "on",
         "workers_per_gpu": 1},
    ]}
    calls = {c["call"]: c for c in cost.call_costs(run, {"c2": 2})}
    assert calls["before"]["device_s_total"] == 500.0 and calls["before"]["device_s_per_task"] is None
    assert calls["c2"]["device_s"] == {"search": 100.0, "confirm": 20.0} and calls["c2"]["device_s_per_task"] == 60.0
    # the call's workers are its search's and baselines', not the re-timing's own count
    assert calls["before"]["workers_per_gpu"] is None and calls["c2"]["workers_per_gpu"] == 3
    text = cost.markdown({"held_s_per_task": dict.fromkeys(("search", "baselines", "baselines_compile",
                                                            "baselines_construct", "total")),
                          "tasks": 0, "calls": list(calls.values())})
    assert "cost of call c2 (levers on, 3 worker(s) per GPU): device seconds search 100, confirm 20" in text
    assert "cost of call before (levers n/a): device seconds search 300, baselines 200" in text
    assert cost.held_s({"setup": 5.0, "import": 2.0, "lane": 9.0, "construct": 1.0, "correctness": 3.0,
                        "timing": 2.0}) == 6.0  # only the phases that hold the GPU's lease


def test_lease_held_seconds_by_level_and_compile_phase(bench):
    """The median lease-held seconds per task of each level, over the tasks with baselines, and
    the ``compile`` phase (torch.compile's compiling) counted in the compile seconds."""
    _, cost = bench

    def task(search: float, base: float, compiling: float = 0.0) -> dict:
        return {"search": {"verdicts": 4, "held_s": search, "compile_s": 0.0, "compiling_s": 0.0},
                "baselines": {"verdicts": 2 if base else 0, "held_s": base, "compile_s": compiling,
                              "construct_s": 0.0, "compiling_s": compiling},
                "confirm": {"verdicts": 2, "held_s": 10.0}}

    costs = {"level1/3": task(20, 30), "level1/8": task(40, 30, 10), "level3/23": task(100, 200, 120),
             "level3/38": task(100, 0)}  # without baselines yet: not counted
    summary = cost.summarize(costs, [])
    assert summary["held_s_by_level"] == {"level1": {"tasks": 2, "total": 70.0},
                                          "level3": {"tasks": 1, "total": 310.0}}
    text = cost.markdown(summary)
    assert "by level, median lease-held seconds per task, all stages: level1 70 (2 tasks), level3 310 (1 tasks)" in text
    assert "baselines 30 (construct + compile + correctness 10, of it construct 0, compile 10), all 80" in text
    assert cost.compile_s({"construct": 1.0, "compile": 20.0, "correctness": 3.0, "timing": 2.0}) == 24.0


def test_the_whole_runs_device_seconds_per_task_and_held_seconds_by_phase(bench):
    """Over every call (one that finished nothing included: its work is on later tasks), and the
    lease-held phases of every verdict summed per stage, largest first (never setup or import)."""
    _, cost = bench
    costs = {"level1/3": {"steps": {"correctness": cost.step_sums([{"compare_ms": 1500.0, "total_ms": 4000.0,
                                                                    "candidate_first_ms": 2500.0}, None]),
                                    "reference": cost.step_sums([None])},
                          "phases": {"search": cost.phase_sums([{"timing": 2.0, "correctness": 3.0, "import": 9.0},
                                                                {"correctness": 1.5, "setup": 4.0}]),
                                     "confirm": cost.phase_sums([{"timing": 1.0}, None])},
                          "search": {"verdicts": 2, "held_s": 6.5}, "baselines": {"verdicts": 0, "held_s": 0.0},
                          "confirm": {"verdicts": 2, "held_s": 1.0}}}
    calls = cost.call_costs({"batches": [{"what": "search (cut)", "jobs": 3, "wall_s": 90.0, "call": "c1"},
                                         {"what": "search", "jobs": 5, "wall_s": 60.0, "call": "c2"},
                                         {"what": "baselines (drained)", "jobs": 2, "wall_s": 30.0, "call": "c2"}]},
                            {"c1": 0, "c2": 2})
    summary = cost.summarize(costs, calls)
    assert summary["device_s"] == {"total": 180.0, "finished": 2, "per_task": 90.0}
    assert summary["held_s_by_phase"] == {"search": {"correctness": 4.5, "timing": 2.0}, "confirm": {"timing": 1.0}}
    text = cost.markdown(summary | {"held_s_per_task": dict.fromkeys(summary["held_s_per_task"])})
    assert "cost of all 2 calls: device seconds 180 for 2 task(s) finished: 90 s per task" in text
    assert "lease-held seconds by phase, all tasks: search correctness 4, timing 2; confirm timing 1" in text
    assert summary["s_by_step"] == {"correctness": {"candidate_first": 2.5, "compare": 1.5}}  # total_ms left out
    assert "correctness phase by step, search and baselines: candidate_first 2, compare 2" in text


def test_batches_whose_verdicts_a_re_judge_of_every_task_took_out_leave_the_runs_cost(bench):
    """``standing``: a baselines batch that ended before every task's baselines were taken out is
    left out; one after it, one re-judged for some tasks only, one without an end time and a
    search batch (its verdicts kept by a baselines re-judge) stay counted.  The whole run's line
    divides by the tasks finished now, not by the calls' finishings."""
    _, cost = bench
    run = {"batches": [
        {"jobs": 1, "what": "search", "wall_s": 100.0, "call": "c1", "at": "2026-12-05 10:00:00"},
        {"jobs": 1, "what": "baselines+confirm (drained)", "wall_s": 50.0, "call": "c1", "at": "2026-12-05 10:05:00"},
        {"jobs": 1, "what": "baselines", "wall_s": 7.0, "call": "c0"},  # no end time: kept
        {"jobs": 1, "what": "confirm winners", "wall_s": 20.0, "call": "c2", "gpus": 2, "at": "2026-12-05 11:00:00"},
        {"jobs": 1, "what": "baselines+confirm", "wall_s": 30.0, "call": "c3", "at": "2026-12-05 13:00:00"},
        {"jobs": 1, "what": "baselines+confirm", "wall_s": 4.0, "call": "c4", "at": "2026-12-05 14:00:00"},
    ]}
    replaced = [{"at": "2026-12-05T10:30:00", "task": "a", "scope": "mode"},  # one mode only: covers nothing
                {"at": "2026-12-05T12:00:00", "task": "a", "scope": "baselines"},
                {"at": "2026-12-05T12:00:01", "task": "b", "scope": "verdicts"},
                {"at": "2026-12-05T13:30:00", "task": "a", "scope": "baselines"}]  # one task of two: covers nothing
    st = cost.standing(run, replaced, ["a", "b"], 1)
    assert st == {"device_s": 100.0 + 7.0 + 30.0 + 4.0, "finished": 1, "per_task": 141.0, "unfinished": 1,
                  "replaced_s": 50.0 + 40.0, "replaced_batches": 2}
    assert cost.standing(run, [], ["a", "b"], 2)["replaced_batches"] == 0
    whole = [{"at": "2026-12-05T12:00:00", "task": t, "scope": "verdicts"} for t in ("a", "b")]
    assert cost.standing(run, whole, ["a", "b"], 2)["device_s"] == 30.0 + 4.0 + 7.0  # the search's too
    calls = cost.call_costs(run, {"c1": 2, "c3": 1, "c4": 1})  # a task finished twice across calls
    summary = cost.summarize({}, calls, standing=st)
    assert summary["device_s"] == {"total": 231.0, "finished": 1, "per_task": 231.0}
    text = cost.markdown(summary | {"held_s_per_task": dict.fromkeys(summary["held_s_per_task"])})
    assert ("cost of the verdicts the figures stand on: device seconds 141 for 1 task(s) finished: 141 s per task "
            "(1 task(s) unfinished, their work so far included); left out, 90 device s of 2 batch(es) whose "
            "verdicts a later re-judge of every task took out") in text
    quiet = cost.markdown(cost.summarize({}, calls, standing=cost.standing(run, [], ["a", "b"], 2))
                          | {"held_s_per_task": dict.fromkeys(summary["held_s_per_task"])})
    assert "stand on" not in quiet  # nothing left out: the whole run's line says it all


def test_the_exclusive_seconds_before_timing_per_stage_and_the_first_calls_lease(bench):
    """``figures["exclusive_before_timing_s"]`` summed per stage over the verdicts that recorded it
    (older ones did not), and each call's ``first_call_lease`` beside its compile lease."""
    from types import SimpleNamespace

    _, cost = bench
    rs = [SimpleNamespace(figures={"exclusive_before_timing_s": 0.5}), SimpleNamespace(figures={}),
          SimpleNamespace(figures={"exclusive_before_timing_s": 2.0})]
    assert cost.exclusive_s(rs) == {"s": 2.5, "verdicts": 2}
    costs = {t: {"search": {"verdicts": 3, "held_s": 1.0}, "baselines": {"verdicts": 0, "held_s": 0.0},
                 "confirm": {"verdicts": 0, "held_s": 0.0},
                 "exclusive": {"search": cost.exclusive_s(rs), "baselines": {"s": 0.0, "verdicts": 0}}}
             for t in ("level1/3", "level1/8")}
    calls = cost.call_costs({"batches": [{"what": "baselines", "jobs": 2, "wall_s": 30.0, "call": "c1",
                                          "compile_lease": "released, autotuning too",
                                          "first_call_lease": "choosers", "baseline_lease": "choosers",
                                          "lease_order": "choices-first"}]},
                           {"c1": 1})
    summary = cost.summarize(costs, calls)
    assert summary["exclusive_before_timing"] == {"search": {"s": 5.0, "verdicts": 4}, "baselines": {"s": 0.0,
                                                                                                  "verdicts": 0}}
    text = cost.markdown(summary | {"held_s_per_task": dict.fromkeys(summary["held_s_per_task"])})
    assert "untimed), seconds: search 5 (4 verdicts)" in text and "baselines 0" not in text
    assert ("compiling with the lease released, autotuning too, first call's lease choosers, a compiled baseline's "
            "choosers, the lease choices-first)") in text


def test_verdicts_running_at_once_count_each_overlap_and_skip_the_gaps(bench):
    _, cost = bench
    # two lanes: a and b side by side for 4 s, b alone for 2 s (a tail), nothing for 10 s, c alone for 1 s
    spans = [(0.0, 4.0), (0.0, 6.0), (16.0, 17.0), (17.0, 17.5)]  # d starts as c ends: never two at once
    assert cost.running_at_once(spans) == {1: 3.5, 2: 4.0}
    assert cost.running_at_once([]) == {}
    summary = cost.summarize({}, [], {1: 3.5, 2: 4.0})
    assert summary["running_s"] == {"1": 3.5, "2": 4.0}
    text = cost.markdown(summary | {"held_s_per_task": dict.fromkeys(summary["held_s_per_task"])})
    assert "verdicts running at once, seconds (from their recording times; re-timings recorded before 2026-12-05 " \
           "are not in it): 1: 4, 2: 4" in text


def test_re_timings_with_a_recording_time_count_among_the_verdicts_running(bench, tmp_path):
    """A joined batch runs re-timings beside baselines: those that carry ``at`` (since 2026-12-05)
    are spans too; older entries without it are left out."""
    from cudal1.store import RunStore

    _, cost = bench
    RunStore(tmp_path / "cudal1.sqlite").close()  # a store with no verdict
    (tmp_path / "confirm.json").write_text(json.dumps({
        "t|abc": {"status": "ok", "wall_s": 4.0, "at": 104.0}, "t|mode:cudagraph": {"status": "ok", "wall_s": 2.0,
                                                                                     "at": 103.0},
        "u|old": {"status": "ok", "wall_s": 9.0}}))
    assert cost.running_seconds(tmp_path, "h") == {1: 2.0, 2: 2.0}


def test_which_verdicts_ran_by_themselves_and_for_how_long(bench, tmp_path, monkeypatch):
    """The seconds each verdict kind of a task was the only one running (the other lanes idle),
    from the store's times and the re-timings', longest first, named by task id; the report's line
    adds up those judged again alone and the re-timings."""
    import cudal1.store as store_module
    from cudal1.store import RunStore
    from cudal1.types import EvalResult, Status

    _, cost = bench
    assert cost.running_alone([(0.0, 4.0, "a"), (0.0, 6.0, "b"), (16.0, 17.0, "c"), (17.0, 17.5, "d")]) == \
        {"b": 2.0, "c": 1.0, "d": 0.5}
    clock = iter([10.0, 30.0, 31.0])
    monkeypatch.setattr(store_module.time, "time", lambda: next(clock))

    def verdict(cand: str, wall: float, flags: list[str]) -> EvalResult:
        return EvalResult(status=Status.OK, task_name="t", task_hash="h1", candidate_hash=cand, message="",
                          flags=flags, speedup=1.0, wall_s=wall, config_hash="cfg")

    with RunStore(tmp_path / "cudal1.sqlite") as store:
        store.record_evaluation(verdict("c1", 10.0, []))  # 0-10
        store.record_evaluation(verdict("c2", 28.0, []))  # 2-30: 20 s by itself
        store.record_evaluation(verdict("c3", 1.0, ["rejudged_alone"]))  # 30-31
    (tmp_path / "confirm.json").write_text(json.dumps({"level1/1|abc": {"status": "ok", "wall_s": 4.0, "at": 35.0}}))
    alone = cost.alone_seconds(tmp_path, "cfg", {"h1": "level1/1"})
    assert alone == [{"task": "level1/1", "kind": "candidate", "s": 22.0, "rejudged_alone": False},
                     {"task": "level1/1", "kind": "re-timing", "s": 4.0, "rejudged_alone": False},
                     {"task": "level1/1", "kind": "candidate", "s": 1.0, "rejudged_alone": True}]
    assert cost.running_seconds(tmp_path, "cfg") == {1: 27.0, 2: 8.0}
    summary = cost.summarize({}, [], None, None, alone)
    text = cost.markdown(summary | {"held_s_per_task": dict.fromkeys(summary["held_s_per_task"])})
    assert ("one verdict running by itself, seconds: 27 (verdicts judged again alone 1, re-timings 4); longest: "
            "level1/1 candidate 22, level1/1 re-timing 4, level1/1 candidate (judged again alone) 1") in text


def test_the_probe_says_which_speedups_stay_inside_their_intervals(bench):
    _, cost = bench
    on = {"t|compile-default": {"status": "ok", "speedup": 1.02, "speedup_ci": [1.00, 1.04]},
          "t|cudagraph": {"status": "ok", "speedup": 0.90, "speedup_ci": [0.89, 0.91]},
          "u|compile-default": {"status": "runtime_error", "speedup": None}}
    off = {"t|compile-default": {"status": "ok", "speedup": 1.03, "speedup_ci": [1.01, 1.05]},
           "t|cudagraph": {"status": "ok", "speedup": 0.95, "speedup_ci": [0.94, 0.96]},
           "u|compile-default": {"status": "ok", "speedup": 1.1}}
    a = cost.agreement(on, off)
    assert a["compared"] == 2 and a["overlapping"] == 1
    assert [r[0] for r in a["rows"] if not r[3]] == ["t|cudagraph"]
    assert a["status_differs"] == [["u|compile-default", "ok", "runtime_error"]]



def _report(calls: list[dict], rows: list[dict], held: dict[str, float], unfinished=()) -> dict:
    return {"rows": rows, "unfinished": list(unfinished), "degenerate": [],
            "retimed": {"best": {"n": len(rows), "geomean": 1.2}, "over_best_compile_mode": None},
            "cost": {"calls": calls, "per_task": {t: {"search": {"held_s": s}} for t, s in held.items()}}}


def _row(task: str, chain: str, best: float, ci: list[float] | None, mode: float, mode_ci: list[float]) -> dict:
    return {"task": task, "level": 1, "judged": True, "pending": 0, "rounds": 2, "degenerate": False,
            "verified": 1, "chains": [[chain, "ok", best]], "environments": [],
            "best_mode": "compile-default", "best_mode_value": mode,
            "best": best, "best_ci": ci, "best_passes": chain,
            "modes": {"compile-default": mode}, "mode_status": {"compile-default": "ok", "cudagraph": "skipped"},
            "mode_ci": {"compile-default": mode_ci},
            "best_confirmed": {"status": "ok", "speedup": best, "speedup_ci": ci}, "mode_confirmed": None}


def test_two_judge_configurations_compared_on_the_tasks_finished_under_both(bench):
    _, cost = bench
    old_calls = [{"call": "before", "device_s_total": 900.0}, {"call": "c1", "device_s_total": 100.0}]
    before = _report(old_calls, [_row("a", "algebraic", 2.0, None, 1.0, [0.99, 1.01]),
                                 _row("b", "compile-default", 1.1, [1.05, 1.15], 1.1, [1.08, 1.12])],
                     {"a": 100.0, "b": 80.0})
    now = _report(old_calls + [{"call": "c2", "device_s_total": 150.0}],
                  [_row("a", "algebraic", 2.05, [2.0, 2.1], 1.0, [0.98, 1.02]),
                   _row("b", "triton-fusion", 1.3, [1.25, 1.35], 1.1, [1.09, 1.11]),
                   _row("c", "algebraic", 1.5, [1.4, 1.6], 1.0, [0.9, 1.1])],
                  {"a": 50.0, "b": 40.0, "c": 45.0}, unfinished=["c"])
    now["rows"][2]["baselines_pending"] = True  # what made c unfinished
    c = cost.compare(before, now)
    assert c["tasks"] == ["a", "b"]  # c is not finished under the new configuration
    # only the new configuration's calls count for it (an upper bound: unfinished work is in them)
    assert c["device_s_per_task"] == {"before": 500.0, "now": 75.0, "before_tasks": 2, "now_tasks": 2,
                                     "now_calls": 1}
    assert c["held_s_per_task"] == {"before": 90.0, "now": 45.0}
    apart = {r[0] for r in c["agreement"]["rows"] if not r[3]}
    # a's best had no interval before: it counts as a point, here on the edge of the new interval
    assert apart == {"b|best builtin", "b|best builtin, re-timed"}
    assert c["agreement"]["compared"] == 6 and "b|mode:cudagraph" not in {r[0] for r in c["agreement"]["rows"]}
    assert c["chains"] == [["a", "algebraic", "algebraic"], ["b", "compile-default", "triton-fusion"]]
    # the headline figures of both, on the same tasks (c's 1.5x is left out of the new one)
    assert c["figures"]["before"]["best"]["n"] == c["figures"]["now"]["best"]["n"] == 2
    assert c["figures"]["before"]["best"]["geomean"] == pytest.approx((2.0 * 1.1) ** 0.5)
    assert c["figures"]["now"]["best"]["geomean"] == pytest.approx((2.05 * 1.3) ** 0.5)
    assert c["intervals"]["best"]["n"] == 2 and c["intervals"]["over_best_compile_mode"]["n"] == 0
    text = cost.compare_markdown(c)
    assert "re-timed best builtin over eager (n 2), geomean [95% bootstrap interval over tasks]: before 1.483 [" in text
    assert "over the re-timed best compile mode (n 0), geomean [95% bootstrap interval over tasks]: before -" in text
    assert "before 500 (2 tasks), now 75" in text and "winning chain before compile-default, now triton-fusion" in text
    assert "4 of 6" in text and "within 1% of each other: 2 of 6" in text
    assert c["agreement"]["largest"][0] == "b|best builtin"  # 1.1 -> 1.3
    # a mode that failed under one configuration is named, whatever its status
    now["rows"][0]["mode_status"]["compile-default"] = "runtime_error"
    assert cost.compare(before, now)["agreement"]["status_differs"] == [["a|mode:compile-default", "ok",
                                                                         "runtime_error"]]


def test_the_headline_figures_with_bootstrap_intervals_over_tasks_and_paired_between_runs(bench):
    """Each run's re-timed geomeans carry a 95% bootstrap interval over the tasks, and the per-task
    ratio of the two runs one of its own: a run that reads the same on every task but one noisy one
    has a paired interval around 1.0 far narrower than either run's own."""
    _, cost = bench
    assert cost.geomean_interval([]) is None
    g, lo, hi = cost.geomean_interval([2.0, 2.0, 2.0])
    assert g == lo == hi == pytest.approx(2.0)  # no spread, no interval
    values = [1.0, 1.2, 1.5, 2.0, 3.0, 0.8, 1.1, 4.0]
    g, lo, hi = cost.geomean_interval(values)
    assert lo < g < hi and g == pytest.approx(cost.math.prod(values) ** (1 / len(values)))
    assert cost.geomean_interval(values) == [g, lo, hi]  # seeded: the same every time
    tasks = [f"t{i}" for i in range(len(values))]

    def rows(scale: dict[str, float]) -> dict[str, dict]:
        out = {}
        for t, v in zip(tasks, values):
            r = _row(t, "algebraic", v * scale.get(t, 1.0), None, 1.0, [0.99, 1.01])
            r["mode_confirmed"] = {"status": "ok", "speedup": 1.0 if t != "t0" else 2.0}
            out[t] = r
        return out

    iv = cost.headline_intervals(rows({}), rows({"t3": 1.1}), tasks)
    assert iv["best"]["n"] == iv["over_best_compile_mode"]["n"] == len(tasks)
    assert iv["best"]["before"] == [g, lo, hi]
    paired = iv["best"]["now_over_before"]
    assert paired[1] == pytest.approx(1.0) and paired[0] == pytest.approx(1.1 ** (1 / len(tasks)))
    assert paired[2] - paired[1] < (hi - lo) / 10
    assert iv["over_best_compile_mode"]["before"][0] == pytest.approx(g / 2.0 ** (1 / len(tasks)))


def test_a_call_cut_inside_a_batch_keeps_its_time_under_the_stage_it_was_in(bench, tmp_path, monkeypatch):
    """A call stopped by its time limit inside a batch (whose stats never arrive) still counts the
    time since its last whole batch, as a ``cut`` batch of the stage it was in."""
    from types import SimpleNamespace

    _, cost = bench
    import builtin_kernelbench

    now = [100.0]
    monkeypatch.setattr(builtin_kernelbench.time, "monotonic", lambda: now[0])
    batches = builtin_kernelbench.Batches(tmp_path, gpus=1, workers=3, confirm_workers=1)
    batches.begin("search")
    now[0] = 160.0
    batches.add("search", SimpleNamespace(jobs=4, wall_s=58.0, gpu_idle_share=0.1, lease_wait_s=2.0,
                                          lanes_unused_share=0.25))
    batches.begin("baselines")
    batches.verdict()
    batches.verdict()
    now[0] = 250.0
    batches.cut()  # stopped inside the baselines
    cut = batches.run["batches"][-1]
    assert cut["what"] == "baselines (cut)" and cut["cut"] and cut["jobs"] == 2 and cut["wall_s"] == 90.0
    calls = cost.call_costs(batches.run, {batches.call: 1})
    assert calls[0]["device_s"] == {"search": 58.0, "baselines": 90.0} and calls[0]["jobs"] == 6
    assert [b["workers_per_gpu"] for b in batches.run["batches"]] == [3, 3] and calls[0]["workers_per_gpu"] == 3
    batches.begin("confirm")
    batches.add("confirm winners", SimpleNamespace(jobs=1, wall_s=5.0, gpu_idle_share=0.2, lease_wait_s=0.0,
                                                   lanes_unused_share=0.0))
    assert batches.run["batches"][-1]["workers_per_gpu"] == 1  # the re-timing's own count
    now[0] = 270.0
    batches.cut("drained", SimpleNamespace(gpu_idle_share=0.3, lease_wait_s=1.0, lanes_unused_share=0.4))
    drained = batches.run["batches"][-1]  # --drain-after: its running verdicts finished before the call ended
    assert drained["what"] == "confirm (drained)" and drained["cut"]
    assert (drained["gpu_idle_share"], drained["lanes_unused_share"]) == (0.3, 0.4)  # the drained batch's stats
    assert cut["gpu_idle_share"] is None and "lanes_unused_share" not in cut  # a cut one's are not known
    assert cost.call_costs(batches.run, {})[0]["device_s"]["confirm"] == 5.0 + 20.0
    assert (tmp_path / "run.json").exists()
    assert all("first_call_lease" not in b for b in batches.run["batches"])  # compiling held: not recorded
    (tmp_path / "r").mkdir()
    released = builtin_kernelbench.Batches(tmp_path / "r", compile_lease="released, autotuning too",
                                           first_call_lease="choosers")
    released.add("search", SimpleNamespace(jobs=1, wall_s=1.0, gpu_idle_share=0.0, lease_wait_s=0.0,
                                           lanes_unused_share=0.0))
    assert released.run["batches"][-1]["first_call_lease"] == "choosers"
    assert "baseline_lease" not in released.run["batches"][-1]  # the default, exclusive: not recorded
    assert "lease_order" not in released.run["batches"][-1]  # the default, any: not recorded
    (tmp_path / "c").mkdir()
    choosers = builtin_kernelbench.Batches(tmp_path / "c", compile_lease="released, autotuning too",
                                           first_call_lease="choosers", baseline_lease="choosers",
                                           lease_order="choices-first")
    choosers.add("search", SimpleNamespace(jobs=1, wall_s=1.0, gpu_idle_share=0.0, lease_wait_s=0.0,
                                           lanes_unused_share=0.0))
    assert choosers.run["batches"][-1]["baseline_lease"] == "choosers"
    assert cost.call_costs(choosers.run, {})[0]["baseline_lease"] == "choosers"
    assert choosers.run["batches"][-1]["lease_order"] == "choices-first"
    assert cost.call_costs(choosers.run, {})[0]["lease_order"] == "choices-first"


def test_another_run_of_the_sample_compared_with_against(bench, tmp_path, monkeypatch, capsys):
    _, cost = bench
    first, second = tmp_path / "first", tmp_path / "second"
    for run, speedup in ((first, 1.1), (second, 1.12)):
        run.mkdir()
        report = _report([{"call": run.name, "device_s_total": 100.0}],
                         [_row("a", "algebraic", speedup, [speedup - 0.01, speedup + 0.01], 1.0, [0.99, 1.01])],
                         {"a": 10.0})
        (run / "report.json").write_text(json.dumps(report))
    monkeypatch.setattr(sys, "argv", ["builtin_cost.py", str(second), "--against", str(first)])
    assert cost.main() == 0
    text = capsys.readouterr().out
    assert text.startswith("two runs of the sample on the 1 task(s)") and "before 100 (1 tasks), now 100" in text
    assert "stand on" not in text
    report = json.loads((second / "report.json").read_text())  # its first call's work was re-judged since
    report["cost"]["standing"] = {"device_s": 40.0, "finished": 1, "per_task": 40.0, "unfinished": 0,
                                  "replaced_s": 60.0, "replaced_batches": 1}
    (second / "report.json").write_text(json.dumps(report))
    assert cost.main() == 0
    text = capsys.readouterr().out
    assert ("now 100 (1 call(s), 1 tasks finished; work on unfinished tasks included); on the verdicts its figures "
            "stand on (batches a re-judge of every task replaced left out) 40 (1 tasks finished)") in text
    monkeypatch.setattr(sys, "argv", ["builtin_cost.py", str(second), "--against", str(tmp_path / "none")])
    with pytest.raises(SystemExit):
        cost.main()
    assert "does not exist" in capsys.readouterr().err
