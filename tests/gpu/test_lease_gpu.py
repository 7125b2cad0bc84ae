"""Several judge workers sharing one GPU (``EvalConfig.workers_per_gpu``): every verdict ``ok``
and no job timed while another worker ran a GPU phase (the GPU lease; see ``Worker.lease``).
The checks live in ``tests/conftest.py``'s ``shared_device_batch`` (the CPU twin is in
``tests/test_scheduler.py``)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_workers_sharing_a_gpu_never_time_alongside_gpu_work(shared_device_batch):
    results, stats = shared_device_batch("cuda", 2)
    assert len(stats.lanes) == 2
    assert all(r.speedup and r.speedup > 0 for r in results)
