"""Several judge workers sharing one GPU (``EvalConfig.workers_per_gpu``): every verdict ``ok``
and no job timed while another worker ran a GPU phase (the GPU lease; see ``Worker.lease``).
The checks live in ``tests/conftest.py``'s ``shared_device_batch`` (the CPU twin is in
``tests/test_batch.py``)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("order", ["any", "choices-first"])
def test_workers_sharing_a_gpu_never_time_alongside_gpu_work(shared_device_batch, order):
    results, stats = shared_device_batch("cuda", 2, lease_order=order)
    assert len(stats.lanes) == 2
    assert all(r.speedup and r.speedup > 0 for r in results)


# Each model holds about a third of the GPU's memory: one worker (reference + candidate) fits,
# two side by side do not.
BALLAST_TASK = '''
import torch

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ballast = torch.empty({gib} * 2**30, dtype=torch.uint8, device="cuda")

    def forward(self, x):
        return x * 2.0

def get_inputs():
    return [torch.randn(4096)]

def get_init_inputs():
    return []
'''


def test_a_job_out_of_memory_beside_its_neighbour_is_judged_again_alone(tmp_path):
    """Two workers share the GPU and each job needs more than half its memory: whichever runs out
    is judged again with the GPU to itself, so both verdicts are ``ok`` (an OOM caused by a
    neighbour is never the candidate's verdict)."""
    import torch

    from cudal1.config import EvalConfig
    from cudal1.harness.parent.api import DevicePlan, Job, run_jobs
    from cudal1.types import Candidate, Status, Task

    total_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    gib = int(total_gib * 0.36)  # per model; a worker holds two models (0.72), two workers 1.44
    if gib < 8:
        pytest.skip("a GPU this small makes the ballast too small to matter")
    src = BALLAST_TASK.format(gib=gib)
    task = Task(name="ballast", source=src)
    cand = src.replace("class Model(", "class ModelNew(")
    jobs = [Job(task, Candidate(cand + f"\n# variant {i}\n", task_hash=task.hash, label=f"v{i}")) for i in range(2)]
    cfg = EvalConfig(device="cuda", cache_dir=str(tmp_path / "cache"), tolerance="strict", correctness_trials=2,
                     timing_trials=10, min_timing_trials=5, timing_budget_s=0.3, workers_per_gpu=2)
    plan = DevicePlan.detect("cuda")
    plan = DevicePlan(plan.device, plan.lanes[:1], plan.arch_list, plan.driver)
    results = run_jobs(jobs, cfg, plan=plan)
    assert [r.status for r in results] == [Status.OK] * 2, [(r.status, r.flags, r.message[:200]) for r in results]
    assert any("rejudged_alone" in r.flags for r in results), "the two workers never ran out of memory together"
    # the parent measured each job's memory (its two processes: a model each, 0.72 of the GPU)
    total_mib = total_gib * 1024
    held = [r.figures.get("gpu_memory_mib", 0) / total_mib for r in results]
    assert all(0.6 < h < 1.0 for h in held), held
    # so the task's next jobs enter with that share: one waits for the other, none runs out of memory
    later = run_jobs([Job(task, Candidate(cand + f"\n# later {i}\n", task_hash=task.hash, label=f"w{i}"))
                      for i in range(2)], cfg, plan=plan)
    assert [(r.status, "rejudged_alone" in r.flags) for r in later] == [(Status.OK, False)] * 2, [
        (r.status, r.flags) for r in later]
