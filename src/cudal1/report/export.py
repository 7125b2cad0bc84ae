"""Export a run's best kernels in CUDA-L1's release format (one JSON object per line).

Contract: one record per task of the run, in task order, with

* ``level_id``, ``task_id``: KernelBench's level and problem id; for a user's own task ``level_id``
  is null, ``task_id`` is the task's id (file stem) and ``task_name`` repeats it, so
  ``cudal1 verify`` can re-judge the file for any task;
* ``ref_code``: the reference source exactly as judged; ``custom_code``: the best verified
  candidate, or null when none was verified or the task is degenerate (as in CUDA-L1's release);
* ``score_default``: the best candidate's measured speedup over eager; ``score_<baseline>`` for
  each baseline measured in the run: that speedup divided by the baseline's own speedup over
  eager (``score_torch_compile_default``, ``score_torch_compile_reduce_overhead``,
  ``score_torch_compile_max_autotune``, ``score_torch_compile_max_autotune_no_cudagraphs``,
  ``score_cuda_graph``).  A builtin run's verified
  ``compile-default`` candidate stands for ``score_torch_compile_default`` when that baseline
  was not measured.  No ``score_*`` is written without a measured value.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cudal1.report.document import COMPILE_CANDIDATE, baseline_speedups, best_candidate, degenerate
from cudal1.report.load import RunData

SCORE_NAMES = {
    "compile-default": "torch_compile_default",
    "compile-reduce-overhead": "torch_compile_reduce_overhead",
    "compile-max-autotune": "torch_compile_max_autotune",
    "compile-max-autotune-no-cudagraphs": "torch_compile_max_autotune_no_cudagraphs",
    "cudagraph": "cuda_graph",
}
FORMATS = ("cuda-l1",)


def cuda_l1_records(data: RunData) -> list[dict[str, Any]]:
    out = []
    for rec in data.tasks:
        task = rec.task
        best = best_candidate(rec)
        row: dict[str, Any] = {
            "level_id": task.level if task.problem_id is not None else None,
            "task_id": task.problem_id if task.level is not None and task.problem_id is not None else task.task_id,
            "task_name": task.name,
            "ref_code": task.source,
            "custom_code": best.source if best and not degenerate(rec) else None,
        }
        if best is not None:
            row["score_default"] = best.result.speedup
            bases = baseline_speedups(rec)
            if COMPILE_CANDIDATE in bases and "compile-default" not in bases:
                bases["compile-default"] = bases[COMPILE_CANDIDATE]
            for mode, name in SCORE_NAMES.items():
                if mode in bases:
                    row[f"score_{name}"] = best.result.speedup / bases[mode]
        out.append(row)
    return out


def export(data: RunData, path: str | Path, fmt: str = "cuda-l1") -> int:
    """Write ``data``'s best kernels to ``path`` in ``fmt``; returns the records written."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; known: {', '.join(FORMATS)}")
    records = cuda_l1_records(data)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    tmp.replace(path)
    return len(records)
