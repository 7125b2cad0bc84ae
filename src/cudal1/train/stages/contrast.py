"""Contrastive prompts built at sampling time from the run store (GRPO's dataset).

Contract: :class:`ContrastivePrompts` renders a task's prompt from its *current* pool of judged
programs (the reference anchor and every rollout judged so far, under the run's judge config),
with the optimizer's prompt builder (:func:`cudal1.prompts.contrastive_prompt`) — so the
exemplars improve as training finds faster code.  :meth:`dataset` returns a ``datasets.Dataset``
of task ids whose ``prompt`` column is computed on access (``set_transform``);
TRL's sampler repeats each row ``group_size`` times within one fetch, and every repetition of a
task within that fetch gets the same prompt, so a GRPO group shares its prompt.  The exemplar draw
is seeded by the run seed, the task, the pool's size and the fetch number: every fetch draws
afresh.  (Seeded by the pool alone, a prompt stayed the same for as long as the pool did — and a
pool stops changing when every rollout is a format failure, which is never judged: one prompt the
policy could not answer then held a GRPO smoke at reward -2.0 for ten steps.)

Limits: prompts are built when the trainer's data loader fetches a generation batch, which
``accelerate`` does one batch ahead — exemplars lag the newest verdicts by one generation batch.
In multi-process runs each rank builds its prompts from the shared store; a rank that reads
the store while another is recording may show a group different exemplars for the same task
(same task and reference; documented in docs/training.md).
"""

from __future__ import annotations

import random
from typing import Any

from cudal1.prompts import contrastive_prompt
from cudal1.train.judging import RolloutJudge
from cudal1.types import Prompt, Task


class ContrastivePrompts:
    """Builds each task's prompt from the judge's pool (see the module docstring)."""

    def __init__(self, judge: RolloutJudge, tasks: list[Task], *, exemplars: int = 2, strategy: str = "contrastive",
                 tau: float = 1.0, feedback: bool = False, hardware: str = "CPU", seed: int = 0) -> None:
        self.judge, self.exemplars, self.strategy, self.tau = judge, exemplars, strategy, tau
        self.feedback, self.hardware, self.seed = feedback, hardware, seed
        self.tasks = {t.task_id: t for t in tasks}
        self.issued: dict[tuple[str, str], Prompt] = {}  # (task id, user text) -> Prompt, for recording
        self.fetches = 0  # data-loader fetches so far (every rank fetches alike)

    def prompt(self, task: Task, fetch: int = 0) -> Prompt:
        """``task``'s prompt for data-loader fetch number ``fetch``: exemplars drawn afresh for each
        fetch (and each state of the pool), the same on every rank that fetches the same task."""
        ok, failed = self.judge.pool(task)
        rng = random.Random(f"{self.seed}:{task.hash}:{len(ok)}:{len(failed)}:{fetch}")
        prompt = contrastive_prompt(task, ok, failed, self.hardware, exemplars=self.exemplars, strategy=self.strategy,
                                    tau=self.tau, feedback=self.feedback, rng=rng)
        if len(self.issued) > 4096:  # bounded: only the recent ones are looked up
            self.issued.clear()
        self.issued[(task.task_id, prompt.user)] = prompt
        return prompt

    def lookup(self, task_id: str, messages: Any) -> Prompt | None:
        """The :class:`Prompt` issued for ``task_id`` whose user message is in ``messages``."""
        user = next((m.get("content") for m in messages or [] if isinstance(m, dict) and m.get("role") == "user"), None)
        return self.issued.get((task_id, user)) if user is not None else None

    def transform(self, batch: dict[str, list]) -> dict[str, list]:
        built: dict[str, Prompt] = {}  # one prompt per task per fetch: a group shares it
        prompts = []
        self.fetches += 1
        for task_id in batch["task"]:
            if task_id not in built:
                built[task_id] = self.prompt(self.tasks[task_id], self.fetches)
            prompts.append(built[task_id].messages())
        return {"task": list(batch["task"]), "prompt": prompts}

    def dataset(self, rows: int):
        """A ``datasets.Dataset`` of ``rows`` task ids (cycling over the tasks) with computed prompts."""
        from datasets import Dataset

        ids = list(self.tasks)
        ds = Dataset.from_dict({"task": [ids[i % len(ids)] for i in range(max(rows, len(ids)))]})
        ds.set_transform(self.transform)
        return ds
