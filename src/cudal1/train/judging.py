"""Judging rollouts for training: parse, then judge and record through the run's recorded judge.

Contract: :class:`RolloutJudge` turns ``(task, response text)`` pairs into
``(EvalResult | None, Outcome)`` — ``None`` when the response has no usable code (a format
failure; :func:`cudal1.prompts.parse_response` decides).  Every response is recorded in the run
store under the rollout judge's policy label (``responses`` table: prompt, text, parse;
``candidates``; ``evaluations``), so each rollout can become an exemplar and a killed run loses
nothing that was judged.  Judging, recording, the verdict cache and the exemplar pool are the
run's :class:`~cudal1.recorded.RecordedJudge`'s, which several rollout judges of one run share
(GRPO's training and evaluation rollouts, collect's teachers): verdicts are cached by
``(task hash, candidate hash, judge config hash)`` in memory and through the run store, so
identical completions — frequent once a policy converges — cost one evaluation.

Not covered: a verdict cached from earlier in the run is reused as is, including its timing
noise (a lucky timing keeps its reward).  That is the price of not re-judging; the judge's
confidence interval is in the stored result for anyone who wants to be stricter.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from cudal1.recorded import RecordedJudge
from cudal1.train.reward import FORMAT, Outcome, outcome_of
from cudal1.types import Candidate, EvalResult, Exemplar, Prompt, Task, reference_candidate


class RolloutJudge:
    """Parses rollouts and hands them to the run's :class:`~cudal1.recorded.RecordedJudge`
    under the policy label ``policy`` (see the module docstring)."""

    def __init__(self, recorded: RecordedJudge, policy: str = "train") -> None:
        self.recorded, self.policy = recorded, policy
        self.config_hash = recorded.config_hash
        self.counts: Counter[str] = Counter()  # outcome kinds judged since the last drain
        self.evaluated = 0  # evaluations this rollout judge ran (not read back from the cache or the store)

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
                self.recorded.propose(
                    task, cand, {"round": round_, "policy": self.policy, "analysis_check": check.to_dict()}
                )
            prompt_d = dataclasses.asdict(prompt) if prompt is not None else {}
            self.recorded.record_response(task, round_, self.policy, prompt_d, text, parsed.analysis, cand,
                                          problem=parsed.problem)
            if cand is None:
                self.recorded.unjudged(task, parsed.problem or "no usable code")
            cands.append(cand)
        pairs = [(task, cand) for (task, _), cand in zip(items, cands) if cand is not None]
        before = self.recorded.judged
        verdicts = iter(self.recorded.judge(pairs) if pairs else [])
        self.evaluated += self.recorded.judged - before
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
