"""How often the GRPO smoke learns: ``cudal1 train grpo --smoke`` over several seeds, on this machine.

Each seed is a fresh ``cudal1 train grpo --smoke`` process (its ``--config`` is the smoke preset
with ``seed`` changed, plus any ``--set KEY=VALUE``).  ``--prime each`` (default): every run primes
its own tiny model, as the command does (with one CPU thread, the default here, every run
primes the same model); ``--prime once``: all runs start from one primed model (built under
``OUT/prime``, copied into each run as the learning test's ``seed_primed`` does), so seeds differ
only in GRPO's sampling, the exemplar draws and the CPU's timing noise.  Per seed
it reads ``metrics.jsonl`` and prints: reward_mean over the first three steps and the last third,
whether the run *learned* (the learning test's rule: the last third's mean above the first three
steps' by more than 0.3), the lowest step, the run's own collapse reports
(``summary["collapses"]``: streaks of steps whose rollouts were nearly all format failures, from
the step each began to the last, ``+`` when it lasted to the end), and
the wall time; then, last, one line: learned in X of N seeds.  Writes ``OUT/seeds.json``.

    PYTHONPATH=src python benchmarks/grpo_smoke_seeds.py --seeds 10 --out /tmp/smoke_seeds
    PYTHONPATH=src python benchmarks/grpo_smoke_seeds.py --seeds 3 --steps 12 --set learning_rate=3e-4

CPU only (the smoke's judge runs on the CPU); one run at a time, so timings are not disturbed by
each other.  About 2-3 minutes per seed on two shared cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

RISE = 0.3  # tests/test_train_grpo.py's margin


def learned(rewards: list[float], margin: float = RISE) -> tuple[float, float, bool]:
    """(mean of the first three steps, mean of the last third, whether the last beats the first by ``margin``)."""
    third = max(1, len(rewards) // 3)
    first = sum(rewards[:3]) / len(rewards[:3])
    last = sum(rewards[-third:]) / third
    return first, last, last > first + margin


def _value(text: str):
    import yaml

    return yaml.safe_load(text)


def run_seed(seed: int, out: Path, primed: Path | None, overrides: dict, timeout: float) -> dict:
    import yaml

    from cudal1.train.config import load_config

    run = out / f"seed{seed}"
    if run.exists():
        shutil.rmtree(run)
    if primed is not None:
        shutil.copytree(primed, run / "prime" / "primed")
    cfg = load_config("grpo", "smoke", {"seed": seed, **overrides})
    (out / f"seed{seed}.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), TOKENIZERS_PARALLELISM="false",
               CUDA_VISIBLE_DEVICES="", CUDAL1_CACHE_DIR=str(out / "cache"))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "cudal1.cli.main", "train", "grpo", "--smoke", "--config",
                           str(out / f"seed{seed}.yaml"), "--out", str(run), "--json"],
                          capture_output=True, text=True, timeout=timeout, env=env)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        return {"seed": seed, "error": (proc.stderr.strip().splitlines() or ["?"])[-1][:300], "wall_s": round(wall, 1)}
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    rewards = [r for r in summary["reward_mean"] if r is not None]
    first, last, ok = learned(rewards)
    return {"seed": seed, "first3": round(first, 3), "last_third": round(last, 3), "learned": ok,
            "lowest": round(min(rewards), 3), "collapses": summary.get("collapses") or [], "steps": len(rewards),
            "reward_mean": rewards, "wall_s": round(wall, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="/tmp/cudal1_smoke_seeds")
    p.add_argument("--seeds", type=int, default=10, help="seeds 0 .. N-1 (default 10)")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None, help="GRPO steps (default: the smoke preset's)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a grpo config field (dotted keys reach nested ones), e.g. learning_rate=3e-4")
    p.add_argument("--timeout", type=float, default=900, help="seconds per seed")
    p.add_argument(
        "--prime",
        choices=["each", "once"],
        default="each",
        help="each: every run primes its own model, as the command does (default); once: one primed model for all",
    )
    args = p.parse_args(argv)
    from cudal1.train.smoke.stages import primed_model

    overrides = {k: _value(v) for k, v in (s.split("=", 1) for s in args.set)}
    if args.steps:
        overrides["max_steps"] = args.steps
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    primed = None
    if args.prime == "once":
        t0 = time.monotonic()
        primed = primed_model(out / "prime")
        print(f"primed model: {primed} ({time.monotonic() - t0:.0f} s)", flush=True)
    rows = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        row = run_seed(seed, out, primed, overrides, args.timeout)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "reward_mean"}), flush=True)
        (out / "seeds.json").write_text(json.dumps({"overrides": overrides, "runs": rows}, indent=1))
    print(f"\n{'seed':>4} {'first3':>7} {'last1/3':>8} {'lowest':>7} {'learned':>7} {'collapse':<28} {'wall_s':>6}")
    for r in rows:
        if "error" in r:
            print(f"{r['seed']:>4} error: {r['error']}")
            continue
        col = "; ".join(f"step {c['began_at']}" + (f"-{c['recovered_at'] - 1}" if c["recovered_at"] else "+")
                        for c in r["collapses"]) or "-"
        print(f"{r['seed']:>4} {r['first3']:>7.2f} {r['last_third']:>8.2f} {r['lowest']:>7.2f} {str(r['learned']):>7} "
              f"{col:<28} {r['wall_s']:>6.0f}")
    good = sum(1 for r in rows if r.get("learned"))
    print(f"learned in {good} of {len(rows)} seeds (last third above the first three steps by > {RISE}); "
          f"priming: {args.prime}; overrides {overrides or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
