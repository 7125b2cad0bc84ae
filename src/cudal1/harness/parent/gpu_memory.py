"""Sharing one GPU's memory among the jobs a batch runs on it at once (``workers_per_gpu`` > 1).

Contract: :class:`GpuGate` admits jobs to one GPU: beside the running ones while their shares
fit (:data:`MEMORY_FILL` of the GPU's memory), or alone (:meth:`GpuGate.alone`: the running jobs
finish first, new ones wait).  :data:`TASK_MEMORY` (:class:`TaskMemory`) keeps each task's most
measured memory and the tasks that ran out of memory beside others, for this process and, in the
cache directory, for the next; :func:`runs_alone` says which jobs go alone.  These are scheduling
hints: a wrong one costs an out-of-memory verdict judged again alone
(:mod:`cudal1.harness.parent.batch`), never a verdict.
"""

from __future__ import annotations

import json
import math
import os
import threading
from pathlib import Path
from typing import Any, Callable

from cudal1.types import EvalResult, Status


def out_of_memory(result: EvalResult) -> bool:
    """The verdict is a failure to get memory (the candidate's or the reference's)."""
    return result.status is Status.RUNTIME_ERROR and "oom" in result.flags


# A job's share of its GPU's memory is its task's largest measured job times this, and the shares
# of the jobs running together fill at most MEMORY_FILL of the GPU (the rest: other processes'
# contexts, allocations between two samples).
MEMORY_MARGIN = 1.15
MEMORY_FILL = 0.92


class GpuGate:
    """The jobs running on one GPU, and a way to run one job with the GPU to itself.

    Workers sharing a GPU (``workers_per_gpu`` > 1) share its memory too, so a job can run out of
    memory only because of its neighbours.  Such a verdict is not the job's: :meth:`alone` lets
    the running jobs finish, holds new ones back, and runs the job again by itself; the verdict of
    that run stands.  With the GPU's memory known (``capacity_mib``), the shares of the running
    jobs whose tasks' memory is known are counted, and a job of a task that ran out of memory
    before waits until its share fits beside them (:meth:`enter`)."""

    def __init__(self, capacity_mib: int = 0) -> None:
        self.cond = threading.Condition()
        self.active = 0  # jobs running on the GPU
        self.solo = 0  # jobs waiting to run alone, or running alone
        self.held_back = 0  # jobs waiting to enter because one waits to run alone, or for room
        self.capacity_mib = capacity_mib  # 0: unknown, shares are not counted
        self.held_mib = 0  # the shares of the jobs running
        self.waiting: list[tuple[object, int]] = []  # (ticket, share) of the jobs waiting for room, in order

    def share(self, need_mib: int) -> int:
        """The share a job of ``need_mib`` counts for here: none where the GPU's memory is not known."""
        return need_mib if self.capacity_mib else 0

    def room_mib(self) -> float:
        """The memory that the shares of jobs running together may fill."""
        return self.capacity_mib * MEMORY_FILL

    def _may_enter(self, ticket: object, need: int, wait: bool) -> bool:
        if not need or not self.active:
            return True
        room = self.room_mib()
        if wait and self.held_mib + need > room:
            return False
        if not self.waiting or self.waiting[0][0] is ticket:
            return True
        return self.held_mib + need + self.waiting[0][1] <= room  # the first job waiting keeps its room

    def fits_now(self, need_mib: int, wait_for_room: bool = False) -> bool:
        """Whether a job with this share (0: none) would enter now (:meth:`enter`)."""
        with self.cond:
            return not self.solo and self._may_enter(None, self.share(need_mib), wait_for_room)

    def enter(self, stopping: Callable[[], bool], need_mib: int = 0, wait_for_room: bool = False) -> None:
        """Start a job on this GPU, after any job waiting to run alone.  ``need_mib``: its share
        (0: not known), counted while it runs.  With ``wait_for_room`` (its task ran out of memory
        beside others) it waits until its share fits beside the running ones', first come first
        served; a job with a share that does not wait for room still keeps out of the room of the
        first one waiting; a job with no share enters as before."""
        need = self.share(need_mib)
        wait = wait_for_room and bool(need)
        ticket = object()
        with self.cond:
            if wait:
                self.waiting.append((ticket, need))
            try:
                while (self.solo or not self._may_enter(ticket, need, wait)) and not stopping():
                    self.held_back += 1
                    self.cond.wait(timeout=1.0)
                    self.held_back -= 1
            finally:
                if wait:
                    self.waiting.remove((ticket, need))
            self.active += 1
            self.held_mib += need
            self.cond.notify_all()  # the next in line may enter now

    def leave(self, need_mib: int = 0) -> None:
        with self.cond:
            self.active -= 1
            self.held_mib -= self.share(need_mib)
            self.cond.notify_all()

    def alone(self, run: Callable[[], EvalResult], stopping: Callable[[], bool]) -> EvalResult:
        """``run()`` once no other job runs on this GPU (the caller has left the gate)."""
        with self.cond:
            self.solo += 1
            while self.active and not stopping():
                self.cond.wait(timeout=1.0)
            self.active += 1
        try:
            return run()
        finally:
            with self.cond:
                self.active -= 1
                self.solo -= 1
                self.cond.notify_all()


class TaskMemory:
    """The most device memory one job of each task held (MiB, its two processes together, as the
    parent's NVML watch saw them: ``figures["gpu_memory_mib"]``, :mod:`gpu_share`), the tasks
    that ran out of memory beside other jobs, and the tasks whose reference's timed calls were
    blocked with the GPU to itself (:mod:`.blocked`).  Kept for the process, and in
    ``CACHE/gpu_memory.json`` (:meth:`attach`) so the next process of a resumed run starts with
    them.  A scheduling hint only: a missing or low entry costs an OOM and a verdict judged again
    alone, never a verdict.  Thread-safe."""

    FILE = "gpu_memory.json"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mib: dict[str, int] = {}
        self._oom: set[str] = set()
        self._blocks: set[str] = set()  # tasks whose reference's timed calls were blocked alone (.blocked)
        self._path: Path | None = None

    def attach(self, cache_root: Path) -> None:
        """Read and from now on keep the file under ``cache_root`` (once per process and root)."""
        path = cache_root / self.FILE
        with self._lock:
            if self._path == path:
                return
            self._path = path
            try:
                saved = json.loads(path.read_text())
            except (OSError, ValueError):
                return
            for h, entry in (saved.items() if isinstance(saved, dict) else []):
                if not isinstance(entry, dict):
                    continue
                mib = entry.get("mib")
                if isinstance(mib, int) and mib > self._mib.get(h, 0):
                    self._mib[h] = mib
                if entry.get("oom") is True:
                    self._oom.add(h)
                if entry.get("reference_blocks") is True:
                    self._blocks.add(h)

    def note(self, task_hash: str, mib: Any) -> None:
        """A job of the task held ``mib``: kept when it is the task's most so far."""
        if not isinstance(mib, (int, float)) or mib <= 0:
            return
        with self._lock:
            if mib <= self._mib.get(task_hash, 0):
                return
            self._mib[task_hash] = int(mib)
            self._save()

    def ran_out(self, task_hash: str) -> None:
        """A job of the task ran out of memory beside other jobs: a task's memory is mostly its
        inputs, outputs and answers, so its later jobs (the next candidates, a search's next round)
        would run out the same way."""
        self._mark(self._oom, task_hash)

    def bound(self, task_hash: str) -> bool:
        """Whether a job of the task ran out of memory beside other jobs, here or in a process before."""
        with self._lock:
            return task_hash in self._oom

    def reference_blocked_alone(self, task_hash: str) -> None:
        """The task's reference's timed calls were blocked with the GPU to itself: it waits for the
        device by itself (:mod:`cudal1.harness.parent.blocked`)."""
        self._mark(self._blocks, task_hash)

    def reference_blocks(self, task_hash: str) -> bool:
        """Whether the task's reference blocked alone, here or in a process before."""
        with self._lock:
            return task_hash in self._blocks

    def _mark(self, tasks: set[str], task_hash: str) -> None:
        """Add the task to one of the kept sets (saved when it is new)."""
        with self._lock:
            if task_hash not in tasks:
                tasks.add(task_hash)
                self._save()

    def _save(self) -> None:
        if self._path is None:
            return
        data = {h: {"mib": self._mib.get(h, 0), "oom": h in self._oom}
                | ({"reference_blocks": True} if h in self._blocks else {})
                for h in sorted(set(self._mib) | self._oom | self._blocks)}
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self._path.with_name(f"{self._path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self._path)
        except OSError:
            pass  # a hint not kept: the next process measures again

    def need(self, task_hash: str) -> int:
        """The task's share of a GPU's memory for its next job (MiB; 0 when not measured)."""
        with self._lock:
            return math.ceil(self._mib.get(task_hash, 0) * MEMORY_MARGIN)


TASK_MEMORY = TaskMemory()


def runs_alone(gate: GpuGate, need_mib: int, bound: bool) -> bool:
    """Whether a job goes to ``gate``'s GPU alone (:meth:`GpuGate.alone`): its share leaves no room
    beside another, or its task ran out of memory beside others and has no share yet."""
    return need_mib > gate.room_mib() or (bound and not need_mib)


def gpu_capacity_mib(gpu: int | None) -> int:
    """The memory of GPU ``gpu`` (nvidia-smi's index) in MiB; 0 for the CPU or where NVML cannot say."""
    if gpu is None:
        return 0
    from cudal1.harness.parent.gpu_share import device_memory_mib

    return device_memory_mib(gpu)
