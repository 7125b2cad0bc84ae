"""GRPO on a GPU with rollouts judged on the GPU: throughput, peak memory and reward per step.

What it runs (no network, no downloaded weights): a small Qwen2-config model built at run time
(``--hidden``/``--layers``; a BPE tokenizer trained on the spot), primed with a short SFT on real
contrastive prompts for the bundled ``diag_scale`` task (N = ``--size``) answered with fast, slow,
wrong, crashing and cheating programs — on a GPU also a custom CUDA kernel (``load_inline``) and a
Triton kernel (``benchmarks/train_gpu_programs.py``) — then every variant is judged once on the GPU
(the warm-up: builds the CUDA extension before GRPO starts and fills the run store, so the
variants are exemplars from the first prompt on), then ``cudal1.train.stages.grpo.run_grpo`` — TRL's GRPOTrainer,
contrastive prompts from the run store, every rollout judged by the real judge on the GPU
(``--judge-preset``, device cuda).  Prints one line per step (reward_mean, success_rate, judged,
fresh evaluations, seconds) and a summary: rollouts per minute, fresh judge evaluations per
minute, judge share of the wall time, peak GPU memory of the trainer process, whether
reward_mean rose, and the GRPO rollouts per program kind (cuda / triton / pytorch / none) and
verdict status.  Writes ``OUT/train_gpu.json`` and keeps ``OUT/grpo`` (metrics.jsonl, store).

Needs: torch with CUDA, transformers, peft, accelerate, datasets, trl (``pip install
"cudal1[train]"``, or wheels copied to an offline machine: see docs/training.md).

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
sys.path.insert(0, str(Path(__file__).resolve().parent))  # train_gpu_programs, beside this script


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="/tmp/cudal1_train_gpu")
    p.add_argument("--steps", type=int, default=20, help="GRPO optimizer steps")
    p.add_argument("--group", type=int, default=8, help="completions per prompt (group size)")
    p.add_argument("--prompts", type=int, default=2, help="prompts per step")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument(
        "--size", type=int, default=None, help="N of the diag_scale task (default 4096; 512 with --cpu-dry-run)"
    )
    p.add_argument("--prime-steps", type=int, default=None,
                   help="priming SFT steps (default 240 with the GPU variants: their long programs need them to come "
                        "out intact, each changed CUDA program being a fresh build; 120 without)")
    p.add_argument("--lr", type=float, default=1e-3, help="GRPO learning rate")
    p.add_argument(
        "--beta",
        type=float,
        default=0.05,
        help="GRPO KL coefficient (the 2026-11-30 H200 run in benchmarks/LOG.md: 0.05)",
    )
    p.add_argument("--judge-preset", default="fast")
    p.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help="stop GRPO after the first step that ends this many seconds after the script started "
        "(fresh builds of changed CUDA programs can make steps slow); the summary covers the steps done",
    )
    p.add_argument("--gpus", default=None, help="GPU indices for judging (default: all)")
    p.add_argument("--gpu-variants", choices=["auto", "on", "off"], default="auto",
                   help="add the CUDA (load_inline) and Triton programs to the variant set (auto: on a GPU)")
    p.add_argument("--cpu-dry-run", action="store_true", help="check the script on a CPU (tiny sizes; no GPU figures)")
    p.add_argument(
        "--summarize-log", metavar="LOG", help="print one line about a `cudal1 train ... --json` log and exit"
    )
    p.add_argument("--summarize-json", metavar="JSON", help="print one line about a train_gpu.json and exit")
    args = p.parse_args(argv)
    if args.summarize_log:
        print(summarize_log(Path(args.summarize_log)))
        return 0
    if args.summarize_json:
        print(summarize_json(Path(args.summarize_json)))
        return 0

    missing = [
        m
        for m in ("torch", "transformers", "trl", "peft", "accelerate", "datasets")
        if importlib.util.find_spec(m) is None
    ]
    if missing:
        print(
            f'train_gpu: missing {", ".join(missing)} (pip install "cudal1[train]" or copy wheels there)',
            file=sys.stderr,
        )
        return 2
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.cpu_dry_run:
        print("train_gpu: needs a CUDA GPU (or --cpu-dry-run)", file=sys.stderr)
        return 2
    device = "cuda" if cuda else "cpu"
    args.size = args.size or (4096 if cuda else 512)
    import dataclasses

    from cudal1.config import EvalConfig
    from cudal1.harness import DevicePlan
    from cudal1.harness.envinfo import gpu_inventory
    from cudal1.recorded import RecordedJudge
    from cudal1.train.config import SFTConfig, load_config
    from cudal1.train.judging import RolloutJudge
    from cudal1.train.smoke import CHEATS, FAILURES, VARIANTS, fixed_strings, priming_records, short_answer, smoke_task
    from cudal1.train.smoke.tiny import build_tiny_model
    from cudal1.train.stages.grpo import run_grpo
    from cudal1.train.stages.sft import run_sft
    from train_gpu_programs import GPU_VARIANTS, program_kind

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    judge = EvalConfig.preset(args.judge_preset).replace(device=device)
    plan = DevicePlan.detect(device, [int(g) for g in args.gpus.split(",")] if args.gpus else None)
    hardware = (
        (", ".join(sorted({g.name for g in gpu_inventory() if g.index in plan.lanes})) or "CUDA GPU") if cuda else "CPU"
    )
    task = smoke_task(args.size)
    t0 = time.monotonic()

    gpu_variants = GPU_VARIANTS if (args.gpu_variants == "on" or (args.gpu_variants == "auto" and cuda)) else {}
    args.prime_steps = args.prime_steps or (240 if gpu_variants else 120)
    answers = {**VARIANTS, **FAILURES, "mutates_input": CHEATS["mutates_input"], **gpu_variants}
    records = priming_records(task, 128, hardware=hardware, answers=answers,
                              exemplars={k: (v, (3.0, 5.0)) for k, v in gpu_variants.items()})
    texts = [m["content"] for r in records for m in r["messages"]]
    base = build_tiny_model(
        out / "base", texts, hidden=args.hidden, layers=args.layers, heads=max(1, args.hidden // 64),
        fixed=fixed_strings(records, programs=list(gpu_variants.values())),
    )
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(base))
    longest = max(len(tok(short_answer(code)).input_ids) for code in answers.values())
    prime_cfg = SFTConfig(learning_rate=3e-3, max_steps=args.prime_steps, batch_size=8, gradient_accumulation_steps=1,
                          max_length=4096, warmup_ratio=0.05, bf16=True, gradient_checkpointing=False, logging_steps=10,
                          save_steps=10_000)
    run_sft(str(base), records, prime_cfg, out / "primed", stage="prime")
    prime_s = time.monotonic() - t0

    # Warm-up: every variant judged once, on the judge and store GRPO uses (the CUDA extension is
    # built here, not inside a GRPO step; GRPO then finds these verdicts recorded and shows the
    # variants as exemplars).
    t_w = time.monotonic()
    (out / "grpo").mkdir(parents=True, exist_ok=True)
    judge_wall: list[float] = []  # GRPO's verdicts' wall times (the warm-up's are left out below)
    recorded = RecordedJudge(judge, plan=plan, hardware=hardware,
                             on_event=lambda e: judge_wall.append(e.result.wall_s) if e.kind == "verdict" else None)
    with recorded.store_at(out / "grpo" / "cudal1.sqlite"):
        names = list(answers) + ["caches_output"]
        texts_w = [short_answer(answers.get(n) or CHEATS[n]) for n in names]
        verdicts = RolloutJudge(recorded, "warmup").judge([(task, t) for t in texts_w], round_=0, label="warmup")
    judge_wall.clear()
    warm_s = time.monotonic() - t_w
    warmup = []
    print(f"warm-up ({warm_s:.1f} s): every variant judged once on {hardware}")
    print(f"{'variant':<18} {'kind':<8} {'status':<14} {'speedup':>8} {'wall_s':>7} flags")
    for name, (res, outcome) in zip(names, verdicts):
        row = {
            "variant": name, "kind": program_kind(answers.get(name) or CHEATS[name]),
            "status": res.status.value if res is not None else "format",
            "speedup": res.speedup if res is not None else None,
            "wall_s": round(res.wall_s, 1) if res is not None else None,
            "build_s": round(res.build_s, 1) if res is not None else None,
            "flags": list(res.flags) if res is not None else [],
            "reward_outcome": outcome.kind,
        }
        warmup.append(row)
        sp = f"{row['speedup']:.2f}" if row["speedup"] is not None else "-"
        print(
            f"{name:<18} {row['kind']:<8} {row['status']:<14} {sp:>8} {row['wall_s'] or 0:>7.1f} "
            f"{','.join(row['flags'])}"
        )

    cfg = dataclasses.replace(
        load_config("grpo", "smoke"), group_size=args.group, prompts_per_step=args.prompts,
        max_steps=args.steps, learning_rate=args.lr, beta=args.beta,
        max_completion_length=max(96, longest + 16), bf16=True, save_steps=max(args.steps, 1),
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t1 = time.monotonic()
    callbacks = (_deadline_callback(t0 + args.deadline_s),) if args.deadline_s else ()
    summary = run_grpo(str(out / "primed"), [task], cfg, recorded, out / "grpo", callbacks=callbacks)
    grpo_s = time.monotonic() - t1
    peak_gb = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")

    lines = [json.loads(x) for x in (out / "grpo" / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if x.get("stage") == "grpo"]
    rollouts = sum(sum(x["judged"].values()) for x in steps)
    fresh = sum(x["evaluated"] for x in steps)
    print(f"{'step':>4} {'reward_mean':>11} {'success':>8} {'fresh':>5} {'judged':<60}")
    for x in steps:
        print(
            f"{x['step']:>4} {x['reward_mean']:>11.3f} {x['success_rate'] or 0:>8.2f} {x['evaluated']:>5} "
            f"{json.dumps(x['judged']):<60}"
        )
    kinds = rollout_kinds(out / "grpo" / "cudal1.sqlite", judge.hash())
    print("GRPO rollouts per program kind and status:", json.dumps(kinds))
    third = max(1, len(steps) // 3)
    first = sum(x["reward_mean"] for x in steps[:third]) / third
    last = sum(x["reward_mean"] for x in steps[-third:]) / third
    result = {
        "gpu": hardware, "torch": torch.__version__, "trl": _version("trl"),
        "transformers": _version("transformers"), "prime_steps": args.prime_steps,
        "model": {
            "hidden": args.hidden,
            "layers": args.layers,
            "parameters": sum(math.prod(v) for v in _shapes(out / "primed")),
        },
        "task": f"diag_scale N={args.size}", "group": args.group, "prompts_per_step": args.prompts,
        "steps": len(steps), "prime_s": round(prime_s, 1), "grpo_s": round(grpo_s, 1), "rollouts": rollouts,
        "fresh_evaluations": fresh, "rollouts_per_min": round(60 * rollouts / grpo_s, 1),
        "fresh_evaluations_per_min": round(60 * fresh / grpo_s, 1), "judge_s": round(sum(judge_wall), 1),
        "judge_share": round(sum(judge_wall) / grpo_s, 3), "peak_gpu_memory_gb": round(peak_gb, 2),
        "reward_mean": [x["reward_mean"] for x in steps], "success_rate": [x["success_rate"] for x in steps],
        "reward_first_third": first, "reward_last_third": last, "steps_planned": args.steps,
        "stopped_by_deadline": len(steps) < args.steps, "reward_rose": last > first,
        "best_speedup": summary["best_speedup"], "verdicts": summary["judged"],
        "gpu_variants": sorted(gpu_variants), "warmup_s": round(warm_s, 1), "warmup": warmup,
        "max_completion_length": cfg.max_completion_length, "rollout_kinds": kinds,
    }
    (out / "train_gpu.json").write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps({k: v for k, v in result.items() if k not in ("reward_mean", "success_rate")}, default=str))
    return 0


def _deadline_callback(deadline: float):
    """A ``TrainerCallback`` that ends training at the first step ending after ``deadline``
    (``time.monotonic()``)."""
    from transformers import TrainerCallback

    class Deadline(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if time.monotonic() > deadline:
                print(f"train_gpu: deadline reached after step {state.global_step}; stopping", flush=True)
                control.should_training_stop = True
            return control

    return Deadline()


def summarize_log(log: Path) -> str:
    """One line about a ``cudal1 train STAGE --json`` log (gpu_checks.sh's train stage): the
    summary's key figures and what ran where (``distributed``), or the log's last error line."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    found = []
    for line in text.splitlines():
        if line.startswith("{") and '"out"' in line:
            try:
                found.append(json.loads(line))
            except ValueError:
                pass
    if not found:
        errors = [x for x in text.splitlines() if "Error" in x or "error:" in x or "Traceback" in x]
        return f"no summary; {(errors or text.splitlines() or ['empty log'])[-1][:300]}"
    s = found[-1]
    d = s.get("distributed") or {}
    where = (f"world_size={d.get('world_size')} backend={d.get('backend')} "
             f"ranks={[r.get('device') for r in d.get('ranks', [])]}" if d else f"processes={s.get('processes')}")
    if "reward_mean" in s:
        r = [x for x in s["reward_mean"] if x is not None]
        figs = (f"steps={s.get('steps')} reward_mean {r[0]:.3f} -> {r[-1]:.3f}" if r else f"steps={s.get('steps')}") + \
            f" judge={s.get('judge_device')}{s.get('judge_gpus') or ''} verdicts={s.get('judged')}"
    else:
        figs = (f"steps={s.get('steps')} loss {s.get('loss_first')} -> {s.get('loss_last')} "
                f"trainer_processes={s.get('processes')}")
    return f"{figs}; {where}; summaries printed: {len(found)}"


def summarize_json(path: Path) -> str:
    """One line about ``train_gpu.json``."""
    if not path.is_file():
        return "no train_gpu.json"
    r = json.loads(path.read_text())
    warm = {w["variant"]: w["status"] for w in r.get("warmup", []) if w["kind"] in ("cuda", "triton")}
    kinds = {k: f"{v['rollouts']}({','.join(f'{s}:{n}' for s, n in v['status'].items())})"
             for k, v in (r.get("rollout_kinds") or {}).items()}
    return (
        f"reward {r['reward_first_third']:.3f} -> {r['reward_last_third']:.3f} (rose={r['reward_rose']}), "
        f"{r['steps']}/{r.get('steps_planned', r['steps'])} steps, {r['rollouts_per_min']} rollouts/min, "
        f"{r['fresh_evaluations_per_min']} fresh/min, "
        f"peak {r['peak_gpu_memory_gb']} GB, warm-up {r.get('warmup_s')} s {warm}, kinds {kinds}"
    )


def rollout_kinds(store_path: Path, config_hash: str) -> dict[str, dict]:
    """GRPO rollouts per program kind (``train_gpu_programs.program_kind``): how many, how many
    distinct programs, verdict statuses, and for cuda/triton how many ``ok`` verdicts ran a custom
    kernel (no ``no_custom_kernel`` flag)."""
    from collections import Counter, defaultdict

    from cudal1.store import RunStore
    from train_gpu_programs import program_kind

    store = RunStore(store_path)
    try:
        sources: dict[str, str] = {}
        rows = [r for r in store.responses() if r["policy"] == "grpo"]
        for th in {r["task_hash"] for r in rows}:
            sources.update({c.hash: c.source for c in store.candidates(th)})
        out: dict[str, dict] = defaultdict(
            lambda: {"rollouts": 0, "distinct": set(), "status": Counter(), "custom_kernel_ok": 0}
        )
        for r in rows:
            ch = r["candidate_hash"]
            kind = program_kind(sources.get(ch)) if ch else "none"
            res = store.get_evaluation(r["task_hash"], ch, config_hash) if ch else None
            status = res.status.value if res is not None else ("format" if not ch else "unjudged")
            k = out[kind]
            k["rollouts"] += 1
            k["status"][status] += 1
            if ch:
                k["distinct"].add(ch)
            if (
                kind in ("cuda", "triton")
                and res is not None
                and status == "ok"
                and "no_custom_kernel" not in res.flags
            ):
                k["custom_kernel_ok"] += 1
        return {kind: {"rollouts": v["rollouts"], "distinct": len(v["distinct"]), "status": dict(v["status"]),
                       "custom_kernel_ok": v["custom_kernel_ok"]} for kind, v in sorted(out.items())}
    finally:
        store.close()


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
