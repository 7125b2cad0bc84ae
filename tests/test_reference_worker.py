"""The reference worker: classification of runtime errors; the GPU lease's phases (harness.lease)."""

from __future__ import annotations

import pytest
import torch


def test_out_of_memory_is_flagged_also_when_the_reference_runs_out():
    """An OOM verdict carries ``oom`` wherever it happened (the reference's phases too): the
    scheduler judges such a job again alone when it shared its GPU."""
    from cudal1.harness.reference.worker import _oom_flag, classify_runtime

    assert (
        "oom" in classify_runtime(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.00 GiB"), "x").flags
    )
    assert _oom_flag(RuntimeError("CUDA error: out of memory")) == ["oom"]
    assert _oom_flag(ValueError("shape mismatch")) == []


def test_cuda_error_boilerplate_is_not_an_illegal_memory_access():
    from cudal1.harness.reference.worker import classify_runtime

    boilerplate = ("CUDA kernel errors might be asynchronously reported at some other API call.\n"
                   "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")
    os_error = RuntimeError("CUDA error: OS call failed or operation not supported on this OS\n" + boilerplate)
    assert "illegal_memory_access" not in classify_runtime(os_error, "correctness").flags
    fault = RuntimeError("CUDA error: an illegal memory access was encountered\n" + boilerplate)
    assert "illegal_memory_access" in classify_runtime(fault, "correctness").flags
    assert (
        "illegal_memory_access" in classify_runtime(RuntimeError("CUDA error: device-side assert triggered"), "x").flags
    )


def test_invalid_address_space_is_an_illegal_memory_access():
    """On the H200 with CUDA 13 an out-of-bounds store surfaced as cudaErrorInvalidAddressSpace."""
    from cudal1.harness.faults import is_cuda_fault
    from cudal1.harness.reference.worker import classify_runtime

    text = (
        "CUDA error: operation not supported on global/shared address space\nSearch for `cudaErrorInvalidAddressSpace'"
    )
    assert "illegal_memory_access" in classify_runtime(RuntimeError(text), "correctness").flags
    assert is_cuda_fault("torch.AcceleratorError: CUDA error: an illegal memory access was encountered")
    assert not is_cuda_fault(
        "CUDA error: out of memory. Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."
    )


class _LeaseProbe:
    """A reference worker's lease and phases on a real lock file, with phases recorded.
    ``probe(name)`` runs when a phase is announced (before the worker goes on), so a test can look
    at the lock at exactly that moment.  ``building(on)`` is what the worker does when the
    candidate's process reports an extension build outside its import."""

    def __init__(self, path, probe, device: str = "cpu", compile_off_lease: bool = False,
                 first_call_lease: str = "exclusive"):
        from types import SimpleNamespace

        from cudal1.harness.lease import Lease
        from cudal1.harness.reference.worker import RefWorker

        self.worker = RefWorker.__new__(RefWorker)
        self.worker.current_phase = ""
        self.worker.resume_phase = ""
        self.worker.resume_lease = "none"
        self.worker.compile_resume = ""
        self.worker.compile_lease = "none"
        self.worker.compile_released = False
        self.worker.autotune_lease = ""
        self.worker.compile_step_lease = "none"
        self.worker.in_first_call = False
        self.worker.exclusive_s, self.worker.exclusive_since, self.worker.timing_began = 0.0, None, False
        self.worker.cfg = SimpleNamespace(compile_off_lease=compile_off_lease, first_call_lease=first_call_lease)
        self.worker.spec = SimpleNamespace(device="cuda")  # the lock is real; the GPU is not needed
        self.acks = 0
        self.worker.link = SimpleNamespace(ack=self._ack)
        self.worker.device = torch.device(device)
        self.phases: list[str] = []

        def phase(name: str) -> None:
            self.worker.current_phase = name
            self.phases.append(name)
            probe(name)

        self.worker.phase = phase
        sync = (lambda: torch.cuda.synchronize()) if device == "cuda" else (lambda: None)
        self.worker.lease = Lease(str(path), phase, sync, lambda: None)

    @property
    def held(self) -> str:
        return self.worker.lease.held

    def building(self, on: bool) -> None:
        self.worker.on_event("building", {"on": on})

    def compiling(self, on: bool, off_lease: bool = False) -> None:
        self.worker.on_event("compiling", {"on": on, "off_lease": off_lease})

    def compile_gpu(self, on: bool) -> None:
        self.worker.on_event("compile_gpu", {"on": on})

    def compile_cpu_step(self, on: bool) -> None:
        self.worker.on_event("compile_cpu_step", {"on": on})

    def autotune(self, on: bool) -> None:
        self.worker.on_event("autotune", {"on": on})

    def _ack(self) -> None:
        self.acks += 1


def _try_lock(path, op) -> bool:
    """Whether a fresh open file description can take ``op`` on ``path`` now (released at once)."""
    import fcntl
    import os

    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, op | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_a_lease_upgrade_ends_the_phase_before_its_shared_lock_can_go(tmp_path):
    """flock drops a held lock when converting it, even when a non-blocking attempt then fails.
    The worker must announce ``lane`` while it still holds its shared lease; otherwise another
    worker, granted the exclusive lease in that gap, stamps ``timing`` before this worker's GPU
    phase ended (the overlap the H200 lease test once saw)."""
    import fcntl
    import os

    path = tmp_path / "gpu0.lock"
    other = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # a second worker, in a GPU phase
    fcntl.flock(other, fcntl.LOCK_SH)
    still_held: list[bool] = []

    def probe(name: str) -> None:
        if name == "lane":  # the other worker finishes: is this worker's shared lock still there?
            fcntl.flock(other, fcntl.LOCK_UN)
            still_held.append(not _try_lock(path, fcntl.LOCK_EX))

    w = _LeaseProbe(path, probe)
    w.worker.enter("correctness", "shared")
    assert w.phases == ["correctness"] and w.held == "shared"
    w.worker.enter("timing", "exclusive")
    assert w.phases == ["correctness", "lane", "timing"]
    assert still_held == [True]
    assert not _try_lock(path, fcntl.LOCK_SH)  # exclusive now
    os.close(other)


def test_a_phase_resumed_after_a_build_starts_only_once_its_lease_is_back(tmp_path):
    import fcntl
    import os
    import threading

    path = tmp_path / "gpu0.lock"
    other = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    released = threading.Event()  # the other worker's timing is over
    seen: dict[str, bool] = {}

    def probe(name: str) -> None:
        seen[name] = released.is_set() and not _try_lock(path, fcntl.LOCK_SH)  # ... and this one holds it

    def release() -> None:
        released.set()
        fcntl.flock(other, fcntl.LOCK_UN)

    w = _LeaseProbe(path, probe)
    w.worker.enter("timing", "exclusive")
    w.building(True)  # a build in the middle of timing gives the GPU back
    assert w.held == "none" and w.phases[-1] == "build"
    fcntl.flock(other, fcntl.LOCK_EX)  # another worker times meanwhile
    threading.Timer(0.2, release).start()
    w.building(False)
    assert w.phases == ["timing", "build", "lane", "timing"]
    assert seen["timing"] and w.held == "exclusive"
    os.close(other)


def test_a_lease_given_back_is_given_back_only_after_the_next_phase_is_stamped(tmp_path):
    """A GPU phase ends when the next phase is stamped.  Were the lease dropped first, another
    worker could take it exclusively and stamp ``timing`` before this worker's ``reference`` ended
    (the overlap CI saw in the shared-device test): so ``import`` is announced with the lease held."""
    import fcntl

    path = tmp_path / "gpu0.lock"
    held_at: dict[str, bool] = {}

    def probe(name: str) -> None:
        held_at[name] = not _try_lock(path, fcntl.LOCK_EX)

    w = _LeaseProbe(path, probe)
    w.worker.enter("reference", "shared")
    w.worker.enter("import", "none")
    assert w.phases == ["reference", "import"] and w.held == "none"
    assert held_at == {"reference": True, "import": True}
    assert _try_lock(path, fcntl.LOCK_EX)  # and it is gone afterwards
    w.worker.enter("timing", "exclusive")
    w.building(True)  # the same for a build that gives the GPU back mid-phase
    assert w.phases[-1] == "build" and held_at["build"] and _try_lock(path, fcntl.LOCK_EX)


def test_torch_compile_compiling_is_its_own_phase_under_the_phases_lease(tmp_path):
    """torch.compile compiling inside ``construct`` or ``correctness`` is phase ``compile``
    (the build deadline), with the interrupted phase's lease held throughout (a compile-mode
    baseline's autotuning times kernels on a GPU nothing else of the judge uses), and the phase
    resumes afterwards; a build inside it comes back to it; in ``timing`` a recompile stays the
    call's own time."""
    import fcntl

    from cudal1.harness.spec import PhaseLimits

    path = tmp_path / "gpu0.lock"
    w = _LeaseProbe(path, lambda name: None)
    w.worker.enter("construct", "exclusive")
    w.compiling(True)
    assert w.phases[-1] == "compile" and w.held == "exclusive" and not _try_lock(path, fcntl.LOCK_SH)
    w.compiling(False)
    assert w.phases[-2:] == ["compile", "construct"] and w.held == "exclusive"
    w.worker.enter("correctness", "exclusive")
    w.compiling(True)
    w.building(True)  # an extension built while compiling gives the GPU back ...
    assert w.phases[-1] == "build" and w.held == "none"
    w.building(False)  # ... and the compile resumes with the lease
    assert w.phases[-1] == "compile" and w.held == "exclusive"
    w.compiling(False)
    assert w.phases[-1] == "correctness"
    w.worker.enter("timing", "exclusive")
    w.compiling(True)
    w.compiling(False)
    assert w.phases[-1] == "timing" and w.phases.count("compile") == 3
    limits = PhaseLimits(setup_s=1.0, build_s=900.0, call_s=120.0)
    assert limits.of_phase("compile") == 900.0 and limits.of_phase("correctness") == 120.0


def test_a_worker_drains_its_gpu_work_before_its_lease_changes(tmp_path, monkeypatch):
    """CUDA is asynchronous: kernels a phase queued could still run when the next holder starts
    timing.  The device is synchronized before the phase that gives the lease back (or upgrades
    it) is stamped; taking a lease from none needs no drain."""
    events: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: events.append("sync"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda *a, **k: None)
    w = _LeaseProbe(tmp_path / "gpu0.lock", events.append, device="cuda")
    w.worker.enter("reference", "shared")
    w.worker.enter("import", "none")
    w.worker.enter("construct", "shared")
    w.worker.enter("timing", "exclusive")
    w.building(True)
    assert events == ["reference", "sync", "import", "construct", "sync", "lane", "timing", "sync", "build"]


def test_a_slot_that_cuda_could_not_allocate_is_out_of_memory(monkeypatch):
    """The slots are allocated through the CUDA runtime directly (``cuda_api.malloc``): its error 2
    is an allocation failure like PyTorch's, so a job that hit it beside other workers is judged
    again alone (level1/23's inputs on an H200 shared by three workers, 2026-12-03)."""
    from cudal1.harness import cuda_api
    from cudal1.harness.faults import runtime_error_parts

    with pytest.raises(cuda_api.CudaCallError) as caught:
        cuda_api._check(2, "cudaMalloc")
    assert runtime_error_parts(caught.value, "correctness")[1] == ["oom"]
    with pytest.raises(cuda_api.CudaCallError) as other:
        cuda_api._check(700, "cudaMemcpy")
    assert "oom" not in runtime_error_parts(other.value, "timing")[1]


def test_compiling_off_the_lease_gives_it_back_and_inductors_gpu_steps_take_it_again(tmp_path):
    """With ``EvalConfig.compile_off_lease``, a compile that does not autotune is phase
    ``compile_cpu`` without the lease (another worker may time meanwhile); Inductor's GPU steps
    inside it take the interrupted phase's lease back as phase ``compile``; the compile's end
    restores the phase and its lease.  A compile that autotunes, or any compile without the
    setting, keeps the lease as before.  Every compiling event is answered (the candidate's
    process waits for it), also where nothing changes."""
    import fcntl

    from cudal1.harness.spec import PhaseLimits

    path = tmp_path / "gpu0.lock"
    w = _LeaseProbe(path, lambda name: None, compile_off_lease=True)
    w.worker.enter("construct", "exclusive")
    w.compiling(True, off_lease=True)
    assert w.phases[-1] == "compile_cpu" and w.held == "none" and _try_lock(path, fcntl.LOCK_EX)
    w.compile_gpu(True)
    assert w.phases[-1] == "compile" and w.held == "exclusive" and not _try_lock(path, fcntl.LOCK_SH)
    w.compile_gpu(False)
    assert w.phases[-1] == "compile_cpu" and w.held == "none"
    w.building(True)  # an extension built inside it, and back
    w.building(False)
    assert w.phases[-2:] == ["build", "compile_cpu"] and w.held == "none"
    w.compiling(False, off_lease=True)
    assert w.phases[-1] == "construct" and w.held == "exclusive" and not _try_lock(path, fcntl.LOCK_SH)
    assert w.acks == 4
    w.compiling(True, off_lease=False)  # autotuning: the lease stays, GPU steps change nothing
    w.compile_gpu(True)
    w.compile_gpu(False)
    assert w.phases[-1] == "compile" and w.held == "exclusive"
    w.compiling(False)
    w.worker.enter("timing", "exclusive")
    w.compiling(True, off_lease=True)  # a recompile while timed: the call's own time
    assert w.phases[-1] == "timing" and w.held == "exclusive" and w.acks == 9
    w.compiling(False, off_lease=True)
    held = _LeaseProbe(tmp_path / "gpu1.lock", lambda name: None)  # the setting off: as before
    held.worker.enter("correctness", "shared")
    held.compiling(True, off_lease=True)
    held.compile_gpu(True)
    assert held.phases[-1] == "compile" and held.held == "shared" and held.acks == 2
    limits = PhaseLimits(setup_s=1.0, build_s=900.0, call_s=120.0)
    assert limits.of_phase("compile_cpu") == 900.0


def test_an_autotuning_compile_gives_the_lease_back_only_while_it_waits_for_compiling_elsewhere(tmp_path):
    """A compile that keeps its lease (autotuning, phase ``compile``) runs its CPU steps (waiting
    for kernels compiled by other threads and processes) as ``compile_cpu`` without the lease,
    with ``EvalConfig.compile_off_lease``; each step's end takes the interrupted phase's lease back
    (exclusive for a baseline) before its timings run.  Without the setting, in a compile that
    already runs off the lease, or outside a compile, the event changes nothing; it is answered
    every time."""
    import fcntl

    path = tmp_path / "gpu0.lock"
    w = _LeaseProbe(path, lambda name: None, compile_off_lease=True)
    w.worker.enter("construct", "exclusive")
    w.compile_cpu_step(True)  # outside a compile
    assert w.phases[-1] == "construct" and w.held == "exclusive"
    w.compile_cpu_step(False)
    w.compiling(True, off_lease=False)
    assert w.phases[-1] == "compile" and w.held == "exclusive"
    w.compile_cpu_step(True)
    assert w.phases[-1] == "compile_cpu" and w.held == "none" and _try_lock(path, fcntl.LOCK_EX)
    w.compile_cpu_step(False)
    assert w.phases[-1] == "compile" and w.held == "exclusive" and not _try_lock(path, fcntl.LOCK_SH)
    w.compile_cpu_step(True)
    w.compiling(False)  # a compile that ends inside a step still resumes its phase and lease
    assert w.phases[-1] == "construct" and w.held == "exclusive"
    w.compiling(True, off_lease=True)  # off the lease already: the step changes nothing
    w.compile_cpu_step(True)
    assert w.phases[-1] == "compile_cpu" and w.held == "none"
    w.compile_cpu_step(False)
    assert w.phases[-1] == "compile_cpu" and w.held == "none"
    w.compiling(False, off_lease=True)
    assert w.acks == 11
    held = _LeaseProbe(tmp_path / "gpu1.lock", lambda name: None)  # the setting off
    held.worker.enter("correctness", "shared")
    held.compiling(True)
    held.compile_cpu_step(True)
    assert held.phases[-1] == "compile" and held.held == "shared" and held.acks == 2


def test_a_candidates_triton_autotuning_times_its_choices_under_the_exclusive_lease(tmp_path):
    """With ``EvalConfig.compile_off_lease``, a candidate's Triton autotuner timing a choice in
    ``correctness`` holds the lease exclusive (nothing else of the judge on the GPU), a compile
    inside it goes off the lease and comes back to exclusive, and the autotuning's end restores
    the phase's shared lease.  Without the setting, or in ``timing`` (already exclusive), nothing
    changes; every event is answered."""
    import fcntl

    path = tmp_path / "gpu0.lock"
    w = _LeaseProbe(path, lambda name: None, compile_off_lease=True)
    w.worker.enter("correctness", "shared")
    w.autotune(True)
    assert w.phases[-1] == "correctness" and w.held == "exclusive" and not _try_lock(path, fcntl.LOCK_SH)
    w.compiling(True, off_lease=True)  # the choice's first call compiles it
    assert w.phases[-1] == "compile_cpu" and w.held == "none" and _try_lock(path, fcntl.LOCK_EX)
    w.compiling(False, off_lease=True)
    assert w.phases[-1] == "correctness" and w.held == "exclusive"
    w.autotune(False)
    assert w.phases[-1] == "correctness" and w.held == "shared" and _try_lock(path, fcntl.LOCK_SH)
    w.worker.enter("timing", "exclusive")
    w.autotune(True)
    w.autotune(False)
    assert w.held == "exclusive" and w.acks == 6
    held = _LeaseProbe(tmp_path / "gpu1.lock", lambda name: None)  # the setting off
    held.worker.enter("correctness", "shared")
    held.autotune(True)
    assert held.held == "shared" and held.acks == 1


def test_the_candidates_first_call_holds_the_lease_exclusive_and_gives_back_the_phases_own(tmp_path):
    """With ``EvalConfig.compile_off_lease`` and ``first_call_lease: exclusive``, the candidate's
    first call in ``correctness`` (where cuDNN's benchmark mode and Inductor's run-time autotuning
    make their choices by timing) holds the lease exclusive and is not watched; a compile inside it
    goes off the lease and comes back to exclusive; the phase's shared lease returns when the call
    ends, however it ends.  Without the setting, or outside ``correctness``, the lease is left as
    it is."""
    import fcntl

    path = tmp_path / "gpu0.lock"
    w = _LeaseProbe(path, lambda name: None, compile_off_lease=True)
    w.worker.enter("correctness", "shared")
    with w.worker.first_call() as watch:
        assert not watch
        assert w.phases[-1] == "correctness" and w.held == "exclusive" and not _try_lock(path, fcntl.LOCK_SH)
        w.compiling(True, off_lease=True)
        assert w.phases[-1] == "compile_cpu" and w.held == "none" and _try_lock(path, fcntl.LOCK_EX)
        w.compile_gpu(True)
        assert w.phases[-1] == "compile" and w.held == "exclusive"
        w.compile_gpu(False)
        w.compiling(False, off_lease=True)
        assert w.phases[-1] == "correctness" and w.held == "exclusive"
        w.autotune(True)  # the candidate's own autotuner inside the call: its end keeps the call exclusive
        w.autotune(False)
        assert w.phases[-1] == "correctness" and w.held == "exclusive" and not _try_lock(path, fcntl.LOCK_SH)
    assert w.phases[-1] == "correctness" and w.held == "shared" and _try_lock(path, fcntl.LOCK_SH)
    with pytest.raises(RuntimeError, match="the call failed"):
        with w.worker.first_call():
            assert w.held == "exclusive"
            raise RuntimeError("the call failed")
    assert w.held == "shared" and not w.worker.in_first_call
    w.worker.enter("construct", "shared")
    assert not w.worker.watches_choosers()
    with w.worker.first_call() as watch:
        assert w.held == "shared" and not watch
    held = _LeaseProbe(tmp_path / "gpu1.lock", lambda name: None)  # the setting off
    held.worker.enter("correctness", "shared")
    with held.worker.first_call() as watch:
        assert held.held == "shared" and not watch


def test_under_choosers_the_first_call_goes_exclusive_only_where_a_choice_is_made_by_timing(tmp_path):
    """With ``first_call_lease: choosers`` (the default), the candidate's first call keeps the
    phase's shared lease and is watched for run-time choosers (so is ``construct``); the process's
    ``autotune`` bracket (a chooser on, an autotuner timing) holds it exclusive until it closes; a
    compile inside the call goes off the lease and its GPU steps, like an autotuning compile that
    keeps its lease, take it exclusive, then the call resumes shared.  A compile after the first
    call takes the phase's own lease for its steps.  Every event is answered."""
    import fcntl

    path = tmp_path / "gpu0.lock"
    w = _LeaseProbe(path, lambda name: None, compile_off_lease=True, first_call_lease="choosers")
    w.worker.enter("construct", "shared")
    assert w.worker.watches_choosers()
    w.worker.enter("correctness", "shared")
    with w.worker.first_call() as watch:
        assert watch and w.held == "shared" and _try_lock(path, fcntl.LOCK_SH)
        w.autotune(True)  # cuDNN's benchmark mode turned on inside the call
        assert w.phases[-1] == "correctness" and w.held == "exclusive" and not _try_lock(path, fcntl.LOCK_SH)
        w.autotune(False)
        assert w.phases[-1] == "correctness" and w.held == "shared"
        w.compiling(True, off_lease=True)
        assert w.phases[-1] == "compile_cpu" and w.held == "none" and _try_lock(path, fcntl.LOCK_EX)
        w.compile_gpu(True)  # matmul padding's benchmark, say
        assert w.phases[-1] == "compile" and w.held == "exclusive" and not _try_lock(path, fcntl.LOCK_SH)
        w.compile_gpu(False)
        assert w.phases[-1] == "compile_cpu" and w.held == "none"
        w.compiling(False, off_lease=True)
        assert w.phases[-1] == "correctness" and w.held == "shared"
        w.compiling(True, off_lease=False)  # an autotuning compile that keeps its lease: exclusive
        assert w.phases[-1] == "compile" and w.held == "exclusive"
        w.compile_cpu_step(True)
        assert w.phases[-1] == "compile_cpu" and w.held == "none"
        w.compile_cpu_step(False)
        assert w.phases[-1] == "compile" and w.held == "exclusive"
        w.compiling(False)
        assert w.phases[-1] == "correctness" and w.held == "shared" and _try_lock(path, fcntl.LOCK_SH)
    assert not w.worker.in_first_call and w.held == "shared"
    w.compiling(True, off_lease=True)  # a later call's compile: its steps take the phase's lease
    w.compile_gpu(True)
    assert w.phases[-1] == "compile" and w.held == "shared"
    w.compile_gpu(False)
    w.compiling(False, off_lease=True)
    assert w.phases[-1] == "correctness" and w.held == "shared" and w.acks == 14
    w.worker.enter("timing", "exclusive")
    assert not w.worker.watches_choosers()
    held = _LeaseProbe(tmp_path / "gpu1.lock", lambda name: None, first_call_lease="choosers")  # lease held
    held.worker.enter("correctness", "shared")
    assert not held.worker.watches_choosers()
    with held.worker.first_call() as watch:
        assert not watch and held.held == "shared"



def test_the_seconds_held_exclusive_before_timing_add_up_and_stop_at_timing(tmp_path):
    """``exclusive_s`` (the verdict's ``figures["exclusive_before_timing_s"]``) counts each hold of
    the exclusive lease before ``timing``, an open one up to now; timing's own hold is not counted."""
    import time

    w = _LeaseProbe(tmp_path / "gpu0.lock", lambda name: None, compile_off_lease=True, first_call_lease="choosers")
    w.worker.enter("construct", "shared")
    time.sleep(0.05)
    assert w.worker.exclusive_held_s() == 0.0
    w.worker.enter("correctness", "exclusive")
    time.sleep(0.05)
    assert 0.04 < w.worker.exclusive_held_s() < 1.0  # open: counted up to now
    w.worker.enter("correctness", "shared")
    held = w.worker.exclusive_held_s()
    time.sleep(0.05)
    assert w.worker.exclusive_held_s() == held
    w.autotune(True)
    time.sleep(0.05)
    w.autotune(False)
    w.worker.enter("timing", "exclusive")
    time.sleep(0.05)
    total = w.worker.exclusive_held_s()
    assert 0.08 < total < 2.0 and w.worker.exclusive_held_s() == total
