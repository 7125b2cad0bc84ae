"""The judge's timer against the profiler, on single-kernel operators from 256 K to 64 M elements.

For each size N it builds two tasks over fp32 ``x`` (N/1024 x 1024) and a 1024-wide bias:

* ``add``: ``x + b``, one kernel, judged against itself (``ModelNew = Model``): the judge's GPU
  figure for the reference and for the candidate should equal the kernel's duration from
  ``torch.profiler`` (CUPTI) within max(1 us, 5%);
* ``twice``: ``(x + b) + b`` (the same broadcast-add kernel twice) against
  ``torch.add(x, b, alpha=2)`` (that kernel once; equal values within rounding): a candidate with
  a 2x faster kernel, which should read at least 1.8x.  Where the first kernel's output is still
  in L2 when the second reads it (below ~16 M elements on an H200) the profiler itself reads
  less than 2x; the table then shows whether the judge reads at least 0.9x the profiler's ratio.

The profiler side runs first, in this process (L2 flushed before every call, 30 calls, median
per call of the kernels' summed durations); then every pair is judged by the real judge
(``cudal1.harness.evaluate_pairs``, default config: the ``gpu`` figure), ``--runs`` times on fresh
secret seeds (repeatability: the median over pairs of runs of |speedup_j - speedup_i| /
speedup_i).  The table printed last holds, per size: profiler us, judge reference/candidate us
for ``add``, the error against the profiler, the ``twice`` speedup by profiler and by the judge
(gpu and host figures), and the median judge wall seconds per verdict.  ``--json PATH`` writes
every number.  Needs a CUDA GPU.

    python benchmarks/timer_ladder.py [--sizes 256K,1M,4M,16M,64M] [--runs 2] [--json runs/ladder.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ADD = """
import torch
import torch.nn as nn

N = {n}


class Model(nn.Module):
    def forward(self, x, b):
        return {expr}


def get_inputs():
    return [torch.randn(N // 1024, 1024), torch.randn(1024)]


def get_init_inputs():
    return []
"""
FAST = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x, b):
        return torch.add(x, b, alpha=2)
"""


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def repeatability(speedups: list[float]) -> float | None:
    """The median over every pair of runs of ``|s_j - s_i| / s_i`` (two runs: their one difference)."""
    pairs = [abs(b - a) / a for i, a in enumerate(speedups) for b in speedups[i + 1:] if a]
    return statistics.median(pairs) if pairs else None


def profiler_us(expr: str, n: int, calls: int = 30, cost: dict[str, float] | None = None) -> float:
    """Median per call of the summed CUDA kernel durations of ``expr`` (flush and its kernels
    excluded).  ``cost``, when given, gets ``profiler_ms``: the median host wall time of timing one
    call this way (the profiler's start and stop around the call and reading its kernel records),
    what a judge timing each call from CUPTI activity records would pay per call."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(n // 1024, 1024, device="cuda")
    b = torch.randn(1024, device="cuda")
    fn = eval(f"lambda x, b: {expr}", {"torch": torch})
    flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size // 4, dtype=torch.int32, device="cuda")
    for _ in range(5):
        fn(x, b)
    torch.cuda.synchronize()
    per_call, walls = [], []
    for _ in range(calls):
        flush.zero_()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn(x, b)
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        per_call.append(sum(e.device_time for e in kernels))
        walls.append((time.perf_counter() - t0) * 1e3)
    if cost is not None:
        cost["profiler_ms"] = statistics.median(walls)
    return statistics.median(per_call)


def timer_us(n: int, calls: int = 30) -> dict[str, float]:
    """The timer alone, in this process: the median raw span of ``x + b`` and the two candidate
    overhead figures (a gated call launching one empty kernel, the judge's choice; a gated call
    launching nothing, the events' cost alone), so the subtraction can be checked against the
    profiler without another run."""
    import torch

    from cudal1.harness.timer import CudaTimer

    timer = CudaTimer(torch.device("cuda"))
    x = torch.randn(n // 1024, 1024, device="cuda")
    b = torch.randn(1024, device="cuda")
    for _ in range(5):
        timer.time_call(torch.add, (x, b))
    walls, spans = [], []
    for _ in range(calls):
        t0 = time.perf_counter()
        spans.append(timer.time_call(torch.add, (x, b))[0].gpu_ms)
        walls.append((time.perf_counter() - t0) * 1e3)
    raw = statistics.median(spans) * 1e3
    empty = statistics.median(timer.time_call(lambda: torch.cuda._sleep(0), ())[0].gpu_ms for _ in range(calls)) * 1e3
    nothing = statistics.median(timer.time_call(lambda: None, ())[0].gpu_ms for _ in range(calls)) * 1e3
    return {"raw_us": raw, "empty_kernel_us": empty, "no_launch_us": nothing, "timer_ms": statistics.median(walls)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="256K,1M,4M,16M,64M")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--timing-budget", type=float, default=1.0, help="judge timing_budget_s per verdict")
    ap.add_argument("--json", default="", help="write every number here")
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("timer_ladder: needs a CUDA GPU", file=sys.stderr)
        return 2
    from cudal1.config import EvalConfig
    from cudal1.harness import evaluate_pairs
    from cudal1.types import Candidate, Task, reference_candidate

    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    cost: dict[int, dict[str, float]] = {}
    prof = {
        n: {
            "add": profiler_us("x + b", n, cost=cost.setdefault(n, {})),
            "twice": profiler_us("(x + b) + b", n), "once": profiler_us("torch.add(x, b, alpha=2)", n),
            **timer_us(n), **cost[n],
        }
        for n in sizes
    }
    pairs = []
    for n in sizes:
        add = Task(f"ladder_add_{n}", ADD.format(n=n, expr="x + b"))
        twice = Task(f"ladder_twice_{n}", ADD.format(n=n, expr="(x + b) + b"))
        pairs += [(add, reference_candidate(add)), (twice, Candidate(FAST, task_hash=twice.hash, label="fast"))]
    config = EvalConfig(device="cuda", timing_budget_s=args.timing_budget)
    runs = []
    for _ in range(args.runs):
        t0 = time.time()
        results = evaluate_pairs(pairs, config.replace(input_seed=None))
        runs.append({"wall_s": time.time() - t0, "results": [r.to_dict() for r in results]})
    rows = []
    for i, n in enumerate(sizes):
        add = [run["results"][2 * i] for run in runs]
        twice = [run["results"][2 * i + 1] for run in runs]
        refs = [r["reference"]["median_ms"] * 1e3 for r in add if r["reference"]]
        cands = [r["candidate"]["median_ms"] * 1e3 for r in add if r["candidate"]]
        if not refs or not cands:
            print(
                f"timer_ladder: no timing at N={n}: {[(r['status'], r['message'][:200]) for r in add]}", file=sys.stderr
            )
            return 1
        ref_us, cand_us = statistics.median(refs), statistics.median(cands)
        speedups = [r["speedup"] for r in twice if r["speedup"]]
        host = [r["figures"].get("host", {}).get("speedup") for r in twice if r.get("figures")]
        rows.append({
            "numel": n, "profiler_add_us": prof[n]["add"], "judge_ref_us": ref_us, "judge_cand_us": cand_us,
            "err_us": max(abs(ref_us - prof[n]["add"]), abs(cand_us - prof[n]["add"])),
            "profiler_ratio": prof[n]["twice"] / max(prof[n]["once"], 1e-9),
            "judge_speedup": statistics.median(speedups) if speedups else None,
            "judge_host_speedup": statistics.median(h for h in host if h) if any(host) else None,
            "repeatability": repeatability(speedups),
            "statuses": sorted({r["status"] for r in add + twice}),
            "flags": sorted({f for r in add + twice for f in r["flags"]}),
            "wall_s": statistics.median(r["wall_s"] for r in add + twice),
            "window": [r["figures"].get("gpu", {}).get("window") or {} for r in add],
        })
    env = runs[0]["results"][0]["environment"]
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"rows": rows, "profiler": prof, "runs": runs}, indent=1, default=str))
    print(
        f"environment: {env.get('gpu_name')} driver {env.get('driver')} torch {env.get('torch')} CUDA {env.get('cuda')}"
    )
    print(f"{'N':>9} {'prof us':>8} {'ref us':>8} {'cand us':>8} {'err us':>7} {'ok':>3} | {'prof 2x':>7} "
          f"{'judge':>6} {'host':>6} {'>=1.8':>5} {'>=.9p':>5} {'rep %':>6} {'wall s':>6}  verdicts")
    for r in rows:
        within = r["err_us"] <= max(1.0, 0.05 * r["profiler_add_us"])
        js = r["judge_speedup"]
        print(
            f"{r['numel']:>9} {r['profiler_add_us']:8.2f} {r['judge_ref_us']:8.2f} {r['judge_cand_us']:8.2f} "
            f"{r['err_us']:7.2f} {'yes' if within else 'NO':>3} | {r['profiler_ratio']:7.2f} "
            f"{js or 0:6.2f} {r['judge_host_speedup'] or 0:6.2f} {'yes' if js and js >= 1.8 else 'NO':>5} "
            f"{'yes' if js and js >= 0.9 * r['profiler_ratio'] else 'NO':>5} "
            f"{(r['repeatability'] or 0) * 100:6.2f} {r['wall_s']:6.2f}  {','.join(r['statuses'])} "
            f"{','.join(r['flags'])}"
        )
    print("clean window of the identical candidate (us, per run): reference slack, candidate slack, excess, bound")
    for r in rows:
        cells = [f"{w.get('reference_slack_ms', 0) * 1e3:7.1f} {w.get('candidate_slack_ms', 0) * 1e3:7.1f} "
                 f"{w.get('excess_ms', 0) * 1e3:6.1f} {w.get('bound_ms', 0) * 1e3:6.1f}" for w in r["window"]]
        print(f"{r['numel']:>9} " + " | ".join(cells))
    print("timer alone (us): N, profiler, raw span, raw - empty-kernel call, raw - no-launch call; "
          "host ms per timed call: profiler (CUPTI records), the gated timer")
    for n in sizes:
        p = prof[n]
        print(f"{n:>9} {p['add']:8.2f} {p['raw_us']:8.2f} {p['raw_us'] - p['empty_kernel_us']:8.2f} "
              f"{p['raw_us'] - p['no_launch_us']:8.2f} {p['profiler_ms']:8.3f} {p['timer_ms']:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
