"""``cudal1 train sft|ssl|grpo``: CUDA-L1's training stages on TRL (``pip install "cudal1[train]"``).

* ``sft  --data DATA.jsonl --model NAME_OR_PATH [--lora] --out DIR`` — TRL SFTTrainer, loss on
  assistant turns only;
* ``ssl  --model DIR --suite S --rounds R --samples K --out DIR`` — generate, judge, keep the
  successes, fine-tune, per round;
* ``grpo --model DIR --suite S --out DIR [--config FILE]`` — TRL GRPOTrainer, contrastive prompts
  from the run store, the judge as the reward.

Every stage writes ``OUT/metrics.jsonl``, ``OUT/config.yaml`` and checkpoints with
``config.json``; the final model in ``OUT`` (``OUT/model`` for ssl) plugs into ``cudal1 optimize
--policy hf --model-path``.  ``--smoke`` runs the stage on this CPU with a tiny model built on the
spot and a bundled task (no other argument needed).  ``--resume`` continues from the last
checkpoint.  Multi-GPU: ``accelerate launch --config_file CONFIG -m cudal1.cli.main train ...``
(configs in ``cudal1/train/configs/``) or ``torchrun --nproc_per_node N -m cudal1.cli.main train ...``;
rank 0 writes ``config.yaml`` and prints the summary (see ``cudal1.train.dist``).  ``ssl`` and
``grpo`` judge on this machine's GPUs (``--gpus``, ``--workers-per-gpu``) or, with ``--backend ray
[--ray-address ADDR]``, on a Ray cluster's (several training processes need one cluster: give its
address)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cudal1.cli.options import (
    UsageError,
    add_backend_flags,
    add_judge_flags,
    config_from_args,
    config_sections,
    plan_from_args,
)
from cudal1.cli.output import print_json, table
from cudal1.config import Config, EvalConfig

if TYPE_CHECKING:
    from cudal1.recorded import RecordedJudge

STAGES = ("sft", "ssl", "grpo")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a kernel-writing model: sft, ssl or grpo (needs cudal1[train])",
                       description=__doc__)
    stages = p.add_subparsers(dest="stage", metavar="STAGE")
    for stage, help_ in (("sft", "supervised fine-tuning on verified data (TRL SFTTrainer)"),
                         ("ssl", "self-supervised rounds: generate, judge, keep successes, fine-tune"),
                         ("grpo", "contrastive GRPO with the judge as the reward (TRL GRPOTrainer)")):
        s = stages.add_parser(stage, help=help_, description=help_)
        _common(s, stage)
        s.set_defaults(func=run, stage=stage)
    p.set_defaults(func=_no_stage)


def _no_stage(args: argparse.Namespace) -> int:
    raise UsageError("train needs a stage: sft, ssl or grpo")


def _common(p: argparse.ArgumentParser, stage: str) -> None:
    p.add_argument("--smoke", action="store_true", help="CPU smoke run: tiny model built on the spot, bundled task")
    p.add_argument("--model", default=None, metavar="NAME_OR_DIR", help="model to train (hub name or local directory)")
    if stage == "sft":
        p.add_argument(
            "--data", default=None, metavar="DATA.jsonl", help="chat-format records (what cudal1 collect writes)"
        )
        p.add_argument(
            "--lora", action="store_true", default=None, help="train LoRA adapters (merged into the saved model)"
        )
    else:
        p.add_argument("--suite", default=None, help="tasks: a .py, a directory, a JSONL or kernelbench:level1/1-20")
        p.add_argument(
            "--source", default=None, metavar="PATH", help="KernelBench JSONL or directory for suite selectors"
        )
    if stage == "ssl":
        p.add_argument("--rounds", type=int, default=None, help="rounds (default from the config)")
        p.add_argument("--samples", type=int, default=None, help="programs per task per round")
    if stage == "grpo":
        p.add_argument(
            "--exemplars-from", nargs="+", default=None, metavar="RUN",
            help="seed the exemplar pool with the verified programs of earlier runs (collect DATA.jsonl, ssl/grpo/"
            "optimize/evaluate run directories or run stores), judged here first",
        )
        p.add_argument("--exemplars-per-task", type=int, default=4, metavar="N",
                       help="seeded programs per task, fastest first (default: 4; 0 = all)")
        e = p.add_argument_group("evaluation during training (the figures of cudal1 evaluate, in metrics.jsonl)")
        e.add_argument(
            "--eval-every", type=int, default=None, metavar="N",
            help="evaluate every N steps (default: config's, 0 = never)",
        )
        e.add_argument(
            "--eval-split",
            default=None,
            metavar="SPLIT_OR_TASKS",
            help="eval tasks: held-out or train (the fixed KernelBench split, within the --suite's level when it "
            "names one), or any suite selector, file or directory; --smoke: the smoke task",
        )
        e.add_argument(
            "--eval-samples", type=int, default=None, metavar="K", help="one-shot samples per eval task (default: 8)"
        )
    p.add_argument(
        "--allow-held-out",
        action="store_true",
        help="train on KernelBench held-out tasks anyway (refused by default: by level and id, or by source)",
    )
    p.add_argument("--out", default=f"runs/train-{stage}", metavar="DIR", help="output directory")
    p.add_argument("--max-steps", type=int, default=None, help="optimizer steps (overrides the config)")
    p.add_argument("--learning-rate", type=float, default=None, help="peak learning rate (overrides the config)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out")
    p.add_argument(
        "--report-to", default="none", metavar="NAME", help="none, tensorboard, wandb or mlflow (comma-separated)"
    )
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    presets = f"; or a packaged {stage} preset (smoke, default{', lora' if stage == 'sft' else ''}, ...)"
    if stage == "sft":
        p.set_defaults(config_sections=("sft",), config_flat="sft")
        p.add_argument(
            "--config",
            default=None,
            metavar="YAML_OR_PRESET",
            help=f"settings file (sft section), e.g. a run's OUT/config.yaml, which reproduces that run; a plain "
            f"mapping of sft settings also works{presets}; unknown keys are errors",
        )
        return
    add_judge_flags(p, sections=("judge", stage), flat=stage, also=presets)
    g = p.add_argument_group("judge")
    g.add_argument(
        "--gpus", default=None, metavar="LIST", help="comma-separated GPU indices for judging (default: all)"
    )
    # the spellings of cudal1 0.1, kept as aliases: --preset and a judge-only settings file
    g.add_argument("--judge-preset", dest="preset", default=None, help=argparse.SUPPRESS)
    g.add_argument("--judge-config", default=None, metavar="YAML", help=argparse.SUPPRESS)
    add_backend_flags(p)


def judge_config(args: argparse.Namespace) -> EvalConfig:
    """The judge config, as every judging command resolves it (:func:`~cudal1.cli.options.config_from_args`:
    the defaults, ``--preset`` or ``--config``'s judge section, then the judge flags); ``--smoke``
    without a judge setting judges with the smoke preset on the CPU.  ``--judge-config FILE`` (an
    alias of cudal1 0.1) stands for ``--config``'s judge section."""
    from cudal1.config import read_config_file

    if args.judge_config:
        if args.preset:
            raise UsageError("give --judge-config or --preset, not both")
        judge = read_config_file(args.judge_config, ("judge",))["judge"]
        args._config_sections = {k: v for k, v in config_sections(args).items() if k != "judge"} | {"judge": judge}
        args.preset = None
    if args.smoke and not args.preset and "judge" not in config_sections(args):
        from cudal1.train.smoke import smoke_judge_config

        args.device = args.device or "cpu"
        return config_from_args(args, base=smoke_judge_config(args.device))
    return config_from_args(args)


def stage_config(args: argparse.Namespace) -> Config:
    """The stage's config: its section of ``--config`` (a file or a packaged preset), else the
    ``smoke`` (with ``--smoke``) or ``default`` preset; then the flags that were given."""
    from cudal1.train.config import load_config
    from cudal1.train.config import stage_config as build

    overrides: dict[str, Any] = {"learning_rate": args.learning_rate, "max_steps": args.max_steps}
    if args.stage == "sft":
        overrides["lora"] = args.lora
    if args.stage == "ssl":
        overrides = {"rounds": args.rounds, "samples": args.samples, "sft.learning_rate": args.learning_rate,
                     "sft.max_steps": args.max_steps}
    if args.stage == "grpo":
        overrides |= {"eval_every": args.eval_every, "eval_samples": args.eval_samples}
    section = config_sections(args).get(args.stage)
    if section is None:
        return load_config(args.stage, "smoke" if args.smoke else "default", overrides)
    return build(args.stage, section, overrides)


def _resolve_config_file(args: argparse.Namespace) -> None:
    """``--config NAME`` of a packaged stage preset: its file."""
    if args.config:
        from cudal1.train.config import config_file

        args.config = str(config_file(args.stage, args.config))


def _need(args: argparse.Namespace, *names: str) -> None:
    missing = [f"--{n.replace('_', '-')}" for n in names if not getattr(args, n, None)]
    if missing:
        raise UsageError(f"train {args.stage} needs {' and '.join(missing)} (or --smoke)")


def run(args: argparse.Namespace) -> int:
    from cudal1 import __version__
    from cudal1.config import write_config_file
    from cudal1.train import MissingExtra, dist, require_train
    from cudal1.train.common import report_to as check_report_to

    try:
        require_train(f"cudal1 train {args.stage}")
        report = check_report_to(args.report_to)
    except (MissingExtra, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if getattr(args, "backend", "local") == "ray" and dist.world_size() > 1 and not args.ray_address:
        raise UsageError(
            "--backend ray under several training processes needs --ray-address (one cluster for all ranks)"
        )
    _resolve_config_file(args)
    cfg = stage_config(args)
    if getattr(args, "exemplars_from", None):
        from cudal1.train.stages.exemplars import SeedError, store_file

        try:
            for source in args.exemplars_from:  # before anything is trained or judged
                store_file(source)
        except SeedError as exc:
            raise UsageError(str(exc)) from None
    out = Path(args.out)
    judge = judge_config(args) if args.stage != "sft" else None
    record = {
        "command": f"train {args.stage}", "stage": args.stage, "smoke": args.smoke,
        "processes": dist.world_size(), "version": __version__,
        "args": {k: v for k, v in vars(args).items() if k != "func" and not k.startswith("_") and not callable(v)},
    }
    if dist.is_main():  # under several processes: rank 0 writes and prints, every rank trains
        write_config_file(out, judge=judge, **{args.stage: cfg}, run=record)
    try:
        summary = _dispatch(args, cfg, judge, out, report)
    except (FileNotFoundError, ValueError) as exc:
        raise UsageError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    dist.finish()
    if dist.is_main():
        if args.json:
            print_json(summary)
        else:
            _print(args.stage, summary)
    dist.leave(0)  # under several processes the process ends here (see its docstring)
    return 0


def _recorded(args: argparse.Namespace, config: EvalConfig) -> RecordedJudge:
    """The run's judge: on this machine's GPUs (``--gpus``) or a Ray cluster's; a local smoke
    picks each rank's GPU itself (:func:`~cudal1.train.smoke.stages.smoke_judge`)."""
    from cudal1.recorded import RecordedJudge

    gpus = [int(g) for g in args.gpus.split(",")] if args.gpus else None
    plan = plan_from_args(args, config.device, gpus)  # checks the backend flags too
    if args.smoke:
        from cudal1.train.smoke.stages import smoke_judge

        return smoke_judge(config, plan if plan.backend == "ray" else None)
    return RecordedJudge(config, plan=plan)


def _dispatch(
    args: argparse.Namespace, cfg: Config, judge: EvalConfig | None, out: Path, report: Any
) -> dict[str, Any]:
    from cudal1.train.smoke import stages as smoke_stages

    if args.stage == "sft":
        if args.smoke:
            return smoke_stages.smoke_sft(out, config=cfg, resume=args.resume, report_to=report)
        _need(args, "data", "model")
        from cudal1.train.stages.sft import run_sft

        return run_sft(args.model, args.data, cfg, out, resume=args.resume, report_to=report,
                       allow_held_out=args.allow_held_out)
    assert judge is not None
    if args.smoke:
        recorded = _recorded(args, judge)
        if args.stage == "grpo":
            evals = [smoke_stages.smoke_eval_task()] if cfg.eval_every else None  # no split in a one-task smoke
            return smoke_stages.smoke_grpo(out, config=cfg, resume=args.resume, report_to=report, judge=recorded,
                                           eval_tasks=evals, exemplars_from=args.exemplars_from,
                                           exemplars_per_task=args.exemplars_per_task)
        return smoke_stages.smoke_ssl(out, config=cfg, resume=args.resume, report_to=report, judge=recorded)
    _need(args, "model", "suite")
    from cudal1.tasks import load_tasks

    tasks = load_tasks(args.suite, args.source)
    recorded = _recorded(args, judge)
    if args.stage == "grpo":
        from cudal1.train.stages.grpo import run_grpo

        return run_grpo(args.model, tasks, cfg, recorded, out, resume=args.resume, report_to=report,
                        eval_tasks=eval_tasks(args, cfg, tasks), exemplars_from=args.exemplars_from,
                        exemplars_per_task=args.exemplars_per_task, allow_held_out=args.allow_held_out,
                        kernelbench=args.source)
    from cudal1.train.stages.ssl import run_ssl

    return run_ssl(args.model, tasks, cfg, recorded, out, resume=args.resume, report_to=report,
                   allow_held_out=args.allow_held_out, kernelbench=args.source)


def eval_tasks(args: argparse.Namespace, cfg: Config, tasks: list) -> list | None:
    """The tasks ``--eval-split`` names (None without evaluation); ``run_grpo`` refuses them when
    some are also trained on."""
    from cudal1.tasks import SPLITS, load_tasks, parse_selector

    if not cfg.eval_every:
        return None
    spec = args.eval_split
    if not spec:
        raise UsageError("--eval-every needs --eval-split (held-out, train, or a suite selector, file or directory)")
    if spec in SPLITS:
        level = None
        if args.suite and ":" in args.suite and not Path(args.suite).exists():
            level = parse_selector(args.suite).level
        spec = f"kernelbench:level{level}:{spec}" if level is not None else f"kernelbench:{spec}"
    return load_tasks(spec, args.source)


def _print(stage: str, summary: dict[str, Any]) -> None:
    if stage == "grpo":
        rows = [(i + 1, r, s) for i, (r, s) in enumerate(zip(summary["reward_mean"], summary["success_rate"]))]
        print(table(["step", "reward_mean", "success_rate"], rows))
        print(f"\nbest speedups: {summary['best_speedup']}; verdicts: {summary['judged']}")
        for c in summary.get("collapses") or []:
            print(f"collapse: from step {c['began_at']} the rollouts were {c['share']:.0%} answers without usable code "
                  f"({c['status']}; metrics.jsonl has the steps)")
        for ev in summary.get("eval") or []:
            print(f"eval at step {ev['step']}: ok {ev['ok_rate']:.3f}, pass@1 {ev.get('pass@1')}, "
                  f"fast_1.0 {ev['fast_p']['1.0']}, geomean best over all tasks {ev['speedup']['geomean']}")
    elif stage == "ssl":
        print(table(["round", "success_rate", "kept", "loss"],
                    [(r["round"], r["success_rate"], r["kept"], r["loss"]) for r in summary["rounds"]]))
    else:
        print(
            f"{summary['examples']} examples, {summary['steps']} steps, loss {summary['loss_first']} -> "
            f"{summary['loss_last']}"
        )
    print(
        f"model: {summary.get('model') if stage == 'ssl' else summary['out']}; metrics: {summary['out']}/metrics.jsonl"
    )


