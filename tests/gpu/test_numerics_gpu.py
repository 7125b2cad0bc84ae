"""The exact-answer rule on the GPU: the numerics corpus (``tests/fixtures/numerics``) judged on
CUDA, where the float64 reference runs on the device, plus a TF32 matmul switched on inside
``forward`` (a precision downgrade the error and the flags must both show).  The corpus goes
through ``tests/conftest.py``'s runner."""

from __future__ import annotations

from pathlib import Path

import pytest

from cudal1.config import EvalConfig

REPO = Path(__file__).resolve().parents[2]
CORPUS = sorted(p for p in (REPO / "tests" / "fixtures" / "numerics").glob("*.py") if not p.name.startswith("task_"))
CORPUS_TASK = REPO / "examples" / "tasks" / "matmul_chain.py"

TF32_INSIDE = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, A, B, X):
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            return A @ (B @ X)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False
'''


@pytest.fixture(scope="module")
def corpus_config(tmp_path_factory):
    return EvalConfig(device="cuda", cache_dir=str(tmp_path_factory.mktemp("cache")), timing_budget_s=0.5)


@pytest.mark.gpu
def test_numerics_corpus_on_cuda(corpus, corpus_results, corpus_name, check_verdict):
    r = corpus_results[corpus_name]
    assert check_verdict(corpus[corpus_name], r) == ""
    if r.status.value == "ok":
        assert r.correctness.rule == "exact" and r.correctness.cand_err <= r.correctness.bound


@pytest.mark.gpu
def test_tf32_inside_forward_is_caught(corpus_config):
    from cudal1.harness import evaluate
    from cudal1.tasks import load_task_file
    from cudal1.types import Candidate

    task = load_task_file(CORPUS_TASK)
    (r,) = evaluate(task, [Candidate(TF32_INSIDE, task_hash=task.hash, label="tf32_inside")], corpus_config)
    assert r.status.value in ("rejected", "incorrect"), f"{r.status.value} {r.flags} {r.message[:300]}"
    assert {"precision_downgrade", "value_mismatch"} & set(r.flags)
