"""The parent's NVML watch of a job (unit tier, with a stand-in NVML): the job's memory is
measured from its start, the sharing check only from its timing."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

from cudal1.harness.parent import gpu_share
from cudal1.harness.parent.gpu_share import GpuWatch
from cudal1.harness.proctree import CandidateTree

MIB = 2**20


class FakeNvml:
    """Lists the processes it is given, with their memory in bytes."""

    def __init__(self) -> None:
        self.procs: list[SimpleNamespace] = []

    def show(self, **mib_by_pid: int) -> None:
        self.procs = [SimpleNamespace(pid=int(pid[1:]), usedGpuMemory=mib * MIB) for pid, mib in mib_by_pid.items()]

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return self.procs


def test_the_jobs_memory_is_its_two_processes_at_their_largest_and_sharing_waits_for_the_timing(monkeypatch):
    nvml = FakeNvml()
    monkeypatch.setattr(gpu_share, "_nvml", nvml)
    worker, candidate, stranger = os.getpid() + 10**6, os.getpid() + 2 * 10**6, 1  # pid 1: outside this judge
    watch = GpuWatch(0, worker, CandidateTree(candidate))
    watch._handle = None  # begin() would open NVML; the samples are driven by hand here

    nvml.show(**{f"p{worker}": 3000, f"p{candidate}": 1000, f"p{stranger}": 9000})
    watch.sample()  # before the timing: memory only
    nvml.show(**{f"p{worker}": 2000, f"p{candidate}": 500})
    watch.sample()
    assert watch.sharing.job_mib == 4000  # the two processes together, at their largest; the stranger not counted
    assert watch.sharing.samples == 0 and not watch.sharing.others  # nobody is judged a neighbour yet

    watch._timing = True  # what start() sets at the timing
    nvml.show(**{f"p{worker}": 2000, f"p{candidate}": 500, f"p{stranger}": 9000})
    watch.sample()
    assert watch.sharing.samples == 1
    assert [o["pid"] for o in watch.sharing.others] == [stranger]
    assert watch.sharing.job_mib == 4000


def test_device_memory_is_zero_without_nvml(monkeypatch):
    monkeypatch.setattr(gpu_share, "_init", lambda: None)
    assert gpu_share.device_memory_mib(0) == 0


def test_the_watch_thread_samples_memory_from_begin_and_sharing_from_start(monkeypatch):
    nvml = FakeNvml()
    nvml.nvmlDeviceGetHandleByIndex = lambda index: index
    monkeypatch.setattr(gpu_share, "_init", lambda: nvml)
    monkeypatch.setattr(gpu_share, "_nvml", nvml)
    worker, candidate = os.getpid() + 10**6, os.getpid() + 2 * 10**6
    nvml.show(**{f"p{worker}": 700, f"p{candidate}": 300})
    watch = GpuWatch(0, worker, CandidateTree(candidate))
    watch.begin()
    deadline = time.monotonic() + 5
    while not watch.sharing.job_mib and time.monotonic() < deadline:
        time.sleep(0.01)
    assert watch.sharing.job_mib == 1000 and watch.sharing.samples == 0
    watch.start()  # the timing: sharing samples at once, every period_s
    while not watch.sharing.samples and time.monotonic() < deadline:
        time.sleep(0.005)
    sharing = watch.stop()
    assert sharing.samples >= 1 and sharing.checked and not sharing.others and sharing.job_mib == 1000
