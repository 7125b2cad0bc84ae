"""GRPO on a GPU with rollouts judged on the GPU: throughput, peak memory and reward per step.

What it runs (no network, no downloaded weights): a small Qwen2-config model built at run time
(``--hidden``/``--layers``; a BPE tokenizer trained on the spot), primed with a short SFT on real
contrastive prompts for the bundled ``diag_scale`` task (N = ``--size``) answered with fast, slow,
wrong, crashing and cheating programs, then ``cudal1.train.grpo.run_grpo`` — TRL's GRPOTrainer,
contrastive prompts from the run store, every rollout judged by the real judge on the GPU
(``--judge-preset``, device cuda).  Prints one line per step (reward_mean, success_rate, judged,
fresh evaluations, seconds) and a summary: rollouts per minute, fresh judge evaluations per
minute, judge share of the wall time, peak GPU memory of the trainer process, and whether
reward_mean rose.  Writes ``OUT/train_gpu.json`` and keeps ``OUT/grpo`` (metrics.jsonl, store).

Needs: torch with CUDA, transformers, peft, accelerate, datasets, trl (``pip install
"cudal1[train]"``, or wheels carried to an offline machine: see docs/training.md).

    PYTHONPATH=src python benchmarks/train_gpu.py --out /tmp/train_gpu --steps 12
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="/tmp/cudal1_train_gpu")
    p.add_argument("--steps", type=int, default=20, help="GRPO optimizer steps")
    p.add_argument("--group", type=int, default=8, help="completions per prompt (group size)")
    p.add_argument("--prompts", type=int, default=2, help="prompts per step")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--size", type=int, default=4096, help="N of the diag_scale task")
    p.add_argument("--prime-steps", type=int, default=120)
    p.add_argument("--lr", type=float, default=1e-3, help="GRPO learning rate")
    p.add_argument("--judge-preset", default="fast")
    p.add_argument("--gpus", default=None, help="GPU indices for judging (default: all)")
    p.add_argument("--cpu-dry-run", action="store_true", help="check the script on a CPU (tiny sizes; no GPU figures)")
    args = p.parse_args(argv)

    missing = [m for m in ("torch", "transformers", "trl", "peft", "accelerate", "datasets") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"train_gpu: missing {', '.join(missing)} (pip install \"cudal1[train]\" or carry wheels)", file=sys.stderr)
        return 2
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.cpu_dry_run:
        print("train_gpu: needs a CUDA GPU (or --cpu-dry-run)", file=sys.stderr)
        return 2
    device = "cuda" if cuda else "cpu"
    import dataclasses

    from cudal1.config import EvalConfig
    from cudal1.harness import DevicePlan
    from cudal1.harness.envinfo import gpu_inventory
    from cudal1.train.config import SFTConfig, load_config
    from cudal1.train.grpo import run_grpo
    from cudal1.train.sft import run_sft
    from cudal1.train.smoke import fixed_strings, priming_records, smoke_task
    from cudal1.train.tiny import build_tiny_model

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    judge = EvalConfig.preset(args.judge_preset).replace(device=device)
    plan = DevicePlan.detect(device, [int(g) for g in args.gpus.split(",")] if args.gpus else None)
    hardware = (", ".join(sorted({g.name for g in gpu_inventory() if g.index in plan.lanes})) or "CUDA GPU") if cuda else "CPU"
    task = smoke_task(args.size)
    t0 = time.monotonic()

    records = priming_records(task, 128, hardware=hardware)
    texts = [m["content"] for r in records for m in r["messages"]]
    base = build_tiny_model(out / "base", texts, hidden=args.hidden, layers=args.layers, heads=max(1, args.hidden // 64),
                            fixed=fixed_strings(records))
    prime_cfg = SFTConfig(learning_rate=3e-3, max_steps=args.prime_steps, batch_size=8, gradient_accumulation_steps=1,
                          max_length=4096, warmup_ratio=0.05, bf16=True, gradient_checkpointing=False, logging_steps=10,
                          save_steps=10_000)
    run_sft(str(base), records, prime_cfg, out / "primed", stage="prime")
    prime_s = time.monotonic() - t0

    judge_wall: list[float] = []
    cfg = dataclasses.replace(load_config("grpo", "smoke"), group_size=args.group, prompts_per_step=args.prompts,
                              max_steps=args.steps, learning_rate=args.lr, max_completion_length=96, bf16=True,
                              save_steps=max(args.steps, 1))
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t1 = time.monotonic()
    summary = run_grpo(str(out / "primed"), [task], cfg, judge, out / "grpo", plan=plan, hardware=hardware,
                       on_result=lambda r: judge_wall.append(r.wall_s))
    grpo_s = time.monotonic() - t1
    peak_gb = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")

    lines = [json.loads(x) for x in (out / "grpo" / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if x.get("stage") == "grpo"]
    rollouts = sum(sum(x["judged"].values()) for x in steps)
    fresh = sum(x["evaluated"] for x in steps)
    print(f"{'step':>4} {'reward_mean':>11} {'success':>8} {'fresh':>5} {'judged':<60}")
    for x in steps:
        print(f"{x['step']:>4} {x['reward_mean']:>11.3f} {x['success_rate'] or 0:>8.2f} {x['evaluated']:>5} {json.dumps(x['judged']):<60}")
    third = max(1, len(steps) // 3)
    first = sum(x["reward_mean"] for x in steps[:third]) / third
    last = sum(x["reward_mean"] for x in steps[-third:]) / third
    result = {
        "gpu": hardware, "torch": torch.__version__, "trl": _version("trl"), "transformers": _version("transformers"),
        "model": {"hidden": args.hidden, "layers": args.layers,
                  "parameters": sum(math.prod(v) for v in _shapes(out / "primed"))},
        "task": f"diag_scale N={args.size}", "group": args.group, "prompts_per_step": args.prompts, "steps": len(steps),
        "prime_s": round(prime_s, 1), "grpo_s": round(grpo_s, 1), "rollouts": rollouts, "fresh_evaluations": fresh,
        "rollouts_per_min": round(60 * rollouts / grpo_s, 1), "fresh_evaluations_per_min": round(60 * fresh / grpo_s, 1),
        "judge_s": round(sum(judge_wall), 1), "judge_share": round(sum(judge_wall) / grpo_s, 3),
        "peak_gpu_memory_gb": round(peak_gb, 2), "reward_mean": [x["reward_mean"] for x in steps],
        "success_rate": [x["success_rate"] for x in steps], "reward_first_third": first, "reward_last_third": last,
        "reward_rose": last > first, "best_speedup": summary["best_speedup"], "verdicts": summary["judged"],
    }
    (out / "train_gpu.json").write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps({k: v for k, v in result.items() if k not in ("reward_mean", "success_rate")}, default=str))
    return 0


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def _shapes(model_dir: Path):
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        for key in f.keys():
            yield f.get_slice(key).get_shape()


if __name__ == "__main__":
    sys.exit(main())
