"""The contrastive search loop: prompt with measured exemplars, sample, judge, repeat.

Contract: :func:`optimize` runs rounds over every task of a suite concurrently (all prompts of
a round go to the policy in one call; all candidates of a round go to the judge in one batch, so
builds overlap timing across tasks).  Round 0 judges the reference itself (``ModelNew = Model``)
as the 1.00x anchor.  Every prompt sent, response received, parse and verdict is recorded in the
run store before the next round, so a killed run resumes where it stopped (same ``out`` dir):
finished rounds are not re-sampled, recorded evaluations are not re-run, and candidates sampled
but not judged when the run died are judged first.  Only ``ok``
candidates of non-degenerate tasks become exemplars or "best"; failed ones are shown to the
policy as feedback when ``feedback`` is on.  Stops at ``rounds``, ``max_evaluations`` or the
wall-clock budget (checked between rounds; a round in flight finishes).  The resolved
configuration (judge, search, policy) is saved as ``OUT/config.yaml`` next to ``summary.json``.

Policies answer with text the loop parses (LLMs) or with a :class:`~cudal1.policy.base.Proposal`
whose code is taken as is (builtin); every prompt is a :class:`~cudal1.policy.base.PoolPrompt`
carrying the task's verified pool with the reference anchor marked.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from cudal1.figures import geomean
from cudal1.config import EvalConfig
from cudal1.search.config import SearchConfig
from cudal1.policy.base import PoolEntry, PoolPrompt, Proposal, policy_settings
from cudal1.store import RunStore
from cudal1.types import Candidate, Completion, EvalResult, Exemplar, Status, Task, reference_candidate

log = logging.getLogger(__name__)


def read_completion(comp: Completion) -> tuple[str | None, str, str]:
    """(candidate code or None, analysis, why there is no code) of one completion: a
    :class:`~cudal1.policy.base.Proposal` carries its code; LLM text is parsed."""
    if comp.error:
        return None, "", comp.error
    if isinstance(comp, Proposal):
        return (comp.code or None), comp.text, "" if comp.code else "proposal without code"
    from cudal1.prompts import parse_response

    parsed = parse_response(comp.text)
    return parsed.code, parsed.analysis, parsed.problem


def _feedback(result: EvalResult, limit: int = 1500) -> str:
    text = result.compile_log if result.status is Status.COMPILE_ERROR and result.compile_log else result.message
    return text[-limit:]


class Search:
    """State of one optimize run (store, policy, budgets)."""

    def __init__(self, tasks: list[Task], policy: Any, search: SearchConfig, judge: EvalConfig, out: Path,
                 hardware: str, plan: Any = None, on_result: Callable[[EvalResult], None] | None = None,
                 reviewer: Callable[[Task, Candidate], str | None] | None = None) -> None:
        self.tasks, self.policy, self.cfg, self.judge = tasks, policy, search, judge
        self.out, self.hardware, self.plan, self.on_result = out, hardware, plan, on_result
        self.reviewer = reviewer
        self.store = RunStore(out / "cudal1.sqlite")
        self.started = time.monotonic()

    # ---- pool ---------------------------------------------------------------------------
    def results(self, task: Task) -> list[tuple[Candidate, EvalResult]]:
        config_hash = self.judge.hash()
        out = []
        for cand in self.store.candidates(task.hash):
            res = self.store.get_evaluation(task.hash, cand.hash, config_hash)
            if res is not None:
                out.append((cand, res))
        return out

    @staticmethod
    def degenerate(pairs: list[tuple[Candidate, EvalResult]]) -> bool:
        return any("degenerate_task" in r.flags for _, r in pairs)

    def pool(self, task: Task) -> tuple[list[Exemplar], list[Exemplar]]:
        """(successful exemplars, failed ones for feedback) of ``task``."""
        pairs = self.results(task)
        if self.degenerate(pairs):
            return [], []
        ok = [Exemplar(c.source, r.speedup, r.status.value, "", c.hash) for c, r in pairs
              if r.status is Status.OK and r.speedup is not None]
        failed = [Exemplar(c.source, None, r.status.value, _feedback(r), c.hash) for c, r in pairs if r.status is not Status.OK]
        return ok, failed

    # ---- budgets ------------------------------------------------------------------------
    def evaluations(self) -> int:
        return sum(len(self.results(t)) for t in self.tasks)

    def out_of_budget(self) -> str:
        if self.cfg.budget_minutes is not None and time.monotonic() - self.started > 60 * self.cfg.budget_minutes:
            return "wall-clock budget"
        if self.cfg.max_evaluations is not None and self.evaluations() >= self.cfg.max_evaluations:
            return "evaluation budget"
        return ""

    # ---- rounds -------------------------------------------------------------------------
    def judge_pairs(self, pairs: list[tuple[Task, Candidate]], review: bool = True) -> list[EvalResult]:
        from cudal1.runs import judge_recorded

        return judge_recorded(pairs, self.judge, store=self.store, plan=self.plan, on_result=self.on_result,
                              reviewer=self.reviewer if review else None)

    def prompts_for(self, task: Task, round_: int) -> list[PoolPrompt]:
        from cudal1.prompts import build_prompt, failed_feedback, select_exemplars

        ok, failed = self.pool(task)
        anchor = reference_candidate(task).hash
        pool = tuple(PoolEntry(e.code, e.speedup, e.candidate_hash == anchor)  # type: ignore[arg-type]
                     for e in sorted(ok, key=lambda e: e.speedup or 0.0))
        rng = random.Random(f"{self.cfg.seed}:{task.hash}:{round_}")
        prompts = []
        for _ in range(self.cfg.samples):
            shown = select_exemplars(ok, self.cfg.exemplars, self.cfg.strategy, rng=rng, temperature=self.cfg.tau)
            if self.cfg.feedback and failed:
                shown = list(failed_feedback(failed, 1, rng)) + list(shown)
            prompt = build_prompt(task, shown, self.hardware, feedback=self.cfg.feedback, template=self.cfg.template)
            prompts.append(PoolPrompt.of(prompt, task_source=task.source, pool=pool))
        return prompts

    def run_round(self, round_: int, active: list[Task]) -> int:
        """Sample and judge one round for ``active`` tasks; returns candidates judged."""
        prompts = [(t, p) for t in active for p in self.prompts_for(t, round_)]
        completions = self.policy.generate([p for _, p in prompts], 1)
        pairs: list[tuple[Task, Candidate]] = []
        for (task, prompt), batch in zip(prompts, completions):
            for comp in batch:
                code, analysis, problem = read_completion(comp)
                cand = None
                if code is not None:
                    cand = Candidate(code, task_hash=task.hash, label=f"{comp.policy}:r{round_}")
                    self.store.add_candidate(cand, task.hash, {"round": round_, "policy": comp.policy, "model": comp.model,
                                                               "meta": comp.meta})
                    pairs.append((task, cand))
                self.store.record_response(task.hash, round_, comp.policy, dataclasses.asdict(prompt), comp.text,
                                           analysis, cand.hash if cand else None,
                                           problem=problem if cand is None else "", error=comp.error, usage=comp.usage)
        if pairs:
            self.judge_pairs(pairs)
        return len(pairs)

    def pending(self) -> list[tuple[Task, Candidate]]:
        """Candidates recorded but never judged under this judge config (a run killed mid-round)."""
        config_hash = self.judge.hash()
        return [(t, c) for t in self.tasks for c in self.store.candidates(t.hash)
                if not self.store.has_evaluation(t.hash, c.hash, config_hash)]

    def best(self, task: Task) -> tuple[Candidate, EvalResult] | None:
        pairs = self.results(task)
        if self.degenerate(pairs):
            return None
        anchor = reference_candidate(task).hash  # the reference itself is never "best"
        ok = [(c, r) for c, r in pairs if r.status is Status.OK and r.speedup is not None and c.hash != anchor]
        return max(ok, key=lambda cr: cr[1].speedup) if ok else None


def optimize(tasks: list[Task], policy: Any, search: SearchConfig, judge: EvalConfig, out: str | Path, *,
             hardware: str = "CPU", plan: Any = None, on_result: Callable[[EvalResult], None] | None = None,
             reviewer: Callable[[Task, Candidate], str | None] | None = None) -> dict[str, Any]:
    """Run (or resume) the search; writes ``best/`` and ``summary.json`` under ``out``.
    ``reviewer``: optional second opinion on accepted candidates (see ``cudal1.policy.reviewer``)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    s = Search(tasks, policy, search, judge, out, hardware, plan, on_result, reviewer)
    run_id = s.store.start_run("optimize", write_config(out, search, judge, policy))
    status, stop = "done", ""
    try:
        for t in tasks:
            s.store.add_task(t)
        s.judge_pairs([(t, reference_candidate(t)) for t in tasks], review=False)
        pending = s.pending()  # sampled before a kill, not yet judged: judge them before new rounds
        if pending:
            log.info("resuming: %d candidate(s) recorded but not judged", len(pending))
            s.judge_pairs(pending)
        for round_ in range(1, search.rounds + 1):
            stop = s.out_of_budget()
            if stop:
                break
            active = [t for t in tasks if s.store.last_round(t.hash) < round_]
            if active:
                log.info("round %d: %d task(s)", round_, len(active))
                s.run_round(round_, active)
    except BaseException:
        status = "interrupted"
        raise
    finally:
        summary = write_outputs(s, stop)
        s.store.finish_run(run_id, status)
        s.store.close()
    return summary


def write_config(out: Path, search: SearchConfig, judge: EvalConfig, policy: Any) -> dict[str, Any]:
    """``OUT/config.yaml``: the fully resolved configuration of this run (judge, search, policy;
    never an API key), next to ``summary.json``; returned as saved.  A resumed run rewrites it."""
    from cudal1.config import write_config_file

    return write_config_file(out, judge=judge, search=search, policy=policy_settings(policy))


def write_outputs(s: Search, stop: str) -> dict[str, Any]:
    """``best/<task>.py`` for each task with a verified candidate, and ``summary.json``."""
    best_dir = s.out / "best"
    best_dir.mkdir(exist_ok=True)
    rows = []
    environment: dict[str, Any] = {}
    for task in s.tasks:
        pairs = s.results(task)
        statuses: dict[str, int] = {}
        for _, r in pairs:
            statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
            environment = environment or dataclasses.asdict(r.environment)
        best = s.best(task)
        path = None
        if best is not None:
            path = best_dir / f"{task.task_id.replace('/', '_')}.py"
            path.write_text(best[0].source)
        rows.append({"task": task.task_id, "best_speedup": best[1].speedup if best else None,
                     "best_path": str(path) if path else None, "evaluated": len(pairs), "statuses": statuses,
                     "degenerate": Search.degenerate(pairs)})
    summary = {"tasks": rows, "environment": environment, "stopped_by": stop or "rounds",
               "geomean_best_speedup": geomean([r["best_speedup"] for r in rows])}
    (s.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


