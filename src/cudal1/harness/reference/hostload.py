"""How much the host was shared while a timing block ran, as the kernel counts it: the time the
timed process's threads spent runnable but waiting for a CPU (``/proc/<pid>/task/*/schedstat``),
and how many tasks were runnable on the machine (``/proc/stat``'s ``procs_running``).

Contract: :class:`BlockLoad` is the clean reference worker's; it reads these counters around each
timing block, for the process the block timed (itself for the reference's blocks, the
candidate's process for the candidate's), and reports per block the *wait share*: waiting time
over waiting plus running time of those threads.  Nothing here judges: the parent decides
(:func:`cudal1.harness.parent.stats.host_contention`).  Without ``/proc`` (not Linux) every figure is
absent.  Cost: a read of each thread's counters per block (about 10 µs a thread).
"""

from __future__ import annotations

import os
from typing import Any


def thread_times(pid: int) -> tuple[int, int] | None:
    """(ns on a CPU, ns runnable but waiting) summed over ``pid``'s threads; None when unreadable."""
    run = wait = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                fields = f.read().split()
            run, wait = run + int(fields[0]), wait + int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
    return run, wait


def thread_wait(pid: int, tid: int) -> int:
    """ns thread ``tid`` of ``pid`` has spent runnable but waiting for a CPU so far (0 when unreadable)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            return int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0


class WindowWaits:
    """Run-queue waits of the threads a clean window depends on (this process's current thread,
    and, on the CPU, the candidate's main thread): what a busy host adds to the window, not to
    the call.  :meth:`start` before the window's start, :meth:`stop` after its end (reads outside
    the window)."""

    def __init__(self, candidate_pid: int = 0) -> None:
        import threading

        self.me, self.tid, self.candidate = os.getpid(), threading.get_native_id(), candidate_pid
        self._start = 0

    def _now(self) -> int:
        return thread_wait(self.me, self.tid) + (thread_wait(self.candidate, self.candidate) if self.candidate else 0)

    def start(self) -> None:
        self._start = self._now()

    def stop(self) -> float:
        """ms waited since :meth:`start`."""
        return max(0, self._now() - self._start) / 1e6


def runnable() -> int | None:
    """Tasks runnable on the machine right now (the reader included)."""
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("procs_running"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


class BlockLoad:
    """Per-block wait shares of the timed processes, and the machine's runnable tasks.
    ``per_call``: count only the time inside the block's calls (:meth:`call_begin` /
    :meth:`call_end` around each), not the staging between them; for the CPU clock, where both
    processes' threads are bound to the same CPUs and wait for each other between calls
    (:func:`cudal1.harness.process_start.bind_threads_for_cpu_timing`), which says nothing of
    the calls."""

    def __init__(self, per_call: bool = False) -> None:
        self.wait_share: dict[str, list[float]] = {"ref": [], "cand": []}
        self.runnable: list[int] = []
        self.per_call = per_call
        self._start: tuple[int, int] | None = None
        self._call: tuple[int, int] | None = None
        self._inside = [0, 0]  # ns running, ns waiting inside this block's calls

    def begin(self, pid: int) -> None:
        self._start = None if self.per_call else thread_times(pid)
        self._inside = [0, 0]

    def call_begin(self, pid: int) -> None:
        if self.per_call:
            self._call = thread_times(pid)

    def call_end(self, pid: int) -> None:
        if self.per_call and self._call is not None:
            after = thread_times(pid)
            if after is not None:
                self.add((after[0] - self._call[0], after[1] - self._call[1]))
            self._call = None

    def add(self, inside: tuple[int, int] | None) -> None:
        """One call's (ns running, ns waiting), read around it by whoever drove it."""
        if self.per_call and inside is not None:
            self._inside[0] += inside[0]
            self._inside[1] += inside[1]

    def end(self, who: str, pid: int) -> None:
        run = wait = 0
        if self.per_call:
            run, wait = self._inside
        elif self._start is not None:
            after = thread_times(pid)
            if after is not None:
                run, wait = after[0] - self._start[0], after[1] - self._start[1]
        if run + wait > 0:
            self.wait_share[who].append(wait / (run + wait))
        count = runnable()
        if count is not None:
            self.runnable.append(count)

    def as_dict(self) -> dict[str, Any]:
        return {"wait_share": self.wait_share, "runnable": self.runnable, "cpus": len(os.sched_getaffinity(0))
                if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)}
