"""Judging with a run store: resume, record, and an optional second opinion — the apps' shared
path to the judge (search, training, verify, the CLI).

Contract: :func:`judge_recorded` returns one verdict per (task, candidate) pair, in input order.
A pair already recorded in ``store`` under the same judge config is returned from the store and
not judged again (resume, and identical candidates judged once); every new verdict is recorded as
it arrives (from the lane threads, or the Ray driver's loop), so a crash or a kill loses nothing
already judged.  The judge itself (:mod:`cudal1.harness`) knows nothing of stores or reviewers.

``reviewer`` (e.g. an LLM second opinion; optional) is asked about each *new* ``ok`` verdict
after the batch, so a slow reviewer never stalls a GPU lane.  A reason it returns becomes the
informational flag ``reviewer_suspects`` and a line of the message; it never changes a verdict,
and an exception from it is ignored.
"""

from __future__ import annotations

from typing import Any, Callable

from cudal1.config import EvalConfig
from cudal1.types import Candidate, EvalResult, Status, Task

Reviewer = Callable[[Task, Candidate], "str | None"]


def judge_recorded(pairs: list[tuple[Task, Candidate]], config: EvalConfig, *, store: Any = None, plan: Any = None,
                   on_result: Callable[[EvalResult], None] | None = None,
                   reviewer: Reviewer | None = None, on_stats: Callable[[Any], None] | None = None) -> list[EvalResult]:
    """Judge ``pairs`` through ``store`` (None: judge everything, record nothing).  ``plan``
    carries the backend (local or Ray); ``on_stats`` gets the judged batch's ``BatchStats``
    (not called when everything came from the store)."""
    from cudal1.harness import Job, run_jobs

    results: list[EvalResult | None] = [None] * len(pairs)
    todo: list[int] = []
    for i, (task, cand) in enumerate(pairs):
        previous = store.get_evaluation(task.hash, cand.hash, config.hash()) if store is not None else None
        if previous is not None:
            results[i] = previous
        else:
            todo.append(i)
    if store is not None:
        for task, cand in pairs:
            store.add_task(task)
            store.add_candidate(cand, task.hash)

    def record(res: EvalResult) -> None:
        if store is not None:
            store.record_evaluation(res)
        if on_result is not None:
            on_result(res)

    if todo:
        fresh = run_jobs([Job(*pairs[i]) for i in todo], config, plan=plan, on_result=lambda _, res: record(res),
                         on_stats=on_stats)
        for i, res in zip(todo, fresh):
            results[i] = res
        if reviewer is not None:
            review([(pairs[i], results[i]) for i in todo], reviewer, store)
    return [r for r in results if r is not None]


def review(done: list[tuple[tuple[Task, Candidate], EvalResult | None]], reviewer: Reviewer, store: Any = None) -> None:
    """Ask ``reviewer`` about each ``ok`` verdict in ``done``; see the module docstring."""
    for (task, cand), res in done:
        if res is None or res.status is not Status.OK:
            continue
        try:
            reason = reviewer(task, cand)
        except Exception:  # noqa: BLE001 - a second opinion must never break judging
            reason = None
        if reason:
            res.flags.append("reviewer_suspects")
            res.message = (res.message + "\n" if res.message else "") + f"reviewer: {reason}"
            if store is not None:
                store.record_evaluation(res)


def baselines_recorded(tasks: list[Task], modes: list[str], config: EvalConfig, *, store: Any = None, plan: Any = None,
                       on_result: Callable[[EvalResult], None] | None = None) -> dict[tuple[str, str], EvalResult]:
    """Baselines of ``tasks`` under ``modes`` ({(task hash, mode): result}), cached in ``store``
    per (task, mode, environment, config): a baseline is measured once per machine."""
    from cudal1.harness import DevicePlan
    from cudal1.harness.api import environment_key, time_baselines
    from cudal1.harness.baselines import check_modes

    plan = plan or DevicePlan.detect(config.device)
    modes = check_modes(modes, plan.device)
    env_key = environment_key(plan)
    out: dict[tuple[str, str], EvalResult] = {}
    todo: list[tuple[Task, str]] = []
    for task in tasks:
        for mode in modes:
            cached = store.get_baseline(task.hash, mode, env_key, config.hash()) if store is not None else None
            if cached is not None:
                out[(task.hash, mode)] = cached
            else:
                todo.append((task, mode))
    by_hash = {(t.hash, m): (t, m) for t, m in todo}

    def record(res: EvalResult) -> None:
        mode = res.candidate_hash.removeprefix("baseline:")
        if store is not None and (res.task_hash, mode) in by_hash:
            store.record_baseline(res.task_hash, mode, env_key, config.hash(), res)
        if on_result is not None:
            on_result(res)

    for (task, mode), res in zip(todo, time_baselines(todo, config, plan=plan, on_result=record)):
        out[(task.hash, mode)] = res
    return out
