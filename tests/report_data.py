"""A synthetic run store for the report tests (no judging; a helper module, not a test file).

``make_run(dir)`` writes a store whose figures are computed by hand in the tests:

| task | candidates (speedup) | best |
|---|---|---|
| level1/1 | ok 2.0 (round 2), ok 0.8 (round 1), compile_error | 2.0 |
| level1/2 | incorrect, timeout | none |
| level2/1 | ok 1.005, rejected (side_stream) | 1.005 |
| level2/2 | ok 50.0, flagged degenerate_task | degenerate, apart |
| mytask (no level) | ok 1.5 | 1.5 |

Baselines: ``compile`` on level1/1 (1.6x over eager) and level2/1 (0.9x).

As in a real run, each verdict's environment names its own job directory in ``isolation`` (one
environment all the same), and ``mytask``'s candidate comes from the builtin policy, whose
recorded text is its list of passes (it mentions fusion), not a model's analysis.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from cudal1.search import reference_candidate
from cudal1.store import RunStore
from cudal1.types import Candidate, Correctness, Environment, EvalResult, Status, Task, Timing

ENV = Environment(device="cuda", gpu_name="NVIDIA H200", torch="2.11.0", cuda="13.0", driver="580.1", cudal1="0.1.0")

REF = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.diag(A) @ B


def get_inputs():
    return [torch.randn(64), torch.randn(64, 64)]


def get_init_inputs():
    return []
'''

FAST = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return A.unsqueeze(1) * B
'''

COMPILED = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = torch.compile(self._forward)

    def _forward(self, A, B):
        return torch.diag(A) @ B

    def forward(self, A, B):
        return self.f(A, B)
'''


def task_source(i: int) -> str:
    return REF.replace("torch.randn(64)", f"torch.randn({64 + i})").replace(
        "torch.randn(64, 64)", f"torch.randn({64 + i}, 64)"
    )


def _verdict(
    task: Task, cand: Candidate, status: Status, speedup: float | None = None, flags=(), message=""
) -> EvalResult:
    ref_ms = 2.0
    return EvalResult(
        status=status, task_name=task.name, task_hash=task.hash, candidate_hash=cand.hash, message=message,
        flags=list(flags),
        correctness=Correctness(trials=5, passed=5 if status is Status.OK else 0),
        reference=Timing.from_samples([ref_ms] * 5, "cuda_event"),
        candidate=Timing.from_samples([ref_ms / speedup] * 5, "cuda_event") if speedup else None,
        speedup=speedup,
        speedup_ci=(speedup * 0.95, speedup * 1.05) if speedup else None,
        environment=dataclasses.replace(
            ENV,
            isolation={
                "home_tmp": f"applied: HOME=/cache/work/job_{cand.hash[:8]}/home (new, empty, 0700)",
                "netns": "applied: own network namespace, no interface up",
            },
        ),
        config_hash="cfg1",
        phase="done",
    )


SPEC = [  # (task name, level, problem id, [(status, speedup, flags, round, code)])
    (
        "1_Diag",
        1,
        1,
        [(Status.OK, 0.8, [], 1, COMPILED), (Status.OK, 2.0, [], 2, FAST), (Status.COMPILE_ERROR, None, [], 2, "x =")],
    ),
    ("2_Fail", 1, 2, [(Status.INCORRECT, None, ["value_mismatch"], 1, FAST), (Status.TIMEOUT, None, [], 1, COMPILED)]),
    ("1_Edge", 2, 1, [(Status.OK, 1.005, [], 1, FAST), (Status.REJECTED, None, ["side_stream"], 1, COMPILED)]),
    ("2_Degenerate", 2, 2, [(Status.OK, 50.0, ["degenerate_task"], 1, FAST)]),
    ("mytask", None, None, [(Status.OK, 1.5, [], 1, FAST)]),
]
BASELINES = {("1_Diag", "compile"): 1.6, ("1_Edge", "compile"): 0.9}
BUILTIN_TASKS = {"mytask"}  # proposed by the builtin policy
ANALYSIS = "We fuse the ops and use an algebraic identity."
BUILTIN_HEADER = ("# cudal1-builtin pass: algebraic — torch.fx algebraic rewrites (diag broadcast, matrix-chain order, "
                  "linear folding, reductions through linear maps, fused attention, BatchNorm folding in eval mode)\n")
BUILTIN_ACCOUNT = ("Builtin passes, applied in order:\n- `algebraic`: torch.fx algebraic rewrites (diag broadcast, "
                   "fused attention)\nThe same function as the reference.")


def make_run(out: Path, spec: list = SPEC) -> Path:
    """Write the synthetic run under ``out`` (a run directory) and return it; ``spec`` picks the
    tasks (rows of :data:`SPEC`)."""
    out.mkdir(parents=True, exist_ok=True)
    with RunStore(out / "cudal1.sqlite") as store:
        run_id = store.start_run("optimize", {"judge": {"device": "cuda"}})
        for i, (name, level, pid, cands) in enumerate(spec):
            task = Task(name=name, source=task_source(i), level=level, problem_id=pid)
            store.add_task(task)
            anchor = reference_candidate(task)
            store.add_candidate(anchor, task.hash, {"round": 0})
            store.record_evaluation(_verdict(task, anchor, Status.OK, 1.0))
            for j, (status, speedup, flags, round_, code) in enumerate(cands):
                policy = "builtin" if name in BUILTIN_TASKS else "test"
                header = BUILTIN_HEADER if policy == "builtin" else ""
                cand = Candidate(f"{header}{code}\n# {name} {j}\n", task_hash=task.hash, label=f"{policy}:r{round_}")
                store.add_candidate(cand, task.hash, {"round": round_, "policy": policy})
                store.record_evaluation(
                    _verdict(
                        task, cand, status, speedup, flags,
                        "candidate work escaped the calling stream" if status is Status.REJECTED else "",
                    )
                )
                store.record_response(task.hash, round_, policy, {}, "text",
                                      BUILTIN_ACCOUNT if policy == "builtin" else ANALYSIS, cand.hash)
            for mode in ("eager", "compile"):
                s = 1.0 if mode == "eager" else BASELINES.get((name, mode))
                if s is not None:
                    store.record_baseline(task.hash, mode, ENV.key(), "cfg1",
                                          _verdict(task, Candidate(task.source), Status.OK, s))
        store.finish_run(run_id, "done")
    return out


def add_evaluation(run: Path) -> dict:
    """Write ``evaluation.json`` into ``run`` as ``cudal1 evaluate`` does (its figures function
    over four samples of two tasks) and return it."""
    import json

    from cudal1.train.evaluation.figures import Sample, figures

    ok = lambda s: Sample("ok", "done", s, (s * 0.9, s * 1.1))  # noqa: E731
    samples = {
        "level1/1": [ok(2.0), Sample("incorrect", "correctness"), Sample("format"), ok(1.5)],
        "mytask": [Sample("compile_error", "import"), Sample("format"), ok(1.2), Sample("runtime_error", "timing")],
    }
    doc = figures(samples, 4) | {"out": str(run), "requests": 8, "failed_requests": 0}
    (run / "evaluation.json").write_text(json.dumps(doc))
    return doc
