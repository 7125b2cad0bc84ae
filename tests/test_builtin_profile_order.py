"""benchmarks/builtin_profile_order.py: how many candidates each run judged until its best, read
from a run store (synthetic verdicts; the optimize runs themselves need a GPU to differ)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cudal1.profile.model import BoundClass, Profiles, ProfileStatus, ProgramProfile
from cudal1.store import RunStore
from cudal1.types import Candidate, EvalResult, Status, Task, reference_candidate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import builtin_profile_order as bench

SOURCE = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x + 1\n"


def test_reached_counts_rounds_and_the_candidates_judged_through_them():
    trace = [(1, 1.1), (1, None), (2, 1.5), (2, 1.49), (3, 1.52)]
    assert bench.reached(trace, 0.98 * 1.52) == (2, 4)  # 1.5 is within 2% of 1.52; round 2 judged 4 in all
    assert bench.reached(trace, 1.6) is None
    assert bench.reached([(1, 2.0)], 1.96) == (1, 1)


def _store(path: Path, verdicts: list, rounds: dict[str, int], finished: bool = True) -> None:
    task = Task("t", SOURCE)
    with RunStore(path / "cudal1.sqlite") as store:
        store.add_task(task)
        for cand, rnd in rounds.items():
            store.add_candidate(Candidate(cand, task_hash=task.hash, label=f"builtin:r{rnd}"), task.hash)
        for cand, status, speedup, profile in verdicts:
            cand_hash = reference_candidate(task).hash if cand == "anchor" else Candidate(cand).hash
            store.record_evaluation(EvalResult(status=status, task_name="t", task_hash=task.hash,
                                               candidate_hash=cand_hash, speedup=speedup, profile=profile))
    (path / "summary.json").write_text(json.dumps({"stopped_by": "rounds" if finished else "interrupted"}))


def test_a_run_store_reads_as_a_trace_of_rounds_and_the_reference_class(tmp_path):
    profiled = Profiles(reference=ProgramProfile(status=ProfileStatus.OK, device="cuda", bound=BoundClass.COMPUTE),
                        candidate=ProgramProfile(status=ProfileStatus.OK, device="cuda"))
    verdicts = [("anchor", Status.OK, 1.0, profiled), ("a", Status.OK, 1.2, None), ("b", Status.INCORRECT, None, None),
                ("c", Status.OK, 1.6, None), ("c", Status.OK, 1.6, profiled)]  # the best re-judged: counted once
    _store(tmp_path, verdicts, {"a": 1, "b": 1, "c": 2})
    rows = bench.read_run(tmp_path)
    assert rows == {"t": {"best": 1.6, "judged": 3, "trace": [(1, 1.2), (1, None), (2, 1.6)], "finished": True,
                          "class": "compute-bound", "contended": 0}}
    other = {"best": 1.22, "judged": 2, "trace": [(1, 1.22), (1, 1.0)], "finished": True, "class": "compute-bound",
             "contended": 0}
    report = bench.compare(rows, {"t": other})
    assert report["n"] == 1
    assert report["tasks"]["t"]["fixed"]["best_at"] == (2, 3) and report["tasks"]["t"]["fixed"]["same_at"] == (1, 2)
    assert report["same_rounds"] == {"fixed": 1, "profile": 1} and report["better_best"]["fixed"] == ["t"]
    assert "to the same best 1 vs 1 rounds (2 vs 2 candidates); a best over 2% higher: fixed 1, profile 0" in \
        bench.table(report)


def test_an_unfinished_or_contended_task_is_left_out_of_the_totals(tmp_path):
    _store(tmp_path, [("anchor", Status.OK, 1.0, None), ("a", Status.OK, 1.3, None)], {"a": 1}, finished=False)
    cut = bench.read_run(tmp_path)["t"]
    assert not cut["finished"]
    row = {"best": 1.5, "judged": 6, "trace": [(1, 1.5)], "finished": True, "class": "memory-bound", "contended": 0}
    report = bench.compare({"a": row, "b": {**row, "contended": 7}, "t": cut}, {"a": row, "b": row, "t": row})
    assert "best_at" not in row  # the inputs are read, not written
    assert report["n"] == 1 and report["contended"] == ["b"] and report["unfinished"] == ["t"]
    assert report["judged"] == {"fixed": 6, "profile": 6}
    text = bench.table(report)
    assert "left out, timed while the GPU or host was shared" in text and "not finished in both orders: t" in text
    assert "1.300x     1*" in text  # the cut run is marked
