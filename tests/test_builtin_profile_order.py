"""benchmarks/builtin_profile_order.py: how many candidates each run judged until its best, read
from a run store (synthetic verdicts; the optimize runs themselves need a GPU to differ)."""

from __future__ import annotations

import sys
from pathlib import Path

from cudal1.profile.model import BoundClass, Profiles, ProfileStatus, ProgramProfile
from cudal1.store import RunStore
from cudal1.types import EvalResult, Status, Task, reference_candidate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import builtin_profile_order as bench

SOURCE = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x + 1\n"


def test_to_best_counts_until_the_first_candidate_within_two_percent_of_the_best():
    assert bench.to_best([1.1, None, 1.5, 1.49, 1.52]) == (1.52, 3)  # 1.5 is within 2% of 1.52
    assert bench.to_best([None, None]) == (None, 0)
    assert bench.to_best([2.0]) == (2.0, 1)


def test_a_run_store_reads_as_best_judged_to_best_and_the_reference_class(tmp_path):
    task = Task("t", SOURCE)
    anchor = reference_candidate(task)
    profiled = Profiles(reference=ProgramProfile(status=ProfileStatus.OK, device="cuda", bound=BoundClass.COMPUTE),
                        candidate=ProgramProfile(status=ProfileStatus.OK, device="cuda"))
    verdicts = [(anchor.hash, Status.OK, 1.0, profiled), ("a" * 64, Status.OK, 1.2, None),
                ("b" * 64, Status.INCORRECT, None, None), ("c" * 64, Status.OK, 1.6, None),
                ("c" * 64, Status.OK, 1.6, profiled)]  # the best, judged again with its profile: counted once
    with RunStore(tmp_path / "cudal1.sqlite") as store:
        store.add_task(task)
        for cand, status, speedup, profile in verdicts:
            store.record_evaluation(EvalResult(status=status, task_name="t", task_hash=task.hash, candidate_hash=cand,
                                               speedup=speedup, profile=profile))
    rows = bench.read_run(tmp_path)
    assert rows == {"t": {"best": 1.6, "judged": 3, "to_best": 3, "class": "compute-bound", "contended": 0}}
    report = bench.compare(rows, {"t": {"best": 1.6, "judged": 2, "to_best": 1, "class": "compute-bound",
                                        "contended": 0}})
    assert report["n"] == 1 and report["to_best"] == {"fixed": 3, "profile": 1}
    assert "judged until the best 3 vs 1" in bench.table(report)


def test_a_task_timed_while_the_gpu_was_shared_is_left_out_of_the_totals():
    row = {"best": 1.5, "judged": 6, "to_best": 1, "class": "memory-bound", "contended": 0}
    report = bench.compare({"a": row, "b": {**row, "contended": 7}}, {"a": row, "b": row})
    assert report["n"] == 1 and report["contended"] == ["b"] and report["judged"] == {"fixed": 6, "profile": 6}
    assert "left out, timed while the GPU or host was shared" in bench.table(report)
