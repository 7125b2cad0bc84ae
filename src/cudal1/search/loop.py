"""The contrastive search loop: prompt with measured exemplars, sample, judge, repeat.

Contract: :func:`optimize` runs rounds over every task of a suite concurrently (all prompts of
a round go to the policy in one call; all candidates of a round go to the judge in one batch, so
builds overlap timing across tasks).  Round 0 judges the reference itself (``ModelNew = Model``)
as the 1.00x anchor, in a batch of its own, or in round 1's batch when the policy's first round does
not read it (``first_round_blind``, :mod:`cudal1.policy.base`; the builtin policy) and no profile is
shown: one batch fewer, whose tail of idle lanes the anchors' short jobs fill.  With
``SearchConfig.anchor`` off there is no round 0: the reference counts as 1.00x without a verdict
(a policy that ranks against it compares with 1.0: :meth:`~cudal1.policy.base.PoolPrompt.above_reference`),
which saves each task one job (on the stride-5 sample, 185 of the builtin search's 1 151 s with
the GPU's lease held: H200, 2026-12-04) and the prompts their 1.00x exemplar.  All judging and
recording goes through one :class:`~cudal1.recorded.RecordedJudge`: every prompt sent, response
received, parse and verdict is in the run store before the next round, so a killed run resumes
where it stopped (same ``out`` dir): candidates sampled but not judged are judged first (with the
anchors), recorded evaluations are not re-run, and a round is sampled again only for the
completions it is missing — a generation that failed (the request failed after the policy's
retries) is asked again by the next run, an answer (usable or not, or a policy declining) is
not.  Only ``ok`` candidates of non-degenerate tasks become exemplars or "best"; failed ones are shown to the policy as
feedback when ``feedback`` is on.  Stops at ``rounds``, ``max_evaluations`` or the wall-clock
budget (checked between rounds; a round in flight finishes).  With ``profile`` on, the reference
is profiled once and each task's best candidate after every round (judged again with profiling,
only the profile kept: :meth:`~cudal1.recorded.RecordedJudge.profile_recorded`), and the prompts
show their measured section (:mod:`cudal1.prompts.measured`).

Outputs (:mod:`cudal1.search.outputs`): ``best/<task>.py`` (only a candidate measured faster
than the reference with confidence), ``candidates/<task>.py`` (a faster-looking candidate the
run could not confirm), ``summary.json`` (with ``generation``: requests, failures, retries) and
the resolved configuration ``OUT/config.yaml``.

Policies answer with text the loop parses (LLMs) or with a :class:`~cudal1.policy.base.Proposal`
whose code is taken as is (builtin); every prompt is a :class:`~cudal1.policy.base.PoolPrompt`
carrying the task's verified pool with the reference anchor marked.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cudal1.policy.base import Policy, PoolEntry, PoolPrompt, Proposal
from cudal1.recorded import RecordedJudge
from cudal1.search.config import SearchConfig
from cudal1.types import Candidate, Completion, Task, reference_candidate

log = logging.getLogger(__name__)

STORE = "cudal1.sqlite"  # the run store in OUT


def reference_class(profiles: dict[str, Any] | None) -> str:
    """The reference's measured class from a task's recorded profiles ("" when it has none or
    its profile is not ``ok``): what the builtin policy orders its passes by."""
    ref = (profiles or {}).get("reference")
    return ref.bound.value if ref is not None and ref.ok and ref.bound is not None else ""


def reference_work(profiles: dict[str, Any] | None) -> str:
    """What the reference's kernel time goes to (``conv``, ``gemm``, with ``+tail`` for a fusible
    elementwise chain; :func:`cudal1.profile.rules.work_of`) from its recorded profile, ``""``
    when it has none or its profile is not ``ok``."""
    from cudal1.profile.rules import work_of

    ref = (profiles or {}).get("reference")
    return work_of(ref.kernels) if ref is not None and ref.ok else ""


@dataclass(frozen=True)
class Reading:
    """What the loop takes from one completion."""

    code: str | None  # the candidate module, or None
    analysis: str = ""  # the model's analysis (or a proposal's account)
    problem: str = ""  # why there is no code (a parse failure, a policy declining)
    error: str = ""  # the generation failed (asked again by the next run)


def read_completion(comp: Completion) -> Reading:
    """A completion as the loop records it: a :class:`~cudal1.policy.base.Proposal` carries its
    code; LLM text is parsed; a declined request (``meta["declined"]``) is an answer without
    code, not a failure."""
    if comp.error:
        if comp.meta.get("declined"):
            return Reading(None, "", comp.error)
        return Reading(None, "", "", comp.error)
    if isinstance(comp, Proposal):
        return Reading(comp.code or None, comp.text, "" if comp.code else "proposal without code")
    from cudal1.prompts import parse_response

    parsed = parse_response(comp.text)
    return Reading(parsed.code, parsed.analysis, parsed.problem)


@dataclass
class Generation:
    """Requests to the policy in this run, for the summary and the CLI's exit status."""

    requested: int = 0
    failed: int = 0
    last_error: str = ""
    errors: dict[str, int] = field(default_factory=dict)  # error text (first line, truncated) -> count

    def add(self, error: str) -> None:
        self.requested += 1
        if error:
            self.failed += 1
            self.last_error = error
            key = error.splitlines()[0][:200]
            self.errors[key] = self.errors.get(key, 0) + 1


class Search:
    """State of one optimize run: the tasks, the policy, budgets; judging is ``judge``'s."""

    def __init__(self, tasks: list[Task], policy: Policy, cfg: SearchConfig, judge: RecordedJudge) -> None:
        self.tasks, self.policy, self.cfg, self.judge = tasks, policy, cfg, judge
        self.started = time.monotonic()
        self.generation = Generation()

    # ---- budgets ------------------------------------------------------------------------
    def evaluations(self) -> int:
        return sum(len(self.judge.results(t)) for t in self.tasks)

    def out_of_budget(self, coming: int = 0) -> str:
        """Why the search stops before the next round ("" to go on), counting ``coming``
        evaluations not yet judged (the anchors a blind round 1 takes along) as done."""
        if self.cfg.budget_minutes is not None and time.monotonic() - self.started > 60 * self.cfg.budget_minutes:
            return "wall-clock budget"
        if self.cfg.max_evaluations is not None and self.evaluations() + coming >= self.cfg.max_evaluations:
            return "evaluation budget"
        return ""

    # ---- rounds -------------------------------------------------------------------------
    def missing(self, task: Task, round_: int) -> int:
        """Completions round ``round_`` still lacks for ``task`` (failed generations included)."""
        answered = self.judge.round_counts(task).get(round_, (0, 0))[0]
        return max(self.cfg.samples - answered, 0)

    def prompts_for(self, task: Task, round_: int, k: int) -> list[PoolPrompt]:
        from cudal1.prompts import contrastive_prompt

        pool = self.judge.pool(task)
        anchor = reference_candidate(task).hash
        entries = tuple(PoolEntry(e.code, e.speedup, e.candidate_hash == anchor)  # type: ignore[arg-type]
                        for e in sorted(pool.ok, key=lambda e: e.speedup or 0.0))
        rng = random.Random(f"{self.cfg.seed}:{task.hash}:{round_}")
        prompts = []
        profiles = self.measured(task) if self.cfg.profile else None
        measured_class, measured_work = reference_class(profiles), reference_work(profiles)
        for _ in range(k):
            prompt = contrastive_prompt(
                task, pool.ok, pool.failed, self.judge.hardware, exemplars=self.cfg.exemplars,
                strategy=self.cfg.strategy, tau=self.cfg.tau, feedback=self.cfg.feedback, rng=rng,
                template=self.cfg.template, profiles=profiles,
            )
            prompts.append(PoolPrompt.of(prompt, task_source=task.source, pool=entries,
                                         reference_class=measured_class, reference_work=measured_work))
        return prompts

    def measured(self, task: Task) -> dict[str, Any]:
        """Recorded profiles of ``task``'s programs: candidate hash (or ``"reference"``, from the
        clean worker) -> ProgramProfile."""
        anchor = reference_candidate(task).hash
        out: dict[str, Any] = {}
        for cand, res in self.judge.results(task):
            if res.profile is None:
                continue
            if cand.hash == anchor:
                out["reference"] = res.profile.reference
            else:
                out[cand.hash] = res.profile.candidate
                out.setdefault("reference", res.profile.reference)
        return out

    def profile_best(self) -> int:
        """Profile the reference (once: it stays recorded) and each task's best candidate so far."""
        pairs = [(t, reference_candidate(t)) for t in self.tasks]
        pairs += [(t, best[0]) for t in self.tasks if (best := self.judge.best(t)) is not None]
        return self.judge.profile_recorded(pairs)

    def run_round(self, round_: int, wanted: dict[str, int],
                  with_pairs: list[tuple[Task, Candidate]] | None = None) -> int:
        """Sample and judge one round (``wanted``: task hash -> completions to request), with
        ``with_pairs`` (already proposed) in the same batch; returns the candidates judged."""
        prompts = [
            (t, p) for t in self.tasks if wanted.get(t.hash) for p in self.prompts_for(t, round_, wanted[t.hash])
        ]
        completions = self.policy.generate([p for _, p in prompts], 1)
        pairs: list[tuple[Task, Candidate]] = []
        for (task, prompt), batch in zip(prompts, completions):
            for comp in batch:
                got = read_completion(comp)
                self.generation.add(got.error)
                cand = None
                if got.code is not None:
                    cand = Candidate(got.code, task_hash=task.hash, label=f"{comp.policy}:r{round_}")
                    self.judge.propose(task, cand, {"round": round_, "policy": comp.policy, "model": comp.model,
                                                    "meta": comp.meta})
                    pairs.append((task, cand))
                else:
                    self.judge.unjudged(
                        task, f"generation failed: {got.error}" if got.error else f"no code: {got.problem}"
                    )
                self.judge.record_response(
                    task, round_, comp.policy, dataclasses.asdict(prompt), comp.text, got.analysis, cand,
                    problem=got.problem,
                    error=got.error,
                    usage=comp.usage,
                )
        if pairs or with_pairs:
            self.judge.judge(list(with_pairs or []) + pairs)
        return len(pairs)

    def anchors_in_round_one(self) -> bool:
        """Whether the anchors may be judged in round 1's batch: the policy's first round does
        not read their verdicts (``first_round_blind``, :mod:`cudal1.policy.base`) and no profile
        of the reference is shown to it."""
        return bool(getattr(self.policy, "first_round_blind", False)) and not self.cfg.profile


def optimize(tasks: list[Task], policy: Policy, search: SearchConfig, judge: RecordedJudge, out: str | Path, *,
             record: dict[str, Any] | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run (or resume) the search; writes ``best/``, ``summary.json`` and ``config.yaml`` (judge,
    search, policy and the ``record`` the caller gives, e.g. the target) under ``out`` and
    returns the summary (with the caller's ``extra`` keys).

    ``judge`` is the run's :class:`~cudal1.recorded.RecordedJudge`: its config, plan, hardware
    name, reviewer and event listener are the run's.  Its store is the run's when it has one (the
    caller closes it); otherwise ``OUT/cudal1.sqlite`` is opened for the run and closed at the end."""
    from cudal1.config import write_config_file
    from cudal1.policy.base import policy_settings

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with judge.store_at(out / STORE):
        write_config_file(out, judge=judge.config, search=search, policy=policy_settings(policy), run=record)
        return _search(Search(tasks, policy, search, judge), out, extra)


def _search(s: Search, out: Path, extra: dict[str, Any] | None) -> dict[str, Any]:
    from cudal1.search.outputs import write_outputs

    judge, tasks, search = s.judge, s.tasks, s.cfg
    with judge.run("optimize", {"judge_hash": judge.config_hash, "search": search.to_dict()}):
        stop = ""
        try:
            for t in tasks:
                judge.add_task(t)
            done = s.evaluations()
            if done:
                judge.note(f"resuming: {done} already judged")
            references = [(t, reference_candidate(t)) for t in tasks]
            anchors = references if search.anchor else []  # off: each reference counts as 1.00x unjudged
            pending = [p for p in judge.pending(tasks) if p not in references]
            # every slot this run settles, those read back from the store included (each anchor settles
            # once, judged or read back), so a progress display counts up to its total and no further
            judge.expect(
                len(anchors) + len(pending) + sum(s.missing(t, r) for t in tasks for r in range(1, search.rounds + 1))
            )
            if pending:  # sampled before a kill, not yet judged: judged before new rounds
                log.info("resuming: %d candidate(s) recorded but not judged", len(pending))
            # Anchors (never reviewed: RecordedJudge skips a task's reference) and the pending
            # candidates go first, in a batch of their own, unless round 1 may take them along.
            held = anchors + pending
            wanted = {t.hash: s.missing(t, 1) for t in tasks} if search.rounds >= 1 else {}
            coming = sum(1 for t, c in held if judge.verdict(t, c) is None)
            if not (s.anchors_in_round_one() and any(wanted.values()) and not s.out_of_budget(coming)):
                if held:
                    judge.judge(held)
                held = []
                if search.profile:
                    s.profile_best()
            for round_ in range(1, search.rounds + 1):
                stop = s.out_of_budget() if not held else ""
                if stop:
                    break
                wanted = {t.hash: s.missing(t, round_) for t in tasks}
                if any(wanted.values()) or held:
                    log.info("round %d: %d task(s)", round_, sum(1 for v in wanted.values() if v))
                    s.run_round(round_, wanted, held)
                    held = []
                    if search.profile:
                        s.profile_best()
        except KeyboardInterrupt:  # the outputs still say what was judged, and that the run was cut
            stop = "interrupted"
            raise
        finally:
            summary = write_outputs(s, out, stop, extra)
    return summary
