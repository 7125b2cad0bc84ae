"""Judging rollouts for training: parse, judge through the harness's front door, record everything.

Contract: :class:`RolloutJudge` turns ``(task, response text)`` pairs into
``(EvalResult | None, Outcome)`` — ``None`` when the response has no usable code (a format
failure; :func:`cudal1.prompts.parse_response` decides).  Every response is recorded in the run
store (``responses`` table: prompt, text, parse; ``candidates``; ``evaluations``), so each
rollout can become an exemplar and a killed run loses nothing that was judged.  Verdicts are
cached by ``(task hash, candidate hash, judge config hash)``: in memory, and through the run
store (``evaluate_pairs`` returns a recorded verdict instead of re-running), so identical
completions — frequent once a policy converges — cost one evaluation.

Not covered: a verdict cached from earlier in the run is reused as is, including its timing
noise (a lucky timing keeps its reward).  That is the price of not re-judging; the judge's
confidence interval is in the stored result for anyone who wants to be stricter.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Any, Callable

from cudal1.config import EvalConfig
from cudal1.store import RunStore
from cudal1.train.reward import FORMAT, Outcome, outcome_of
from cudal1.types import Candidate, EvalResult, Exemplar, Prompt, Status, Task, reference_candidate


def _feedback(result: EvalResult, limit: int = 1500) -> str:
    text = result.compile_log if result.status is Status.COMPILE_ERROR and result.compile_log else result.message
    return text[-limit:]


class RolloutJudge:
    """Parses, judges and records rollouts (see the module docstring)."""

    def __init__(self, store: RunStore, config: EvalConfig, *, plan: Any = None, policy: str = "train",
                 on_result: Callable[[EvalResult], None] | None = None) -> None:
        self.store, self.config, self.plan, self.policy, self.on_result = store, config, plan, policy, on_result
        self.config_hash = config.hash()
        self._cache: dict[tuple[str, str], EvalResult] = {}
        self.counts: Counter[str] = Counter()  # outcome kinds judged since the last drain
        self.evaluated = 0  # evaluations actually run (cache misses)

    def drain_counts(self) -> dict[str, int]:
        out, self.counts = dict(self.counts), Counter()
        return out

    def judge(self, items: list[tuple[Task, str]], *, round_: int = 0, prompts: list[Prompt | None] | None = None,
              label: str = "") -> list[tuple[EvalResult | None, Outcome]]:
        """Judge ``(task, response)`` pairs; results in input order."""
        from cudal1.prompts import parse_response
        from cudal1.runs import judge_recorded

        prompts = prompts or [None] * len(items)
        cands: list[Candidate | None] = []
        for (task, text), prompt in zip(items, prompts):
            parsed = parse_response(text)
            cand = Candidate(parsed.code, task_hash=task.hash, label=label or self.policy) if parsed.code else None
            if cand is not None:
                self.store.add_candidate(cand, task.hash, {"round": round_, "policy": self.policy})
            prompt_d = dataclasses.asdict(prompt) if prompt is not None else {}
            self.store.record_response(task.hash, round_, self.policy, prompt_d, text, parsed.analysis,
                                       cand.hash if cand else None, problem=parsed.problem)
            cands.append(cand)
        todo: dict[tuple[str, str], tuple[Task, Candidate]] = {}
        for (task, _), cand in zip(items, cands):
            if cand is not None and (task.hash, cand.hash) not in self._cache:
                todo.setdefault((task.hash, cand.hash), (task, cand))
        if todo:
            pairs = list(todo.values())
            fresh = sum(not self.store.has_evaluation(t.hash, c.hash, self.config_hash) for t, c in pairs)
            results = judge_recorded(pairs, self.config, store=self.store, plan=self.plan, on_result=self.on_result)
            self.evaluated += fresh
            for key, res in zip(todo, results):
                self._cache[key] = res
        out = []
        for (task, _), cand in zip(items, cands):
            res = self._cache[(task.hash, cand.hash)] if cand is not None else None
            outcome = outcome_of(res)
            self.counts[outcome.kind] += 1
            out.append((res, outcome))
        return out

    # ---- the exemplar pool --------------------------------------------------------------
    def pool(self, task: Task) -> tuple[list[Exemplar], list[Exemplar]]:
        """(successful exemplars, failed ones) of ``task`` judged under this config, oldest first.
        Empty when the task is degenerate (no speedup on it means anything)."""
        pairs = []
        for cand in self.store.candidates(task.hash):
            res = self._cache.get((task.hash, cand.hash)) or self.store.get_evaluation(task.hash, cand.hash, self.config_hash)
            if res is not None:
                pairs.append((cand, res))
        if any("degenerate_task" in r.flags for _, r in pairs):
            return [], []
        ok = [Exemplar(c.source, r.speedup, "ok", "", c.hash) for c, r in pairs
              if r.status is Status.OK and r.speedup is not None and math.isfinite(r.speedup)]
        failed = [Exemplar(c.source, None, r.status.value, _feedback(r), c.hash) for c, r in pairs
                  if r.status is not Status.OK]
        return ok, failed


__all__ = ["FORMAT", "RolloutJudge", "reference_candidate"]
