"""Evaluation during GRPO (``train grpo --eval-every N --eval-split held-out``): the same figures as
``cudal1 evaluate``, logged to ``OUT/metrics.jsonl`` as training goes.

Contract: :class:`EvalSet` holds the eval tasks and their one-shot prompts (no exemplars, as
``cudal1 evaluate`` asks them).  Its :meth:`~EvalSet.dataset` is TRL's ``eval_dataset``: every
``eval_every`` steps TRL's own evaluation loop generates ``eval_samples`` completions per task
(``num_generations_eval``; vLLM or transformers, every rank its share, as in training) and calls
the reward function, which recognises eval rows by their ``phase`` column and hands them to
:meth:`~EvalSet.score`: judged and recorded under the policy label ``grpo-eval`` (so they are
never confused with training rollouts, nor restore the reward's statistics on ``--resume``),
rewarded without touching the running statistics.  :func:`eval_callback` then gathers every
rank's samples (a collective) and rank 0 appends one line to ``metrics.jsonl``: ``stage`` ``eval``,
``step``, and :func:`cudal1.train.evaluation.figures.figures`'s keys (rates, pass@k, fast_p, best-of-k
speedups) without the per-task table.

The eval tasks are disjoint from the training tasks (:func:`~cudal1.train.stages.grpo.run_grpo` refuses
an overlap: eval rollouts of a trained task would join its exemplar pool and the figures would
measure training tasks).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cudal1.train import dist
from cudal1.train.evaluation.figures import Sample, figures
from cudal1.types import Prompt, Task

if TYPE_CHECKING:
    from cudal1.train.judging import RolloutJudge

EVAL_POLICY = "grpo-eval"
PHASE = "eval"


class EvalSet:
    """The eval tasks, their prompts, and the samples judged since the last evaluation."""

    def __init__(self, tasks: list[Task], samples: int, hardware: str = "CPU") -> None:
        from cudal1.prompts import build_prompt

        self.tasks = {t.task_id: t for t in tasks}
        self.prompts: dict[str, Prompt] = {t.task_id: build_prompt(t, [], hardware) for t in tasks}
        self.samples = samples
        self.judge: RolloutJudge | None = None  # labelled EVAL_POLICY, set by the trainer's set-up
        self._collected: dict[str, list[Sample]] = defaultdict(list)

    def dataset(self):
        """TRL's eval dataset: one row per task (TRL repeats each ``eval_samples`` times)."""
        from datasets import Dataset

        ids = list(self.tasks)
        return Dataset.from_dict(
            {"task": ids, "prompt": [self.prompts[i].messages() for i in ids], "phase": [PHASE] * len(ids)}
        )

    def score(self, task_ids: list[str], texts: list[str], step: int, reward: Any) -> list[float]:
        """Judge and record eval completions; rewards against the running statistics, unchanged."""
        import copy

        from cudal1.train.reward import shape_rewards

        assert self.judge is not None, "the trainer's set-up gives the eval set its judge"
        tasks = [self.tasks[t] for t in task_ids]
        verdicts = self.judge.judge(list(zip(tasks, texts)), round_=step, prompts=[self.prompts[t] for t in task_ids],
                                    label=f"{EVAL_POLICY}:s{step}")
        for task_id, (res, _) in zip(task_ids, verdicts):
            self._collected[task_id].append(Sample.of(res))
        self.judge.drain_counts()
        return shape_rewards([o for _, o in verdicts], copy.deepcopy(reward.stats), reward.cfg)

    def drain(self) -> dict[str, list[Sample]]:
        out, self._collected = dict(self._collected), defaultdict(list)
        return out


def gather_figures(evalset: EvalSet) -> dict[str, Any] | None:
    """Every rank's samples since the last call, merged (a collective); the figures, or None
    when nothing was sampled."""
    merged: dict[str, list[Sample]] = {t: [] for t in evalset.tasks}
    for part in dist.all_gather(evalset.drain()):
        for task_id, got in part.items():
            merged[task_id].extend(got)
    if not any(merged.values()):
        return None
    figs = figures(merged, evalset.samples)
    figs.pop("per_task", None)
    return figs


def eval_callback(evalset: EvalSet, out: str | Path):
    """A TrainerCallback: after each evaluation, the figures as one ``metrics.jsonl`` line (rank 0)."""
    from transformers import TrainerCallback

    path = Path(out) / "metrics.jsonl"

    class EvalWriter(TrainerCallback):
        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            figs = gather_figures(evalset)
            if figs is None or not state.is_world_process_zero:
                return
            rec = {"step": int(state.global_step), "stage": PHASE, **figs, "time": time.time()}
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as f:
                f.write(json.dumps(rec, default=str) + "\n")

    return EvalWriter()


__all__ = ["EVAL_POLICY", "PHASE", "EvalSet", "eval_callback", "gather_figures"]
