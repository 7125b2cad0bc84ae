"""How long each task's jobs took in this process: the batch's order and a drain's sizing.

Contract: :data:`TASK_SECONDS` (:class:`TaskSeconds`) keeps the longest job of each task, and of
each kind of job of each task, seen by this process's batches (or seeded from a run store's recorded times);
:mod:`cudal1.harness.parent.batch` starts the longest first and sizes jobs against a drain's
deadline with it.  A scheduling hint only: it never changes a verdict.
"""

from __future__ import annotations

import math
import threading
from typing import Any

from cudal1.compile_modes import UNGRAPHED_TWIN
from cudal1.harness.parent.plan import Job

UPPER_QUARTILE = 0.75  # the stand-in's rank among a kind's per-task times (nearest rank)


class TaskSeconds:
    """The longest time a lane spent on one job of each task judged in this process, and on one
    job of each *kind* (a candidate, or a baseline mode) of each task.  A batch
    starts the ready job whose task took longest first (longest first: a level-3 model's job
    started last keeps its GPU busy after the other lanes ran dry), tasks not judged yet before
    them, in the batch's order; the order of results is the batch's either way.  A drain's
    deadline sizes a job by its task's own jobs of its kind (:meth:`expected`; a max-autotune
    baseline is not sized by its task's search verdicts), else by :meth:`stand_in` (the kind's
    upper quartile over tasks: a job it undersizes is cut by the call's limit and judged again
    in the next call, while sizing every job by the kind's single longest could keep every
    later call from starting any job of that kind).
    Thread-safe; lives as long as the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds: dict[Any, float] = {}  # task hash and (task hash, kind) -> longest

    @staticmethod
    def kind(job: Job) -> str:
        return job.baseline_mode or "candidate"

    def note(self, job: Job, seconds: float) -> None:
        self.seed(job.task.hash, self.kind(job), seconds)

    def seed(self, task_hash: str, kind: str, seconds: float) -> None:
        """Count a job of ``kind`` (``candidate``, or a baseline mode) of the task as if judged
        here in ``seconds``: an earlier process's recorded time (a run store's ``wall_s``), so a
        resumed run orders and sizes its jobs by what it already knows."""
        with self._lock:
            for key in (task_hash, (task_hash, kind)):
                self._seconds[key] = max(seconds, self._seconds.get(key, 0.0))

    def get(self, task_hash: str) -> float:
        """Seconds of the task's longest job so far (infinite when none was judged)."""
        with self._lock:
            return self._seconds.get(task_hash, math.inf)

    def expected(self, job: Job) -> float:
        """Seconds of the longest job of this kind of this task so far (infinite when none)."""
        with self._lock:
            return self._seconds.get((job.task.hash, self.kind(job)), math.inf)

    def stand_in(self, job: Job) -> float:
        """For a job with no :meth:`expected` time: the upper quartile of its kind's jobs over the
        tasks judged so far (each task's longest; one task's outlier, such as a 490 s max-autotune
        baseline of a level-3 model, does not size every other task's), else (no job of its kind
        yet) the upper quartile of the tasks' longest jobs of any kind (that outlier does not keep
        every job of a new kind from starting in a call shorter than 1.5 x its time either), and at
        least its task's longest job (a level-3 model's first max-autotune compile is not sized by
        a small task's); infinite when none was judged.  A graphed compile mode whose ungraphed twin
        (:data:`cudal1.compile_modes.UNGRAPHED_TWIN`) ran on the task is sized by the twin's time
        alone, not by the task's longest job: the same compile, about as long on an empty cache and
        shorter where the twin's autotuning is in the task's shared cache (level3/23's graphed
        max-autotune took 29 s after its twin's 72 s, H200)."""
        kind = self.kind(job)
        twin = UNGRAPHED_TWIN.get(kind)
        with self._lock:
            if twin is not None and (job.task.hash, twin) in self._seconds:
                return self._seconds[(job.task.hash, twin)]
            times = (sorted(v for k, v in self._seconds.items() if isinstance(k, tuple) and k[1] == kind)
                     or sorted(v for k, v in self._seconds.items() if not isinstance(k, tuple)))
            if not times:
                return math.inf
            typical = times[math.ceil(UPPER_QUARTILE * len(times)) - 1]
            return max(typical, self._seconds.get(job.task.hash, 0.0))


TASK_SECONDS = TaskSeconds()
