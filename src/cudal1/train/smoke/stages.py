"""``--smoke``: every stage end to end on a CPU in minutes, with no other argument and no download.

Each function builds what it needs under ``out`` — a tiny two-layer Qwen2 model from a config with
a BPE tokenizer trained on the spot (:mod:`.tiny`), the bundled ``diag_scale`` task and its
programs (:mod:`cudal1.train.smoke`) — and runs the real stage: TRL's trainers and the judge's subprocesses.

* ``sft``: fine-tunes the tiny model on the bundled verified programs in the chat format
  ``collect`` writes.
* ``grpo``: *primes* the tiny model (a short SFT on real contrastive prompts answered with every
  bundled program: fast, slow, wrong, crashing, cheating — so it starts out producing all of them),
  then runs GRPO with the judge as the reward.  The policy learns to prefer the verified fast
  programs, so ``reward_mean`` rises over the run (the learning test checks it).
* ``ssl``: primes the same way, then runs self-supervised rounds (generate, judge, keep the
  successes, fine-tune); the success rate per round is logged.

The primed model is built once per ``out`` (``out/prime/primed``) and reused by ``--resume``.

Several processes (``torchrun``/``accelerate launch``, see :mod:`cudal1.train.dist`): rank 0 alone builds
the tiny model and tokenizer and writes ``data.jsonl``; the other ranks wait for it.  Priming
and the stage's training are data-parallel over every rank (each rank trains on its share of
each batch; rank 0 saves).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from cudal1.config import Config, EvalConfig
from cudal1.recorded import JudgeEvent, RecordedJudge
from cudal1.train import dist
from cudal1.train.config import GRPOConfig, SFTConfig, SSLConfig, load_config
from cudal1.train.smoke import VARIANTS, priming_records, smoke_eval_task, smoke_judge_config, smoke_task

if TYPE_CHECKING:
    from cudal1.harness import DevicePlan
    from cudal1.types import Task

__all__ = [
    "PRIME", "judge_plan", "smoke_judge", "primed_model", "smoke_eval_task", "smoke_grpo", "smoke_sft",
    "smoke_ssl", "smoke_task", "tiny_base", "verified_records",
]

log = logging.getLogger(__name__)

PRIME_EXAMPLES = 128
PRIME = SFTConfig(learning_rate=3e-3, epochs=1.0, max_steps=80, batch_size=8, gradient_accumulation_steps=1,
                  max_length=4096, warmup_ratio=0.0, bf16=False, gradient_checkpointing=False, logging_steps=10,
                  save_steps=10_000, seed=0)


def tiny_base(out: Path, records: list[dict[str, Any]]) -> Path:
    """The untrained tiny model, its tokenizer trained on ``records``' texts (built once, by rank 0;
    the other ranks wait for it)."""
    from cudal1.train.smoke import fixed_strings
    from cudal1.train.smoke.tiny import build_tiny_model

    if dist.is_main() and not (out / "config.json").is_file():
        build_tiny_model(out, [m["content"] for r in records for m in r["messages"]], hidden=128,
                         fixed=fixed_strings(records))
    dist.barrier()
    return out


def primed_model(out: Path) -> Path:
    """The tiny model after a short SFT on every bundled program (built once under ``out``)."""
    from cudal1.train.stages.sft import run_sft

    primed = out / "primed"
    dist.barrier()  # every rank decides alike below: priming is a data-parallel SFT of all ranks
    if (primed / "config.json").is_file() and (primed / "tokenizer_config.json").is_file():
        return primed
    records = priming_records(smoke_task(), PRIME_EXAMPLES)
    base = tiny_base(out / "base", records)
    run_sft(str(base), records, PRIME, primed, stage="prime")
    return primed


def judge_plan(config: EvalConfig) -> tuple[DevicePlan | None, str]:
    """(device plan, hardware name) for a smoke judge.  On CUDA under several processes each rank
    judges on its own GPU (``LOCAL_RANK``), so two ranks never time on the same device."""
    from cudal1.harness import DevicePlan

    if config.device == "cpu":
        return None, "CPU"
    from cudal1.harness.envinfo import gpu_inventory

    gpus = None
    if dist.distributed() and config.device in ("cuda", "auto"):
        visible = [g.index for g in gpu_inventory()]
        gpus = [visible[dist.local_rank() % len(visible)]] if visible else None
    plan = DevicePlan.detect(config.device, gpus)
    return plan, plan.hardware_name()


def smoke_judge(config: EvalConfig | None = None, plan: DevicePlan | None = None,
                on_event: Callable[[JudgeEvent], None] | None = None) -> RecordedJudge:
    """The judge of a smoke stage: ``config`` (default :func:`smoke_judge_config`, on the CPU) on
    ``plan`` (e.g. a Ray cluster's; default :func:`judge_plan`)."""
    config = config or smoke_judge_config()
    plan, hardware = (plan, plan.hardware_name()) if plan is not None else judge_plan(config)
    return RecordedJudge(config, plan=plan, on_event=on_event, hardware=hardware)


def _judged_stage(stage: str, run: Callable[..., dict[str, Any]], out: str | Path, config: Config | None, resume: bool,
                  report_to: Any, judge: RecordedJudge | None, **extra: Any) -> dict[str, Any]:
    """``run`` (``run_grpo`` or ``run_ssl``) on the smoke task from the primed tiny model, judged by
    ``judge`` (default :func:`smoke_judge`)."""
    out = Path(out)
    judge = judge or smoke_judge()
    model = primed_model(out / "prime")
    summary = run(str(model), [smoke_task()], config or load_config(stage, "smoke"), judge, out, resume=resume,
                  report_to=report_to, **extra)
    plan = judge.plan
    return summary | {"base_model": str(model), "judge_device": plan.device if plan else "cpu",
                      "judge_backend": plan.backend if plan else "local",
                      "judge_gpus": list(plan.lanes) if plan and plan.device == "cuda" else [],
                      "distributed": dist.describe()}


def smoke_grpo(out: str | Path, *, config: GRPOConfig | None = None, resume: bool = False, report_to: Any = "none",
               judge: RecordedJudge | None = None, eval_tasks: list[Task] | None = None,
               exemplars_from: list[str] | None = None, exemplars_per_task: int = 4) -> dict[str, Any]:
    """GRPO smoke; ``judge`` (e.g. :func:`smoke_judge` on ``smoke_judge_config("cuda")``) picks how and
    where rollouts are judged (default: the CPU, this machine); ``eval_tasks`` are evaluated every
    ``eval_every`` steps of the config."""
    from cudal1.train.stages.grpo import run_grpo

    return _judged_stage("grpo", run_grpo, out, config, resume, report_to, judge, eval_tasks=eval_tasks,
                         exemplars_from=exemplars_from, exemplars_per_task=exemplars_per_task)


def verified_records() -> list[dict[str, Any]]:
    """Chat records answering the smoke task with each bundled verified program (what collect keeps)."""
    from cudal1.prompts import build_prompt
    from cudal1.train.smoke import answer

    prompt = build_prompt(smoke_task(), [], "CPU")
    return [{"messages": prompt.messages() + [{"role": "assistant", "content": answer(code)}], "variant": name}
            for name, code in VARIANTS.items()]


def smoke_sft(out: str | Path, *, config: SFTConfig | None = None, lora: bool | None = None, resume: bool = False,
              report_to: Any = "none") -> dict[str, Any]:
    import dataclasses

    from cudal1.train.stages.sft import run_sft

    out = Path(out)
    cfg = config or load_config("sft", "smoke")
    if lora is not None:
        cfg = dataclasses.replace(cfg, lora=lora)
    records = verified_records()
    data = out / "data.jsonl"
    if dist.is_main():
        out.mkdir(parents=True, exist_ok=True)
        data.write_text("".join(json.dumps(r) + "\n" for r in records))
    base = tiny_base(out / "base", records)  # waits for rank 0: data.jsonl is written too
    return run_sft(str(base), str(data), cfg, out, resume=resume, report_to=report_to) | {"data": str(data),
                                                                                         "distributed": dist.describe()}


def smoke_ssl(out: str | Path, *, config: SSLConfig | None = None, resume: bool = False, report_to: Any = "none",
              judge: RecordedJudge | None = None) -> dict[str, Any]:
    from cudal1.train.stages.ssl import run_ssl

    return _judged_stage("ssl", run_ssl, out, config, resume, report_to, judge)
