"""Judging rollouts for training: parse, then judge and record through the one recorded-judging seam.

Contract: :class:`RolloutJudge` turns ``(task, response text)`` pairs into
``(EvalResult | None, Outcome)`` — ``None`` when the response has no usable code (a format
failure; :func:`cudal1.prompts.parse_response` decides).  Every response is recorded in the run
store (``responses`` table: prompt, text, parse; ``candidates``; ``evaluations``), so each
rollout can become an exemplar and a killed run loses nothing that was judged.  Judging,
recording, the verdict cache and the exemplar pool are :class:`~cudal1.recorded.RecordedJudge`'s
(``self.recorded``): verdicts are cached by ``(task hash, candidate hash, judge config hash)`` in
memory and through the run store, so identical completions — frequent once a policy converges —
cost one evaluation.

Not covered: a verdict cached from earlier in the run is reused as is, including its timing
noise (a lucky timing keeps its reward).  That is the price of not re-judging; the judge's
confidence interval is in the stored result for anyone who wants to be stricter.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Callable

from cudal1.config import EvalConfig
from cudal1.recorded import JudgeEvent, RecordedJudge
from cudal1.store import RunStore
from cudal1.train.reward import FORMAT, Outcome, outcome_of
from cudal1.types import Candidate, EvalResult, Exemplar, Prompt, Task, reference_candidate


class RolloutJudge:
    """Parses rollouts and hands them to a :class:`~cudal1.recorded.RecordedJudge` (see the module docstring)."""

    def __init__(self, store: RunStore, config: EvalConfig, *, plan: Any = None, policy: str = "train",
                 on_result: Callable[[EvalResult], None] | None = None,
                 on_event: Callable[[JudgeEvent], None] | None = None) -> None:
        """``on_result`` gets each fresh verdict; ``on_event`` (instead) every event of the
        :class:`~cudal1.recorded.RecordedJudge`, responses without code as ``unjudged``."""
        self.store, self.config, self.plan, self.policy, self.on_result = store, config, plan, policy, on_result
        if on_event is None and on_result is not None:
            on_event = lambda e: on_result(e.result) if e.kind == "verdict" else None  # noqa: E731
        self.recorded = RecordedJudge(config, store, plan=plan, on_event=on_event)
        self.config_hash = self.recorded.config_hash
        self.counts: Counter[str] = Counter()  # outcome kinds judged since the last drain

    @property
    def evaluated(self) -> int:
        """Evaluations actually run (not read back from the cache or the store)."""
        return self.recorded.judged

    def drain_counts(self) -> dict[str, int]:
        out, self.counts = dict(self.counts), Counter()
        return out

    def judge(self, items: list[tuple[Task, str]], *, round_: int = 0, prompts: list[Prompt | None] | None = None,
              label: str = "") -> list[tuple[EvalResult | None, Outcome]]:
        """Judge ``(task, response)`` pairs; results in input order."""
        from cudal1.prompts import check_analysis, parse_response

        prompts = prompts or [None] * len(items)
        cands: list[Candidate | None] = []
        scores: list[float] = []
        for (task, text), prompt in zip(items, prompts):
            parsed = parse_response(text)
            check = check_analysis(parsed.analysis, prompt.user if prompt is not None else "")
            scores.append(check.score)
            cand = Candidate(parsed.code, task_hash=task.hash, label=label or self.policy) if parsed.code else None
            if cand is not None:  # the check travels with the candidate (its first response's, for a repeated program)
                self.recorded.propose(task, cand, {"round": round_, "policy": self.policy, "analysis_check": check.to_dict()})
            prompt_d = dataclasses.asdict(prompt) if prompt is not None else {}
            self.recorded.record_response(task, round_, self.policy, prompt_d, text, parsed.analysis, cand,
                                          problem=parsed.problem)
            if cand is None:
                self.recorded.unjudged(task, parsed.problem or "no usable code")
            cands.append(cand)
        pairs = [(task, cand) for (task, _), cand in zip(items, cands) if cand is not None]
        verdicts = iter(self.recorded.judge(pairs) if pairs else [])
        out = []
        for cand, score in zip(cands, scores):
            res = next(verdicts) if cand is not None else None
            outcome = dataclasses.replace(outcome_of(res), analysis=score)
            self.counts[outcome.kind] += 1
            out.append((res, outcome))
        return out

    # ---- the exemplar pool --------------------------------------------------------------
    def pool(self, task: Task) -> tuple[list[Exemplar], list[Exemplar]]:
        """(successful exemplars, failed ones) of ``task`` judged under this config, oldest first.
        Empty when the task is degenerate (no speedup on it means anything)."""
        pool = self.recorded.pool(task)
        return pool.ok, pool.failed


__all__ = ["FORMAT", "RolloutJudge", "reference_candidate"]
