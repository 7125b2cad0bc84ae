"""A fixed-budget evaluation of a model (a checkpoint or an endpoint): k one-shot samples per task.

Contract: :func:`run_evaluate` asks ``policy`` for exactly ``samples`` answers per task — one
request per sample (``generate`` with ``n = 1``), each for the task's one-shot prompt (the
contrastive template without exemplars: no search rounds, no feedback, nothing the model's own
earlier answers could add) — parses and judges every answer (:class:`~cudal1.train.judging.RolloutJudge`)
and returns the figures of :mod:`cudal1.train.evaluation.figures` (compile/correct/ok rates, fast_p, best-of-k
speedups, pass@k).  Everything is recorded in ``OUT/cudal1.sqlite`` (responses with policy
``evaluate``, round 1: prompts, texts, parses, verdicts), which ``cudal1 report OUT`` renders; the
summary is also written to ``OUT/evaluation.json``.

Resumable: a re-run with the same ``out`` asks only for the samples a task still lacks (answers
already recorded count, failed requests do not and are asked again) and judges answers recorded
but not yet judged; the figures are over the first ``samples`` answers of each task.  A request
that fails (after the policy's own retries) is recorded with its error and not scored: the summary
says how many (``failed_requests``, ``complete``).

Not covered: the policy's sampling settings (temperature, top_p, max tokens) are the caller's;
the figures depend on them and are saved with the run (``OUT/config.yaml``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from cudal1.policy.base import Policy
from cudal1.recorded import RecordedJudge
from cudal1.train.evaluation.figures import Sample, figures
from cudal1.train.judging import RolloutJudge
from cudal1.types import Prompt, Task

log = logging.getLogger(__name__)

POLICY = "evaluate"  # the responses' policy label in the run store
ROUND = 1
SUMMARY = "evaluation.json"
STORE = "cudal1.sqlite"


def answered(judge: RecordedJudge, task: Task) -> list[dict[str, Any]]:
    """The evaluation's recorded answers of ``task`` (failed requests left out), oldest first."""
    return [r for r in judge.responses(task) if r["policy"] == POLICY and not r["error"]]


def samples_of(judge: RecordedJudge, tasks: list[Task], k: int) -> dict[str, list[Sample]]:
    """Each task's first ``k`` answers as :class:`Sample` values (a response without code is a
    format failure; an answer not judged yet is left out)."""
    out: dict[str, list[Sample]] = {}
    for task in tasks:
        rows = answered(judge, task)[:k]
        got = []
        for row in rows:
            if not row["candidate_hash"]:
                got.append(Sample("format"))
                continue
            res = judge.verdict_of(task.hash, row["candidate_hash"])
            if res is not None:
                got.append(Sample.of(res))
        out[task.task_id] = got
    return out


def run_evaluate(tasks: list[Task], policy: Policy, samples: int, judge: RecordedJudge, out: str | Path, *,
                 record: dict[str, Any] | None = None) -> dict[str, Any]:
    """Evaluate ``policy`` on ``tasks`` with ``samples`` one-shot answers each (see the module
    docstring), judging through ``judge`` (its store is ``OUT/cudal1.sqlite`` unless it has one).
    Returns the summary (also written to ``OUT/evaluation.json``)."""
    from cudal1.prompts import build_prompt

    if samples < 1:
        raise ValueError("evaluate needs at least one sample per task")
    if not tasks:
        raise ValueError("evaluate needs at least one task")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {"samples": samples, "judge": judge.config.to_dict(), **(record or {})}
    with judge.store_at(out / STORE), judge.run("evaluate", settings):
        for task in tasks:
            judge.add_task(task)
        pending = judge.pending(tasks)  # answers recorded by a run killed while judging
        if pending:
            judge.note(f"resuming: judging {len(pending)} recorded answer(s) first")
            judge.expect(len(pending))
            judge.judge(pending)
        prompts = {t.hash: build_prompt(t, [], judge.hardware) for t in tasks}
        slots = [t for t in tasks for _ in range(max(0, samples - len(answered(judge, t))))]
        have = len(tasks) * samples - len(slots)
        if have:
            judge.note(f"resuming: {have} of {len(tasks) * samples} answer(s) already recorded")
        judge.expect(len(slots))
        failed = _ask_and_judge(policy, judge, slots, prompts)
        by_task = samples_of(judge, tasks, samples)
        summary = figures(by_task, samples) | {
            "out": str(out), "store": str(out / STORE), "requests": len(slots), "failed_requests": failed,
            "judged": dict(Counter(s.kind for ss in by_task.values() for s in ss)), "config_hash": judge.config_hash,
        }
        (out / SUMMARY).write_text(json.dumps(summary, indent=1, default=str))
    return summary


def _ask_and_judge(policy: Policy, judge: RecordedJudge, slots: list[Task], prompts: dict[str, Prompt]) -> int:
    """One request per slot; answers judged in one batch, failed requests recorded.  Returns the
    number of failed requests."""
    if not slots:
        return 0
    batches = policy.generate([prompts[t.hash] for t in slots], 1)
    items, item_prompts, failed = [], [], 0
    for task, batch in zip(slots, batches):
        completion = batch[0] if batch else None
        error = "no completion" if completion is None else completion.error
        if error:
            failed += 1
            judge.record_response(
                task, ROUND, POLICY, dataclasses.asdict(prompts[task.hash]), "", "", None, error=error
            )
            judge.unjudged(task, f"request failed: {error}")
            continue
        items.append((task, completion.text))
        item_prompts.append(prompts[task.hash])
    if failed:
        log.warning("evaluate: %d of %d request(s) failed; a re-run with the same --out asks again", failed, len(slots))
    RolloutJudge(judge, POLICY).judge(items, round_=ROUND, prompts=item_prompts, label=POLICY)
    return failed


__all__ = ["POLICY", "SUMMARY", "answered", "run_evaluate", "samples_of"]
