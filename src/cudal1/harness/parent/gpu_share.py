"""Who else uses the GPU while a job is timed: the parent lists the device's compute processes
(NVML, package ``nvidia-ml-py``) from the start of the job's timing to its verdict.

Contract: :class:`GpuWatch` samples every ``period_s`` in a thread of the parent (a clean process:
the candidate cannot touch what it sees) and classifies each process holding a context on the
job's GPU (:class:`Sharing`):

- the job's own two processes, the judge itself and its other lanes (descendants of the judging
  process) are expected;
- a process the candidate started (its descendant, or a process of its own uid) is *foreign GPU
  work*: the verdict is ``rejected`` + ``foreign_gpu_work``;
- anything else shares the GPU with the timing: ``contended``, the timing is not trusted, and the
  batch judges the job again alone where it can.

Where NVML is missing or lists process ids of another pid namespace (a container without the
host's pid namespace: the job's own worker is then never among them), nothing can be attributed
and :attr:`Sharing.note` says why; no flag is raised on that basis.  Limits: a process that holds
a context for less than a sampling period can go unseen; sampling costs the parent about 0.1 ms
every ``period_s`` while a job is timed.

The same watch measures the job's memory (:attr:`Sharing.job_mib`): from the job's start
(:meth:`GpuWatch.begin`, every :data:`MEMORY_PERIOD_S` until the timing) to its verdict, the
most device memory its reference worker and candidate process held together in one sample.  It
is a scheduling figure (``figures["gpu_memory_mib"]``, :mod:`cudal1.harness.parent.batch`), not
a verdict: an allocation held for less than a period can go unseen, PyTorch's cached blocks are
counted (they are the process's), and where the pids cannot be attributed it is 0.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

from cudal1.extras import is_available
from cudal1.harness.proctree import CandidateTree, ancestry, name_of, uid_of

MEMORY_PERIOD_S = 0.1  # how often the job's memory is sampled before its timing (then with the sharing check)

_lock = threading.Lock()
_nvml: Any = None
_nvml_error = ""


def _init() -> Any:
    """pynvml, initialised once per process (None, with the reason in ``_nvml_error``, where it cannot be)."""
    global _nvml, _nvml_error
    with _lock:
        if _nvml is not None or _nvml_error:
            return _nvml
        if not is_available("pynvml"):
            _nvml_error = 'not checked: nvidia-ml-py is not installed (pip install "cudal1[gpu]")'
            return None
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            _nvml = pynvml
        except Exception as exc:  # noqa: BLE001 - a broken install, no driver, no NVML library
            _nvml_error = f"not checked: NVML is unavailable ({type(exc).__name__}: {exc})"[:200]
        return _nvml


def device_memory_mib(index: int) -> int:
    """The device memory of GPU ``index`` (NVML's numbering) in MiB; 0 where NVML cannot say."""
    nvml = _init()
    if nvml is None:
        return 0
    try:
        return int(nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(index)).total // 2**20)
    except Exception:  # noqa: BLE001 - no such device, a driver error
        return 0


@dataclass
class Sharing:
    """What the watch saw.  ``candidate``: the candidate's own processes with a GPU context;
    ``others``: processes outside this judge; each ``{"pid", "name", "memory_mib"}`` (both while
    the job was timed).  ``job_mib``: the most memory the job's two processes held together in
    one sample, from its start (0: not seen)."""

    checked: bool = False
    note: str = ""
    samples: int = 0
    candidate: list[dict[str, Any]] = field(default_factory=list)
    others: list[dict[str, Any]] = field(default_factory=list)
    job_mib: int = 0

    def summary(self) -> str:
        if not self.checked:
            return self.note
        parts = [f"{self.samples} samples"]
        if self.candidate:
            parts.append("the candidate's: " + _names(self.candidate))
        if self.others:
            parts.append("outside this judge: " + _names(self.others))
        return "checked (" + "; ".join(parts) + ")" if len(parts) > 1 else f"checked ({parts[0]}): none beside the job"


def _names(found: list[dict[str, Any]]) -> str:
    return ", ".join(f"pid {f['pid']} ({f['name']}, {f['memory_mib']} MiB)" for f in found[:4])


class GpuWatch:
    """Samples GPU ``index`` (NVML's numbering, which is nvidia-smi's) for one job: its memory
    from :meth:`begin`, who else uses the GPU from :meth:`start` (the timing)."""

    def __init__(self, index: int, worker_pid: int, tree: CandidateTree, period_s: float = 0.02) -> None:
        self.index, self.worker_pid, self.tree, self.period_s = index, worker_pid, tree, period_s
        self.sharing = Sharing()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._known: dict[int, str] = {}  # pid -> "ours" | "candidate" | "other"
        self._worker_seen = False
        self._timing = False  # set by start(): the sharing check runs
        self._wake = threading.Event()  # start() and stop() cut the sampler's wait short

    def begin(self) -> None:
        """Start sampling the job's memory (once; later calls do nothing)."""
        if self._thread is not None or self.sharing.note:
            return
        nvml = _init()
        if nvml is None:
            self.sharing.note = _nvml_error
            return
        try:
            self._handle = nvml.nvmlDeviceGetHandleByIndex(self.index)
        except Exception as exc:  # noqa: BLE001
            self.sharing.note = f"not checked: no NVML device {self.index} ({exc})"[:200]
            return
        self._thread = threading.Thread(target=self._run, name="cudal1-gpu-watch", daemon=True)
        self._thread.start()

    def start(self) -> None:
        """Check who else uses the GPU from now on (the job's timing), sampling every ``period_s``."""
        self._timing = True
        self._wake.set()  # the first sharing sample now, not at the end of a memory sample's wait
        self.begin()

    def stop(self) -> Sharing:
        if self._thread is not None:
            self._stop.set()
            self._wake.set()
            self._thread.join(timeout=2)
            self.sample()  # one last look, at the verdict
            s = self.sharing
            s.checked = self._worker_seen
            if not self._worker_seen and s.samples:
                s.note = (
                    "not checked: NVML lists process ids of another pid namespace (the job's worker is not among them)"
                )
                s.candidate, s.others = [], []
        return self.sharing

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._wake.wait(self.period_s if self._timing else MEMORY_PERIOD_S)
            self._wake.clear()

    def sample(self) -> None:
        nvml = _nvml
        try:
            procs = nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
        except Exception:  # noqa: BLE001 - a failed sample is a missed sample
            return
        own = sum(int(p.usedGpuMemory or 0) for p in procs if int(p.pid) in (self.worker_pid, self.tree.pid))
        self.sharing.job_mib = max(self.sharing.job_mib, own // 2**20)
        if not self._timing:
            return
        self.sharing.samples += 1
        for p in procs:
            pid = int(p.pid)
            kind = self._known.get(pid) or self._classify(pid)
            self._known[pid] = kind
            if kind == "ours":
                continue
            found = {"pid": pid, "name": name_of(pid), "memory_mib": int((p.usedGpuMemory or 0) // 2**20)}
            bucket = self.sharing.candidate if kind == "candidate" else self.sharing.others
            if all(f["pid"] != pid for f in bucket):
                bucket.append(found)

    def _classify(self, pid: int) -> str:
        if pid == self.worker_pid:
            self._worker_seen = True
            return "ours"
        if pid in (self.tree.pid, os.getpid()):
            return "ours"
        parents = ancestry(pid)
        uid = self.tree.own_uid()
        if self.tree.pid in parents or (uid is not None and uid_of(pid) == uid):
            return "candidate"
        if os.getpid() in parents:
            return "ours"  # another lane of this judge
        return "other"
