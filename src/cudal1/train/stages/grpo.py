"""Stage 3: contrastive GRPO with TRL's ``GRPOTrainer`` and the judge as the reward.

Contract: :func:`run_grpo` trains ``model`` (a local directory or hub name; TRL loads it by path,
and with β > 0 loads the frozen reference model from the same path) on ``tasks``:

* round 0 judges each task's reference (``ModelNew = Model``, the 1.00x anchor of the pool);
* prompts are contrastive and built when sampled, from the run store
  (:class:`~cudal1.train.stages.contrast.ContrastivePrompts`); each rollout is parsed, judged
  (:class:`~cudal1.train.judging.RolloutJudge`: cached by candidate hash, recorded in
  ``OUT/cudal1.sqlite``) and becomes part of the pool future prompts draw exemplars from;
* rewards are shaped by :func:`cudal1.train.reward.shape_rewards` (running statistics over
  successes, clipped at ±k; fixed negatives per failure; ``rejected`` lowest);
* ``OUT/metrics.jsonl`` gets one line per logged step: ``step``, ``loss``, ``reward_mean``,
  ``reward_std``, ``kl``, ``success_rate`` (share of rollouts ``ok`` with a usable speedup),
  ``judged`` (rollouts per outcome kind), ``evaluated`` (fresh judge runs), ``speedup_mean`` and
  ``speedup_max`` (of this step's successes), ``judge_s`` (seconds the step's reward spent
  judging: parsing, building, verifying and timing; the slowest rank's), and ``collapse`` while a collapse into answers
  without code is running (:mod:`.collapse`: ``collapse_steps`` steps in a row with at least
  ``collapse_share`` format failures; logged as a warning with the step it began, in the summary,
  and with ``collapse_stop`` the end of training).

``resume`` continues from the last ``OUT/checkpoint-N`` (TRL/transformers restore model,
optimizer, scheduler and RNG); the reward's running statistics are rebuilt from the rollouts the
store recorded, so normalisation continues where it was.

Several processes (``torchrun``/``accelerate launch``): every rank runs the trainer and judges
its own share of the rollouts (the judge spreads those over the GPUs it is given); TRL gathers the
rewards.  Rank 0 opens the run store first (creating it, WAL mode) and judges the references; the
others then open it and find those verdicts recorded.  All ranks write the one SQLite store
concurrently: :class:`~cudal1.store.RunStore` uses WAL, ``BEGIN IMMEDIATE`` write transactions
and a 30 s busy timeout, so writers queue instead of failing.  Rank 0 alone records the run
(``start_run``/``finish_run``), writes ``metrics.jsonl`` and saves.  Every key of a
``metrics.jsonl`` line is over all ranks' rollouts: ``success_rate``, ``judged``, ``evaluated``
and ``speedup_*`` are gathered from every rank at each logged step, ``reward_mean``/``reward_std``
are TRL's.

Not covered: judging is synchronous (generation waits for the verdicts of its batch).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from cudal1.recorded import RecordedJudge
from cudal1.train import dist, require_train
from cudal1.train.checkpoint import check_engine, last_checkpoint, save_final
from cudal1.train.common import check_model, cuda_or_cpu_kwargs, peft_config, trainer_arguments, world_size
from cudal1.train.config import GRPOConfig
from cudal1.train.evaluation.during_grpo import EVAL_POLICY, PHASE, EvalSet, eval_callback
from cudal1.train.judging import RolloutJudge, reference_candidate
from cudal1.train.metrics import metrics_callback, read_metrics
from cudal1.train.preflight import memory_shortfalls
from cudal1.train.reward import RewardConfig, RunningStats, outcome_of, shape_rewards
from cudal1.train.stages.collapse import CollapseWatch
from cudal1.train.stages.contrast import ContrastivePrompts
from cudal1.types import EvalResult, Status, Task

log = logging.getLogger(__name__)

POLICY = "grpo"


class JudgeReward:
    """TRL reward function: completions → judge → shaped rewards (a plain callable)."""

    __name__ = "judge"  # TRL names the reward's metrics after it

    def __init__(self, judge: RolloutJudge, contrast: ContrastivePrompts, cfg: RewardConfig, stats: RunningStats,
                 evalset: EvalSet | None = None, watch: CollapseWatch | None = None) -> None:
        self.judge, self.contrast, self.cfg, self.stats, self.evalset = judge, contrast, cfg, stats, evalset
        self.watch = watch
        self._speedups: list[float] = []
        self._rollouts = 0
        self._successes = 0
        self._evaluated_at_drain = 0
        self._judge_s = 0.0

    def __call__(self, prompts: list, completions: list, task: list[str], trainer_state: Any = None,
                 phase: list[str] | None = None, **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
        if phase and phase[0] == PHASE and self.evalset is not None:  # TRL's evaluation loop: eval rows
            return self.evalset.score(list(task), texts, int(getattr(trainer_state, "global_step", 0) or 0), self)
        started = time.perf_counter()
        _release_cached_memory()  # the judge's workers may share this GPU: give back the activations' cache first
        tasks = [self.contrast.tasks[t] for t in task]
        issued = [self.contrast.lookup(t, p) for t, p in zip(task, prompts)]
        step = int(getattr(trainer_state, "global_step", 0) or 0) + 1
        verdicts = self.judge.judge(list(zip(tasks, texts)), round_=step, prompts=issued, label=f"{POLICY}:s{step}")
        outcomes = [o for _, o in verdicts]
        rewards = shape_rewards(outcomes, self.stats, self.cfg)
        self._rollouts += len(outcomes)
        self._successes += sum(o.success for o in outcomes)
        self._speedups.extend(o.speedup for o in outcomes if o.success)  # type: ignore[misc]
        self._judge_s += time.perf_counter() - started
        return rewards

    def metrics(self, step: int = 0) -> dict[str, Any]:
        """Metrics since the previous call, over every rank's rollouts (a collective under several
        processes: every rank calls it at each logged step), merged into metrics.jsonl by the
        metrics callback; ``collapse`` when :attr:`watch` has seen one (see :mod:`.collapse`)."""
        mine = {"rollouts": self._rollouts, "successes": self._successes, "judged": self.judge.drain_counts(),
                "evaluated": self.judge.evaluated - self._evaluated_at_drain, "speedups": self._speedups,
                "judge_s": self._judge_s}
        self._speedups, self._rollouts, self._successes, self._judge_s = [], 0, 0, 0.0
        self._evaluated_at_drain = self.judge.evaluated
        parts = dist.all_gather(mine)
        rollouts = sum(p["rollouts"] for p in parts)
        judged: Counter[str] = Counter()
        for part in parts:
            judged.update(part["judged"])
        speedups = [s for p in parts for s in p["speedups"]]
        out = {
            "success_rate": sum(p["successes"] for p in parts) / rollouts if rollouts else None,
            "judged": dict(judged),
            "evaluated": sum(p["evaluated"] for p in parts),
            "speedup_mean": statistics.fmean(speedups) if speedups else None,
            "speedup_max": max(speedups) if speedups else None,
            "judge_s": round(max(p["judge_s"] for p in parts), 3),  # the ranks judge side by side: the slowest
        }
        found = self.watch.update(step, dict(judged)) if self.watch is not None else None
        if found is not None and dist.is_main():
            log.warning("grpo: %s", found.message())
        if self.watch is not None and self.watch.current is not None:
            out["collapse"] = self.watch.current.to_dict()
        return out


def _release_cached_memory() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def restore_stats(judge: RecordedJudge, stats: RunningStats, cfg: RewardConfig) -> int:
    """Replay the recorded GRPO rollouts' successes into ``stats`` (resume).  Returns how many."""
    pushed = 0
    for row in judge.responses():
        if row["policy"] != POLICY or not row["candidate_hash"]:
            continue
        res = judge.verdict_of(row["task_hash"], row["candidate_hash"])
        outcome = outcome_of(res) if res is not None else None
        if outcome is not None and outcome.success:
            stats.push([math.log(outcome.speedup) if cfg.log_speedup else outcome.speedup])  # type: ignore[arg-type]
            pushed += 1
    return pushed


def per_device_batch(cfg: GRPOConfig, processes: int) -> int:
    """Completions per device per micro-step so that one optimizer step sees
    ``group_size * prompts_per_step`` completions over all processes."""
    total = cfg.group_size * cfg.prompts_per_step
    div = processes * cfg.gradient_accumulation_steps
    if total % div:
        raise ValueError(f"group_size x prompts_per_step ({total}) must be divisible by processes x "
                         f"gradient_accumulation_steps ({processes} x {cfg.gradient_accumulation_steps})")
    return total // div


def grpo_arguments(cfg: GRPOConfig, out: str | Path, report_to: Any = "none", processes: int = 1,
                   eval_tasks: int = 0):
    """``trl.GRPOConfig`` from ``cfg`` for ``processes`` training processes (its ``trl:`` block
    passed through; see :func:`~cudal1.train.common.trainer_arguments`).  ``eval_tasks`` > 0 with
    ``cfg.eval_every`` turns on TRL's evaluation: ``eval_samples`` completions of each eval task
    every ``eval_every`` steps."""
    import trl

    if cfg.use_vllm and cfg.vllm_mode == "colocate" and processes % cfg.vllm_tensor_parallel_size:
        raise ValueError(f"grpo: vllm_tensor_parallel_size ({cfg.vllm_tensor_parallel_size}) must divide the number of "
                         f"training processes ({processes}) in colocate mode")
    ours: dict[str, Any] = dict(
        output_dir=str(out), num_generations=cfg.group_size,
        per_device_train_batch_size=per_device_batch(cfg, processes),
        gradient_accumulation_steps=cfg.gradient_accumulation_steps, max_steps=cfg.max_steps,
        learning_rate=cfg.learning_rate, beta=cfg.beta, epsilon=cfg.epsilon,
        num_iterations=cfg.num_iterations, loss_type=cfg.loss_type, scale_rewards=cfg.scale_rewards,
        temperature=cfg.temperature, top_p=cfg.top_p, max_completion_length=cfg.max_completion_length,
        use_vllm=cfg.use_vllm, logging_steps=cfg.logging_steps, save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit, seed=cfg.seed, report_to=report_to,
        remove_unused_columns=False,
    )
    if cfg.use_vllm:
        ours.update(
            vllm_mode=cfg.vllm_mode, vllm_gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
            vllm_tensor_parallel_size=cfg.vllm_tensor_parallel_size,
            vllm_max_model_length=cfg.vllm_max_model_length, vllm_server_base_url=cfg.vllm_server_base_url,
        )
    if cfg.eval_every and eval_tasks:
        ours.update(
            do_eval=True, eval_strategy="steps", eval_steps=cfg.eval_every,
            num_generations_eval=cfg.eval_samples,
            per_device_eval_batch_size=eval_batch(cfg.eval_samples, processes),
        )
    else:
        ours.update(eval_strategy="no")
    ours.update(cuda_or_cpu_kwargs(trl.GRPOConfig, cfg.bf16, cfg.gradient_checkpointing))
    defaults = dict(lr_scheduler_type="constant", save_strategy="steps", disable_tqdm=True, log_completions=False)
    return trainer_arguments(trl.GRPOConfig, ours, defaults, cfg.trl, "grpo")


def eval_batch(samples: int, processes: int) -> int:
    """Eval completions per device per step: the smallest count whose global batch
    (x ``processes``) holds whole groups of ``samples``."""
    import math

    return samples // math.gcd(samples, processes)


def judge_references(judge: RecordedJudge, tasks: list[Task]) -> list[EvalResult]:
    """Round 0: each task's reference as a candidate (the 1.00x exemplar)."""
    return judge.judge([(t, reference_candidate(t)) for t in tasks])


def run_grpo(model: str, tasks: list[Task], cfg: GRPOConfig, judge: RecordedJudge, out: str | Path, *,
             resume: bool = False, report_to: Any = "none", callbacks: tuple = (),
             eval_tasks: list[Task] | None = None, exemplars_from: list[str] | None = None,
             exemplars_per_task: int = 4, allow_held_out: bool = False,
             kernelbench: str | Path | None = None, rollout: Callable | None = None) -> dict[str, Any]:
    """Train ``model`` with GRPO on ``tasks`` into ``out`` (see the module docstring), judging
    through ``judge`` (its config, plan, hardware name and listener are the run's; its store is
    ``OUT/cudal1.sqlite`` unless it has one).  Returns a summary.
    ``callbacks``: more ``transformers.TrainerCallback`` objects for the trainer (e.g. a deadline).
    ``eval_tasks`` with ``cfg.eval_every``: evaluated every ``eval_every`` steps
    (:mod:`cudal1.train.evaluation.during_grpo`).
    ``exemplars_from``: earlier runs whose verified programs seed the exemplar pool, at most
    ``exemplars_per_task`` per task, judged here first (:mod:`.exemplars`).  Held-out training
    tasks are refused unless ``allow_held_out``, and ``eval_tasks`` must not be trained on
    (:mod:`cudal1.train.heldout`; ValueError, one line).  ``rollout``: TRL's ``rollout_func`` (its prompts and
    the trainer -> ``prompt_ids``, ``completion_ids``, ``logprobs``), to generate elsewhere than in
    the trainer — e.g. ``benchmarks/reward_loop.py``'s scripted OpenAI-compatible server."""
    require_train("cudal1 train grpo")
    from cudal1.train.heldout import HeldOut, overlap, refuse

    if not tasks:
        raise ValueError("grpo needs at least one task")
    if not allow_held_out:
        refuse(tasks, "train grpo", HeldOut.load(kernelbench))
    both = overlap(tasks, eval_tasks or [])
    if both:
        raise ValueError(
            f"train grpo: {len(both)} eval task(s) are also trained on ({', '.join(both[:3])}"
            f"{', ...' if len(both) > 3 else ''}): the eval split must be disjoint from the training suite"
        )
    check_model(model)
    out = Path(out)
    with dist.main_first():  # rank 0 creates the store (schema, WAL) before the others open it
        out.mkdir(parents=True, exist_ok=True)
        judge.open_store(out / "cudal1.sqlite")
    try:
        return _train(
            model, tasks, cfg, judge, out, resume=resume, report_to=report_to, callbacks=callbacks,
            eval_tasks=eval_tasks or [], seeds=(list(exemplars_from or []), exemplars_per_task),
            rollout=rollout,
        )
    finally:
        judge.close_store()


def _train(model: str, tasks: list[Task], cfg: GRPOConfig, judge: RecordedJudge, out: Path, *, resume: bool,
           report_to: Any, callbacks: tuple = (), eval_tasks: list[Task] = (), seeds: tuple[list[str], int] = ([], 4),
           rollout: Callable | None = None) -> dict[str, Any]:
    import trl
    from transformers import AutoTokenizer

    main = dist.is_main()
    settings = {
        "model": str(model), "grpo": _asdict(cfg), "judge": judge.config.to_dict(),
        "processes": dist.world_size(),
    }
    with judge.run("train-grpo", settings, record=main):
        rollouts = RolloutJudge(judge, POLICY)
        seeded = None
        with dist.main_first():  # the other ranks then find the references' (and seeds') verdicts in the store
            judge_references(judge, tasks)
            if seeds[0] and main:
                from cudal1.train.stages.exemplars import seed_pool

                seeded = seed_pool(judge, tasks, seeds[0], seeds[1])
        contrast = ContrastivePrompts(rollouts, tasks, exemplars=cfg.exemplars, strategy=cfg.strategy, tau=cfg.tau,
                                      feedback=cfg.feedback, hardware=judge.hardware, seed=cfg.seed)
        stats = RunningStats(cfg.reward.window)
        checkpoint = last_checkpoint(out) if resume else None
        if resume and checkpoint is None:
            log.warning("--resume: no checkpoint in %s; starting from the beginning", out)
        if checkpoint is not None:
            log.info("resuming from %s (%d recorded successes restore the reward statistics)", checkpoint,
                     restore_stats(judge, stats, cfg.reward))
        evalset = None
        if eval_tasks and cfg.eval_every:
            evalset = EvalSet(list(eval_tasks), cfg.eval_samples, judge.hardware)
            evalset.judge = RolloutJudge(judge, EVAL_POLICY)
        watch = CollapseWatch(cfg.collapse_share, cfg.collapse_steps)
        reward = JudgeReward(rollouts, contrast, cfg.reward, stats, evalset, watch)
        tokenizer = AutoTokenizer.from_pretrained(model)
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        args = grpo_arguments(cfg, out, report_to, world_size(), eval_tasks=len(evalset.tasks) if evalset else 0)
        short = memory_shortfalls(str(model), cfg, args, judge.config, judge.plan, world_size())
        for line in short if main else []:
            log.warning("grpo: memory estimate (cudal1/train/recipes.py): %s", line)
        trainer = trl.GRPOTrainer(
            model=str(model), reward_funcs=[reward], args=args, rollout_func=rollout,
            train_dataset=contrast.dataset(max(cfg.prompts_per_step, len(tasks)) * 16),
            processing_class=tokenizer,
            eval_dataset=evalset.dataset() if evalset else None,
            peft_config=peft_config(cfg.lora, cfg.lora_config),
            callbacks=[
                metrics_callback(out, "grpo", reward.metrics),
                *([eval_callback(evalset, out)] if evalset else []),
                *([collapse_stop(watch)] if cfg.collapse_stop else []), *callbacks,
            ],
        )
        check_engine(trainer)
        result = trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        save_final(trainer, out, tokenizer)
    return summarize(out, judge, tasks) | {
        "steps": int(result.global_step), "seeded": seeded, "resumed_from": str(checkpoint) if checkpoint else None,
        "collapses": [c.to_dict() for c in watch.reported], "memory_shortfalls": short}


def collapse_stop(watch: CollapseWatch):
    """A TrainerCallback ending training at the step a collapse is reported (``collapse_stop``).
    After the metrics callback in the trainer's list: it reads what that step's metrics fed the watch."""
    from transformers import TrainerCallback

    class CollapseStop(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if watch.current is not None:
                control.should_training_stop = True
            return control

    return CollapseStop()


def summarize(out: Path, judge: RecordedJudge, tasks: list[Task]) -> dict[str, Any]:
    rows = [m for m in read_metrics(out) if m.get("stage") == "grpo"]
    best = {}
    for t in tasks:
        speedups = [r.speedup for _, r in judge.results(t) if r.status is Status.OK and r.speedup is not None]
        best[t.task_id] = max(speedups) if speedups else None
    evals = sorted((m for m in read_metrics(out) if m.get("stage") == "eval"), key=lambda m: m["step"])
    return {
        "out": str(out), "reward_mean": [r.get("reward_mean") for r in rows],
        "success_rate": [r.get("success_rate") for r in rows], "best_speedup": best,
        "judged": judge.status_counts(),
        "eval": [{k: v for k, v in m.items() if k not in ("time", "stage")} for m in evals],
    }


def _asdict(cfg: GRPOConfig) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(cfg)
