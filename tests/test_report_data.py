"""How the report reads a run store: the synthetic store of ``report_data`` read back."""

from __future__ import annotations

from cudal1.report.load import load_runs
from cudal1.store import RunStore
from cudal1.types import Candidate, Status
from report_data import ENV, _verdict, make_run


def test_synthetic_run_reads_back(tmp_path):
    data = load_runs([make_run(tmp_path / "run")])
    assert [r.task.task_id for r in data.tasks] == ["level1/1", "level1/2", "level2/1", "level2/2", "mytask"]
    first = data.tasks[0]
    assert first.reference is not None and first.reference.speedup == 1.0  # the anchor is kept apart
    assert len(first.candidates) == 3 and [c.round for c in first.candidates] == [1, 2, 2]
    assert set(first.baselines) == {"eager", "compile"}
    assert first.candidates[0].analysis.startswith("We fuse")
    assert data.environments[0]["gpu_name"] == "NVIDIA H200"
    assert data.runs[0]["kind"] == "optimize"


def test_reader_never_writes(tmp_path):
    run = make_run(tmp_path / "run")
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir()}
    load_runs([run])
    assert {p.name: p.stat().st_mtime_ns for p in run.iterdir() if p.name in before} == before


def test_read_only_copy_is_read_as_immutable_snapshot(tmp_path, monkeypatch):
    """A WAL store in a folder it cannot write (fetched results) fails a plain read-only open
    (no -shm can be created); the reader falls back to an immutable snapshot."""
    import sqlite3

    from cudal1.report import load

    run = make_run(tmp_path / "run")
    real, tried = load._open, []

    def plain_open_fails(path, immutable):
        tried.append(immutable)
        if not immutable:
            raise sqlite3.OperationalError("attempt to write a readonly database")
        return real(path, immutable)

    monkeypatch.setattr(load, "_open", plain_open_fails)
    assert len(load_runs([run]).tasks) == 5 and tried == [False, True]


def test_baselines_only_store_merges_in_either_order(tmp_path):
    """``cudal1 baseline --out DIR`` writes baselines without task rows; given beside the run
    (before or after it) its measurements join the run's tasks."""
    run = make_run(tmp_path / "run")
    task = load_runs([run]).tasks[0].task
    base = tmp_path / "baselines"
    with RunStore(base / "cudal1.sqlite") as store:
        store.record_baseline(task.hash, "compile-max-autotune", ENV.key(), "cfg1",
                              _verdict(task, Candidate(task.source), Status.OK, 1.25))
    for order in ([base, run], [run, base]):
        first = load_runs(order).tasks[0]
        assert first.baselines["compile-max-autotune"].speedup == 1.25 and "compile" in first.baselines
    import pytest

    from cudal1.report.load import ReportError

    with pytest.raises(ReportError, match="holds no judged candidate"):
        load_runs([base])
