"""Recorded judging: the one object through which the apps judge and keep what was judged.

Contract: a :class:`RecordedJudge` owns one run's judging state — the judge config, the device
plan (and the hardware name prompts show), the run store, the optional reviewer and the event
callback — and is what every app takes to judge (``optimize``, collect, SFT data, self-supervised
rounds, GRPO, evaluate).  It is the only writer of candidates and verdicts to a run store:

* The run store is given at construction, or opened by the app at its run's conventional place
  (:meth:`~RecordedJudge.open_store`, :meth:`~RecordedJudge.store_at`) and closed by it again.

* :meth:`~RecordedJudge.judge` returns one verdict per (task, candidate) pair, in input order.
  A pair already recorded under the same judge config comes from the store (or the in-memory
  cache) and is not judged again (resume; identical candidates judged once); every new verdict
  is recorded as it arrives (from the lane threads, or the Ray driver's loop), so a crash or a
  kill loses nothing already judged.  Each task and candidate row is written once per run
  (:meth:`~RecordedJudge.propose` records it with its provenance; ``judge`` adds rows only for
  pairs nobody proposed).
* ``reviewer`` (an LLM second opinion; optional) is asked about each *new* ``ok`` verdict after
  the batch, so a slow reviewer never stalls a GPU lane (a task's reference judged as itself,
  the anchor, is never asked about).  A reason it returns becomes the
  informational flag ``reviewer_suspects`` and a line of the message; it never changes a
  verdict, and an exception from it is ignored.
* :meth:`~RecordedJudge.profile_recorded` adds measured profiles to verdicts already recorded
  (the candidate judged once more with profiling on; only its profile is kept, the recorded
  verdict stands), so a run can profile a few programs without profiling every candidate.
* Before it judges, what the store's verdicts and baselines under this config took (wall time,
  GPU memory, a job judged again alone) seeds the batches' scheduling hints
  (:meth:`~RecordedJudge.prime_batches`): a resumed run, even on a fresh machine, starts its
  longest tasks first, sizes a job for a drain's deadline by what earlier calls measured, and
  places a memory-bound task's jobs by their share instead of finding it out by an OOM.
* :meth:`~RecordedJudge.adopt` records a verdict judged elsewhere under the same judge config
  (another run's store) as this run's, so it is not judged again.
* The exemplar pool (:meth:`~RecordedJudge.pool`) is what the contrastive prompts are built
  from: the task's ``ok`` candidates with a finite speedup, and its failed ones with the
  judge's feedback, oldest first; empty for a task the judge found degenerate.
* ``on_event`` receives a :class:`JudgeEvent` for every pair settled by ``judge`` (``verdict``
  for a new one, from a lane thread; ``recorded`` for one read back), for every slot an app
  reports as never reaching the judge (:meth:`~RecordedJudge.unjudged`), and the app's
  ``expect`` (slots it will settle) and ``note`` (a line for people, e.g. "resuming: 7 already
  judged") events: progress displays and trackers listen there.  It must be thread-safe and
  must not raise.

The judge itself (:mod:`cudal1.harness`) knows nothing of stores, pools or reviewers.
"""

from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from cudal1.config import EvalConfig
from cudal1.types import Candidate, EvalResult, Exemplar, Status, Task, reference_candidate

if TYPE_CHECKING:
    from cudal1.harness import DevicePlan, Job
    from cudal1.store import RunStore

Reviewer = Callable[[Task, Candidate], "str | None"]
FEEDBACK_CHARS = 1500  # the tail of a failed candidate's log shown to the policy


@dataclass(frozen=True)
class JudgeEvent:
    """One settled slot of a batch, for progress displays and trackers."""

    kind: str  # "verdict" (judged now), "recorded" (read back), "unjudged" (never reached the judge), "expect", "note"
    task: str = ""  # task id
    result: EvalResult | None = None  # the verdict ("verdict" and "recorded")
    note: str = ""  # "unjudged": why (a generation failure, a response without code); "note": a line for people
    count: int = 0  # "expect": how many more slots this run expects to settle


@dataclass(frozen=True)
class Pool:
    """What the judge has measured of one task: the exemplars of its contrastive prompts."""

    ok: list[Exemplar]  # verified candidates with a finite speedup, oldest first
    failed: list[Exemplar]  # failed candidates with the judge's feedback, oldest first
    degenerate: bool = False  # the judge found the task degenerate: no speedup on it means anything


def feedback_text(result: EvalResult, limit: int = FEEDBACK_CHARS) -> str:
    """What a policy is shown of a failed verdict: the tail of the compile log or the message."""
    text = result.compile_log if result.status is Status.COMPILE_ERROR and result.compile_log else result.message
    return text[-limit:]


class RecordedJudge:
    """One run's judging through a run store (see the module docstring)."""

    def __init__(self, config: EvalConfig, store: RunStore | None = None, *, plan: DevicePlan | None = None,
                 reviewer: Reviewer | None = None, on_event: Callable[[JudgeEvent], None] | None = None,
                 hardware: str = "") -> None:
        """``plan``: where candidates are judged (None: detected from ``config.device`` when first
        needed); ``hardware``: what prompts call it ("": the plan's own name)."""
        self.config, self.store, self.plan, self.reviewer, self.on_event = config, store, plan, reviewer, on_event
        self.hardware_name = hardware
        self.config_hash = config.hash()
        self.judged = 0  # verdicts judged (not read back) by this object
        self._verdicts: dict[tuple[str, str], EvalResult] = {}
        self._rows: set[tuple[str, str]] = set()  # (task hash, candidate hash) rows written by this object
        self._tasks: set[str] = set()
        self._lock = threading.Lock()
        self._owned_store = False  # the store was opened here (open_store) and is closed here
        self.batch_stats: list[Any] = []  # BatchStats of every batch this object judged (candidates and baselines)
        self._env_key: str | None = None  # environment_key(), once computed
        self._primed = False  # prime_batches() ran

    @property
    def hardware(self) -> str:
        """What judges this run's candidates ("CPU", the GPU model, a Ray cluster), as prompts name it."""
        if not self.hardware_name:
            self.hardware_name = self.device_plan().hardware_name()
        return self.hardware_name

    def device_plan(self) -> DevicePlan:
        """The plan candidates are judged on (detected from the config once, when none was given)."""
        if self.plan is None:
            from cudal1.harness import DevicePlan

            self.plan = DevicePlan.detect(self.config.device)
        return self.plan

    def prime_batches(self) -> int:
        """Once per object: what the store's verdicts and baselines under this config took seeds
        the batches' scheduling hints: each job's wall seconds (``task_seconds.TASK_SECONDS``: longest
        tasks first, a drain's deadline sizes jobs by them) and each task's GPU memory and whether
        it was judged again alone (``gpu_memory.TASK_MEMORY``): one that ran out of memory beside
        others enters with its share, or alone, instead of running out first; one whose
        reference's timed calls were blocked in its verdict judged alone has a reference that
        blocks by itself, so its later verdicts are not judged again for it
        (:mod:`cudal1.harness.parent.blocked`).  Returns how many."""
        if self._primed or self.store is None:
            return 0
        from cudal1.harness.parent.blocked import sides_blocked
        from cudal1.harness.parent.gpu_memory import TASK_MEMORY
        from cudal1.harness.parent.task_seconds import TASK_SECONDS

        self._primed = True
        jobs = self.store.recorded_jobs(self.config_hash)
        for job in jobs:
            if job.wall_s:
                TASK_SECONDS.seed(job.task_hash, job.kind, job.wall_s)
            TASK_MEMORY.note(job.task_hash, job.gpu_memory_mib)
            if job.rejudged_alone and not job.rejudged_for_blocked_calls:  # out of memory (or contended)
                TASK_MEMORY.ran_out(job.task_hash)
            elif job.rejudged_alone and "reference" in sides_blocked(job.blocked_calls):
                TASK_MEMORY.reference_blocked_alone(job.task_hash)
        return len(jobs)

    # ---- the run store ------------------------------------------------------------------
    def open_store(self, path: str | Path) -> RunStore:
        """The run's store: the one given at construction, else the store at ``path``, opened here
        (and closed by :meth:`close_store`)."""
        if self.store is None:
            from cudal1.store import RunStore

            self.store = RunStore(path)
            self._owned_store = True
        return self.store

    def close_store(self) -> None:
        """Close the store :meth:`open_store` opened (a store given at construction stays open)."""
        if self._owned_store and self.store is not None:
            self.store.close()
            self.store, self._owned_store = None, False

    @contextlib.contextmanager
    def store_at(self, path: str | Path) -> Iterator[RunStore]:
        """:meth:`open_store` for the length of a ``with`` block."""
        store = self.open_store(path)
        try:
            yield store
        finally:
            self.close_store()

    # ---- recording ----------------------------------------------------------------------
    def add_task(self, task: Task) -> None:
        if self.store is not None and task.hash not in self._tasks:
            self.store.add_task(task)
        self._tasks.add(task.hash)

    def propose(self, task: Task, candidate: Candidate, meta: dict[str, Any] | None = None) -> None:
        """Record ``candidate`` as proposed for ``task`` with its provenance (round, policy, ...)."""
        self.add_task(task)
        key = (task.hash, candidate.hash)
        if self.store is not None and key not in self._rows:
            self.store.add_candidate(candidate, task.hash, meta)
        self._rows.add(key)

    def record_response(self, task: Task, round_: int, policy: str, prompt: dict[str, Any], text: str, analysis: str,
                        candidate: Candidate | None, *, problem: str = "", error: str = "",
                        usage: dict[str, Any] | None = None) -> None:
        """Record one policy response (the exact prompt, the text, its parse or its error)."""
        if self.store is not None:
            self.store.record_response(task.hash, round_, policy, prompt, text, analysis,
                                       candidate.hash if candidate else None, problem=problem, error=error, usage=usage)

    def adopt(self, task: Task, candidate: Candidate, result: EvalResult) -> bool:
        """Record ``result``, a verdict of ``candidate`` judged elsewhere (another run's store), as
        this run's when it was judged under this judge config and this run has none; returns
        whether it was adopted.  :meth:`judge` then reads it back instead of judging again."""
        if (result.config_hash != self.config_hash or result.task_hash != task.hash
                or result.candidate_hash != candidate.hash or self.verdict(task, candidate) is not None):
            return False
        self.propose(task, candidate)
        with self._lock:
            self._verdicts[(task.hash, candidate.hash)] = result
        if self.store is not None:
            self.store.record_evaluation(result)
        return True

    def unjudged(self, task: Task, note: str) -> None:
        """Report a slot that never reached the judge (a failed generation, a response without code)."""
        self._emit(JudgeEvent("unjudged", task.task_id, None, note))

    def expect(self, slots: int) -> None:
        """Tell the listener how many more slots (verdicts or unjudged) this run will settle."""
        if slots > 0:
            self._emit(JudgeEvent("expect", count=slots))

    def note(self, text: str) -> None:
        """A line for people watching the run."""
        self._emit(JudgeEvent("note", note=text))

    # ---- judging ------------------------------------------------------------------------
    def verdict(self, task: Task, candidate: Candidate) -> EvalResult | None:
        """The verdict of ``candidate`` under this config, if judged (this run or an earlier one)."""
        return self.verdict_of(task.hash, candidate.hash)

    def verdict_of(self, task_hash: str, candidate_hash: str) -> EvalResult | None:
        """:meth:`verdict` of a candidate known by its hash (a recorded response's)."""
        key = (task_hash, candidate_hash)
        found = self._verdicts.get(key)
        if found is None and self.store is not None:
            found = self.store.get_evaluation(task_hash, candidate_hash, self.config_hash)
            if found is not None:
                self._verdicts[key] = found
        return found

    def judge(self, pairs: list[tuple[Task, Candidate]], *, on_stats: Callable[[Any], None] | None = None,
              along: tuple[list[Job], Callable[[EvalResult], None]] | None = None) -> list[EvalResult]:
        """Judge ``pairs`` (see the module docstring); ``on_stats`` gets the judged batch's
        ``BatchStats`` (not called when nothing was judged).  ``along``: more jobs for the same
        batch, and the callback each of their results goes to as it arrives (from a lane thread;
        nothing of them is recorded here, nor returned): e.g. baselines, whose compiles are mostly
        CPU work, in lanes that the pairs' GPU work leaves waiting.  They run even when every
        pair was recorded already; a drain leaves those it did not start unjudged."""
        from cudal1.harness import Job, run_jobs

        results: list[EvalResult | None] = [None] * len(pairs)
        todo: list[int] = []
        first: dict[tuple[str, str], int] = {}  # identical pairs in one batch are judged once
        copies: list[tuple[int, int]] = []
        for i, (task, cand) in enumerate(pairs):
            self.propose(task, cand)
            previous = self.verdict(task, cand)
            key = (task.hash, cand.hash)
            if previous is not None:
                results[i] = previous
                self._emit(JudgeEvent("recorded", task.task_id, previous))
            elif key in first:
                copies.append((i, first[key]))
            else:
                first[key] = i
                todo.append(i)

        copies_of: dict[int, list[int]] = {}
        for i, j in copies:
            copies_of.setdefault(j, []).append(i)

        extra, extra_done = along if along else ([], None)

        def record(index: int, res: EvalResult) -> None:
            if index >= len(todo):
                extra_done(res)
                return
            task, cand = pairs[todo[index]]
            with self._lock:
                self._verdicts[(task.hash, cand.hash)] = res
                self.judged += 1
            if self.store is not None:
                self.store.record_evaluation(res)
            self._emit(JudgeEvent("verdict", task.task_id, res))
            for copy in copies_of.get(todo[index], []):  # an identical pair settles as its original does
                self._emit(JudgeEvent("recorded", pairs[copy][0].task_id, res))

        if todo or extra:
            self.prime_batches()
            fresh = run_jobs([Job(*pairs[i]) for i in todo] + list(extra), self.config, plan=self.plan,
                             on_result=record, on_stats=self._stats_to(on_stats))
            for i, res in zip(todo, fresh):
                results[i] = res
                self._verdicts[(pairs[i][0].hash, pairs[i][1].hash)] = res
            if self.reviewer is not None:
                self._review([(pairs[i], results[i]) for i in todo])
        for i, j in copies:
            results[i] = results[j]
        return [r for r in results if r is not None]

    def profile_recorded(self, pairs: list[tuple[Task, Candidate]]) -> int:
        """Profile the ``ok`` recorded verdicts of ``pairs`` that have no profile yet: each pair
        is judged again with ``profile: cupti`` and the new profile is attached to the recorded
        verdict (the new verdict itself is dropped).  Returns how many were profiled."""
        from cudal1.harness import Job, run_jobs

        todo = [(t, c, r) for t, c in pairs if (r := self.verdict(t, c)) is not None
                and r.status is Status.OK and r.profile is None]
        if not todo:
            return 0
        fresh = run_jobs([Job(t, c) for t, c, _ in todo], self.config.replace(profile="cupti"), plan=self.plan)
        for (_, _, recorded), again in zip(todo, fresh):
            recorded.profile = again.profile
            if self.store is not None and again.profile is not None:
                self.store.record_evaluation(recorded)
        return sum(1 for _, _, r in todo if r.profile is not None)

    def _review(self, done: list[tuple[tuple[Task, Candidate], EvalResult | None]]) -> None:
        for (task, cand), res in done:
            if res is None or res.status is not Status.OK or cand.hash == reference_candidate(task).hash:
                continue
            try:
                reason = self.reviewer(task, cand)  # type: ignore[misc]
            except Exception:  # noqa: BLE001 - a second opinion must never break judging
                reason = None
            if reason:
                res.flags.append("reviewer_suspects")
                res.message = (res.message + "\n" if res.message else "") + f"reviewer: {reason}"
                if self.store is not None:
                    self.store.record_evaluation(res)

    def _emit(self, event: JudgeEvent) -> None:
        if self.on_event is not None:
            self.on_event(event)

    # ---- what was judged ----------------------------------------------------------------
    def results(self, task: Task) -> list[tuple[Candidate, EvalResult]]:
        """(candidate, verdict) of every candidate of ``task`` judged under this config, oldest first."""
        if self.store is None:
            return []
        out = []
        for cand in self.store.candidates(task.hash):
            res = self.verdict(task, cand)
            if res is not None:
                out.append((cand, res))
        return out

    def pending(self, tasks: list[Task]) -> list[tuple[Task, Candidate]]:
        """Candidates recorded but never judged under this config (a run killed mid-batch)."""
        if self.store is None:
            return []
        return [(t, c) for t in tasks for c in self.store.candidates(t.hash) if self.verdict(t, c) is None]

    def pool(self, task: Task) -> Pool:
        """The task's exemplar pool (see the module docstring)."""
        pairs = self.results(task)
        if is_degenerate(pairs):
            return Pool([], [], degenerate=True)
        ok = [Exemplar(c.source, r.speedup, r.status.value, "", c.hash) for c, r in pairs
              if r.status is Status.OK and r.speedup is not None and math.isfinite(r.speedup)]
        failed = [Exemplar(c.source, None, r.status.value, feedback_text(r), c.hash) for c, r in pairs
                  if r.status is not Status.OK]
        return Pool(ok, failed)

    def best(self, task: Task) -> tuple[Candidate, EvalResult] | None:
        """The task's ``ok`` candidate with the highest measured speedup (earliest on ties; the
        reference anchor never), or None (nothing verified, or a degenerate task)."""
        return best_of(task, self.results(task))

    # ---- the run's record ---------------------------------------------------------------
    @contextlib.contextmanager
    def run(self, kind: str, settings: dict[str, Any], *, record: bool = True) -> Iterator[None]:
        """Record a run of ``kind`` with its ``settings`` in the store for the ``with`` block:
        finished ``done``, or ``interrupted`` when the block raises.  Nothing is recorded without
        a store or with ``record=False`` (the training ranks after the first)."""
        store = self.store if record else None
        run_id = store.start_run(kind, settings) if store is not None else None
        status = "interrupted"
        try:
            yield
            status = "done"
        finally:
            if store is not None and run_id is not None:
                store.finish_run(run_id, status)

    def responses(self, task: Task | None = None) -> list[dict[str, Any]]:
        """The policy responses recorded for ``task`` (for every task: None), oldest first."""
        return self.store.responses(task.hash if task is not None else None) if self.store is not None else []

    def round_counts(self, task: Task) -> dict[int, tuple[int, int]]:
        """Per round of ``task``: (responses answered, generations failed), as recorded."""
        return self.store.round_counts(task.hash) if self.store is not None else {}

    def status_counts(self) -> dict[str, int]:
        """How many verdicts the store holds per status (every task, every config)."""
        return self.store.counts() if self.store is not None else {}

    # ---- baselines ----------------------------------------------------------------------
    def _stats_to(self, on_stats: Callable[[Any], None] | None) -> Callable[[Any], None]:
        def keep(stats: Any) -> None:
            self.batch_stats.append(stats)
            if on_stats is not None:
                on_stats(stats)
        return keep

    def judging_summary(self) -> dict[str, Any] | None:
        """The batches this object judged, merged: jobs, wall seconds and the GPU's idle share
        (None when it judged nothing)."""
        from cudal1.harness.parent.batchstats import total

        merged = total(self.batch_stats)
        if merged is None:
            return None
        data = merged.to_dict()
        return {
            "batches": len(self.batch_stats),
            "workers_per_gpu": self.config.workers_per_gpu,
            **{k: data.get(k) for k in ("jobs", "wall_s", "gpu_idle_share", "idle_share", "mean_concurrent_builds")},
        }

    def baselines(self, tasks: list[Task], modes: list[str], on_result: Callable[[EvalResult], None] | None = None,
                  on_stats: Callable[[Any], None] | None = None) -> dict[tuple[str, str], EvalResult]:
        """Baselines of ``tasks`` under ``modes`` ({(task hash, mode): result}), cached in the store
        per (task, mode, environment, config): a baseline is measured once per machine.
        ``on_stats`` gets the timed batch's ``BatchStats`` (not called when every one was cached)."""
        from cudal1.harness.baselines import check_modes

        # Mode by mode: workers side by side time different tasks, and a task's next mode starts
        # once its previous one compiled (the baseline compile cache then serves the kernels and
        # autotuning the modes share).
        modes = check_modes(modes, self.device_plan().device)
        return self.baselines_for([(task, mode) for mode in modes for task in tasks], on_result, on_stats)

    def baselines_for(self, pairs: list[tuple[Task, str]], on_result: Callable[[EvalResult], None] | None = None,
                      on_stats: Callable[[Any], None] | None = None) -> dict[tuple[str, str], EvalResult]:
        """:meth:`baselines` of these (task, mode) pairs, timed in their order; modes that need CUDA
        are dropped on a CPU, an unknown mode raises ``ValueError``."""
        from cudal1.harness.parent.api import time_baselines

        out, todo = self.baselines_to_time(pairs)
        wanted = {(t.hash, m) for t, m in todo}

        def record(res: EvalResult) -> None:
            if (res.task_hash, res.candidate_hash.removeprefix("baseline:")) in wanted:
                self.keep_baseline(res)
            if on_result is not None:
                on_result(res)

        if todo:
            self.prime_batches()
        timed = (
            time_baselines(todo, self.config, plan=self.device_plan(), on_result=record,
                           on_stats=self._stats_to(on_stats))
            if todo
            else []
        )
        for (task, mode), res in zip(todo, timed):
            out[(task.hash, mode)] = res
        return out

    def baselines_to_time(self, pairs: list[tuple[Task, str]]
                          ) -> tuple[dict[tuple[str, str], EvalResult], list[tuple[Task, str]]]:
        """Of these (task, mode) pairs: the store's verdicts ({(task hash, mode): result}, this
        machine's environment and this judge's config) and, in order, the pairs left to time
        (modes resolved; those that need CUDA dropped on a CPU; an unknown mode raises
        ``ValueError``)."""
        from cudal1.harness.baselines import check_modes

        plan = self.device_plan()
        resolved = {m: check_modes([m], plan.device) for m in {m for _, m in pairs}}  # [] where CUDA-only on a CPU
        out: dict[tuple[str, str], EvalResult] = {}
        todo: list[tuple[Task, str]] = []
        for task, name in pairs:
            if not resolved[name]:
                continue
            mode = resolved[name][0]
            cached = (self.store.get_baseline(task.hash, mode, self.environment_key(), self.config_hash)
                      if self.store is not None else None)
            if cached is not None:
                out[(task.hash, mode)] = cached
            else:
                todo.append((task, mode))
        return out, todo

    def keep_baseline(self, res: EvalResult) -> None:
        """A baseline verdict (``candidate_hash`` ``baseline:MODE``) into the store, under this
        machine's environment and this judge's config."""
        if self.store is not None:
            self.store.record_baseline(res.task_hash, res.candidate_hash.removeprefix("baseline:"),
                                       self.environment_key(), self.config_hash, res)

    def environment_key(self) -> str:
        """The baselines' environment identity on this judge's plan (computed once)."""
        from cudal1.harness.parent.api import environment_key

        if self._env_key is None:
            self._env_key = environment_key(self.device_plan())
        return self._env_key


def is_degenerate(pairs: list[tuple[Candidate, EvalResult]]) -> bool:
    """The judge flagged the task ``degenerate_task`` in any of these verdicts."""
    return any("degenerate_task" in r.flags for _, r in pairs)


def best_of(task: Task, pairs: list[tuple[Candidate, EvalResult]]) -> tuple[Candidate, EvalResult] | None:
    """The highest measured ``ok`` speedup among ``pairs`` (earliest on ties; never the reference
    anchor), or None when there is none or the task is degenerate."""
    if is_degenerate(pairs):
        return None
    anchor = reference_candidate(task).hash
    ok = [(c, r) for c, r in pairs if r.status is Status.OK and r.speedup is not None and c.hash != anchor]
    return max(ok, key=lambda cr: cr[1].speedup) if ok else None  # max keeps the first of equal values


def judge_recorded(pairs: list[tuple[Task, Candidate]], config: EvalConfig, *, store: RunStore | None = None,
                   plan: DevicePlan | None = None, on_result: Callable[[EvalResult], None] | None = None,
                   reviewer: Reviewer | None = None, on_stats: Callable[[Any], None] | None = None) -> list[EvalResult]:
    """One batch through a :class:`RecordedJudge` (for callers with no run state of their own);
    ``on_result`` gets each new verdict."""
    on_event = (lambda e: on_result(e.result) if e.kind == "verdict" else None) if on_result else None  # type: ignore[arg-type]
    return RecordedJudge(config, store, plan=plan, reviewer=reviewer, on_event=on_event).judge(pairs, on_stats=on_stats)


def baselines_recorded(tasks: list[Task], modes: list[str], config: EvalConfig, *, store: RunStore | None = None,
                       plan: DevicePlan | None = None,
                       on_result: Callable[[EvalResult], None] | None = None) -> dict[tuple[str, str], EvalResult]:
    """:meth:`RecordedJudge.baselines` for callers with no run state of their own."""
    return RecordedJudge(config, store, plan=plan).baselines(tasks, modes, on_result)
