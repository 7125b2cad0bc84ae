"""benchmarks/builtin_finish.py: a chunk's baselines and re-timing as one batch whose jobs join as
the verdicts they depend on come in.  Driven here by hand (each verdict handed to ``follow`` as the
batch would), against a stand-in judge and the rows the store would show; the real batch is
``tests/test_batch.py``'s follow-up tests, and the whole benchmark ``test_builtin_benchmark.py``."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]
MODES = ["compile-default", "compile-max-autotune-no-cudagraphs", "compile-reduce-overhead", "compile-max-autotune",
         "cudagraph"]
COMPILE = [m for m in MODES if m != "cudagraph"]
# what each (task, mode) baseline reads: (speedup, CI low, CI high)
READS = {("flat", "cudagraph"): (0.8, 0.75, 0.85), ("launchy", "cudagraph"): (1.6, 1.5, 1.7),
         ("launchy", "compile-max-autotune"): (2.0, 1.9, 2.1)}


@pytest.fixture
def finish_mod(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import builtin_finish

    return builtin_finish


class Judge:
    """Stands in for RecordedJudge (``stored``: the store's baselines) and for the rows
    ``builtin_figures.task_rows`` reads from the store and the run directory."""

    def __init__(self, out: Path, stored: dict[tuple[str, str], tuple[float, float, float]] | None = None) -> None:
        self.out, self.stored, self.kept = out, dict(stored or {}), []
        self.store = SimpleNamespace(candidates=lambda h: [SimpleNamespace(hash=f"best-{h}")])

    def baselines_to_time(self, pairs):
        return {}, [(t, m) for t, m in pairs if (t.task_id, m) not in self.stored]

    def keep_baseline(self, res):
        task, mode = res.task_hash, res.candidate_hash.removeprefix("baseline:")
        self.kept.append((task, mode))
        self.stored[(task, mode)] = READS.get((task, mode), (1.0, 0.9, 1.1))

    def rows(self, out, chunk, config_hash, rules_of, modes):
        import builtin_baseline_plan as plan

        done = plan.load_done(out)
        rows = []
        for t in chunk:
            r = {"task": t.task_id, "chains": [["compile-default", "ok", 1.3]] if t.task_id == "searched" else [],
                 "modes": {}, "mode_status": {}, "mode_ci": {}, "judged": True, "pending": 0, "rounds": [1, 2],
                 "degenerate": t.task_id == "degenerate", "best_hash": f"best-{t.task_id}",
                 "baselines_pending": t.task_id not in done}
            for (task, m), (v, lo, hi) in self.stored.items():
                if task == t.task_id:
                    r["modes"][m], r["mode_status"][m], r["mode_ci"][m] = v, "ok", [lo, hi]
            timed = {m: v for m, v in r["modes"].items() if m in COMPILE}
            r["best_mode"] = max(timed, key=timed.__getitem__) if timed else None
            rows.append(r)
        return rows


def verdict(job) -> SimpleNamespace:
    task = job.task.task_id
    name = f"baseline:{job.baseline_mode}" if job.baseline_mode else job.candidate.hash
    return SimpleNamespace(task_hash=task, candidate_hash=name, status=SimpleNamespace(value="ok"), speedup=1.0,
                           speedup_ci=[0.9, 1.1], flags=[], wall_s=1.0, phase_s={"timing": 0.5})


def drive(finish_mod, out: Path, judge: Judge, names: list[str], monkeypatch, retime: bool = True) -> tuple[list, list]:
    """Run the chunk's work to its end as one lane would: every job's verdict in turn, its
    follow-ups appended.  Returns (the starting jobs' labels, every job's label in judging order)."""
    monkeypatch.setattr(finish_mod, "task_rows", judge.rows)
    chunk = [SimpleNamespace(task_id=n, hash=n) for n in names]
    work = finish_mod.Finish(out, judge, chunk, MODES, "h", retime)
    jobs = work.start()
    first = [label(j) for j in jobs]
    order = []
    while jobs:
        job = jobs.pop(0)
        order.append(label(job))
        jobs += work.follow(len(order) - 1, verdict(job))
    return first, order


def label(job) -> str:
    return f"{job.task.task_id}:{job.baseline_mode or 'winner'}"


def test_each_job_joins_once_what_it_depends_on_is_judged(finish_mod, tmp_path, monkeypatch):
    import builtin_baseline_plan as plan

    judge = Judge(tmp_path)
    first, order = drive(finish_mod, tmp_path, judge, ["flat", "launchy", "searched", "degenerate"], monkeypatch)
    # the first phase mode by mode, the winners (not the degenerate task's) spread among them
    assert first == ["flat:compile-default", "flat:winner", "launchy:compile-default", "launchy:winner",
                     "degenerate:compile-default", "searched:winner"] + [
        f"{t}:{m}" for m in ("compile-max-autotune-no-cudagraphs", "cudagraph")
        for t in ("flat", "launchy", "searched", "degenerate")]
    # every baseline kept in the store once; not the mode the search judged, nor the graphed modes where
    # CUDA-graph replay did not pay
    first_phase = [(t, m) for m in ("compile-max-autotune-no-cudagraphs", "cudagraph")
                   for t in ("flat", "launchy", "searched", "degenerate")]
    graphed = [(t, m) for t in ("launchy", "searched", "degenerate")
               for m in ("compile-reduce-overhead", "compile-max-autotune")]
    defaults = [(t, "compile-default") for t in ("flat", "launchy", "degenerate")]
    assert sorted(judge.kept) == sorted(defaults + first_phase + graphed)
    skips = plan.load_skips(tmp_path)
    assert set(skips) == {"flat", "searched"} and skips["searched"] == {
        "compile-default": "the search's own verdict of this mode stands in"}
    assert set(skips["flat"]) == {"compile-reduce-overhead", "compile-max-autotune"}
    assert all("read 0.800x" in why for why in skips["flat"].values())
    # the graphed modes only after the task's first phase; its best mode re-timed after all its baselines
    assert order[-2:] == ["launchy:compile-max-autotune", "searched:compile-max-autotune-no-cudagraphs"]
    for task in ("launchy", "searched", "degenerate"):
        at = [k for k, x in enumerate(order[:-2]) if x.startswith(task + ":")]
        phase1 = [k for k in at if order[k].split(":")[1] in ("compile-default", "compile-max-autotune-no-cudagraphs",
                                                             "cudagraph")]
        phase2 = [k for k in at if order[k].split(":")[1] in ("compile-reduce-overhead", "compile-max-autotune")]
        assert max(phase1) < min(phase2)
    assert order.count("launchy:compile-max-autotune") == 2  # its baseline, then its re-timing (the best mode)
    assert order.count("flat:compile-default") == 2 and "degenerate:winner" not in order
    assert plan.load_done(tmp_path) == {"flat", "launchy", "searched", "degenerate"}
    confirmed = json.loads((tmp_path / "confirm.json").read_text())
    assert set(confirmed) == {"flat|best-flat", "launchy|best-launchy", "searched|best-searched",
                              "flat|mode:compile-default", "launchy|mode:compile-max-autotune",
                              "searched|mode:compile-max-autotune-no-cudagraphs"}
    assert confirmed["flat|best-flat"]["phase_s"] == {"timing": 0.5}  # what builtin_cost reads


def test_a_resumed_chunk_times_only_what_is_missing(finish_mod, tmp_path, monkeypatch):
    """The store holds one task's baselines and confirm.json its winner: it starts with its mode's
    re-timing alone; another task with its first phase stored starts at its second."""
    stored = {("done", m): (1.0, 0.9, 1.1) for m in MODES}
    stored.update({("half", "compile-max-autotune-no-cudagraphs"): (1.2, 1.1, 1.3),
                   ("half", "cudagraph"): (1.5, 1.4, 1.6), ("half", "compile-default"): (1.0, 0.9, 1.1)})
    (tmp_path / "confirm.json").write_text(json.dumps({"done|best-done": {"status": "ok"}}))
    judge = Judge(tmp_path, stored)
    first, order = drive(finish_mod, tmp_path, judge, ["done", "half"], monkeypatch)
    assert first == ["done:compile-default", "half:winner", "half:compile-reduce-overhead", "half:compile-max-autotune"]
    assert sorted(judge.kept) == [("half", "compile-max-autotune"), ("half", "compile-reduce-overhead")]
    assert order == first + ["half:compile-max-autotune-no-cudagraphs"]  # its best mode, once its baselines are in
    assert set(json.loads((tmp_path / "confirm.json").read_text())) == {
        "done|best-done", "done|mode:compile-default", "half|best-half", "half|mode:compile-max-autotune-no-cudagraphs"}


def test_without_re_timing_the_baselines_alone_join_by_their_phases(finish_mod, tmp_path, monkeypatch):
    judge = Judge(tmp_path)
    first, order = drive(finish_mod, tmp_path, judge, ["flat", "launchy"], monkeypatch, retime=False)
    assert first == ["flat:compile-default", "launchy:compile-default", "flat:compile-max-autotune-no-cudagraphs",
                     "launchy:compile-max-autotune-no-cudagraphs", "flat:cudagraph", "launchy:cudagraph"]
    assert order == first + ["launchy:compile-reduce-overhead", "launchy:compile-max-autotune"]
    assert not (tmp_path / "confirm.json").exists()


def test_the_benchmark_joins_the_stages_only_where_one_judge_can_time_both(finish_mod, capsys):
    import builtin_kernelbench as bk

    def args(**kw):
        base = {"finish": "joined", "confirm": True, "levers": "on", "workers_per_gpu": 4,
                "confirm_workers_per_gpu": 4}
        return SimpleNamespace(**{**base, **kw})

    assert bk.joins(args(), MODES) and capsys.readouterr().out == ""
    assert not bk.joins(args(finish="staged"), MODES)
    assert bk.joins(args(confirm=False, confirm_workers_per_gpu=1), MODES)  # the baselines alone: their phases
    assert not bk.joins(args(), []) and capsys.readouterr().out == ""  # nothing to join: said nowhere
    assert not bk.joins(args(confirm_workers_per_gpu=1), MODES)
    assert "one after the other: the re-timing has its own worker count" in capsys.readouterr().out
    assert not bk.joins(args(levers="off"), MODES)
    assert "the cost levers are off" in capsys.readouterr().out
