"""The GPU lease's waiters under ``flock``'s order (``any``) and ``choices-first``
(``EvalConfig.lease_order``, src/cudal1/harness/lease.py), on this machine's CPU: worker processes
take the real :class:`cudal1.harness.lease.Lease` on one lock file, and sleeps stand for their
GPU work, so the figures are the lease's own, not a GPU's.

Two scenarios, each under both orders:

- ``turns``: three processes hold the lease shared 20-80 ms at a time with 5 ms between (workers
  in their construct and correctness phases), and a fourth asks for it exclusive 30 times, holding
  it 5 ms each (a max-autotune compile's GPU steps).  Prints that waiter's waits.  (With four
  holders the ``any`` arm's waits grow to seconds each: minutes in all.)
- ``judge``: a batch: every worker runs ``--jobs`` jobs as the judge does, shared 50-300 ms
  (reference, construct, correctness), exclusive 50-150 ms (timing), none 20-100 ms (import,
  compiling), and one of them first runs 40 autotuning steps (exclusive 5-15 ms, then 20 ms of
  compiling elsewhere).  Prints the waits for the exclusive lease, the autotuning's wall, the
  batch's wall (its device seconds), and the share of it in which someone held the lease.

    python benchmarks/lease_order.py                 # 4 workers, 30 jobs each
    python benchmarks/lease_order.py --workers 5 --jobs 60 --json lease_order.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ORDERS = ("any", "choices-first")


def _lease(path: str, order: str, waits: list[float]) -> Any:
    """A Lease whose waits (from its ``lane`` stamp to the next phase) are appended to ``waits``."""
    from cudal1.harness.lease import Lease

    since: list[float] = []

    def phase(name: str) -> None:
        if name == "lane":
            since.append(time.monotonic())
        elif since:
            waits.append(time.monotonic() - since.pop())

    return Lease(path, phase, lambda: None, lambda: None, choices_first=order == "choices-first")


def _holder(path: str, order: str, stop: Any, seed: int, out: Any) -> None:
    """``turns``: hold the lease shared 20-80 ms, give it back for 5 ms, until ``stop``."""
    rng, waits = random.Random(seed), []
    lease = _lease(path, order, waits)
    while not stop.is_set():
        lease.enter("correctness", "shared")
        time.sleep(rng.uniform(0.02, 0.08))
        lease.enter("import", "none")
        time.sleep(0.005)
    out.put(("holder", waits))


def turns(path: str, order: str, holders: int = 3, asks: int = 30) -> dict[str, Any]:
    stop, out = mp.Event(), mp.Queue()
    procs = [mp.Process(target=_holder, args=(path, order, stop, i, out)) for i in range(holders)]
    for p in procs:
        p.start()
    time.sleep(0.3)
    waits: list[float] = []
    lease = _lease(path, order, waits)
    for _ in range(asks):
        lease.enter("compile", "exclusive")
        time.sleep(0.005)
        lease.enter("compile_cpu", "none")
        time.sleep(0.01)
    stop.set()
    for _ in procs:
        out.get()
    for p in procs:
        p.join()
    asked = waits + [0.0] * (asks - len(waits))  # a request served at once stamps no lane
    return {"asks": asks, **_spread(asked)}


def _judge_worker(path: str, order: str, jobs: int, seed: int, autotune_steps: int, out: Any) -> None:
    rng, waits, held = random.Random(seed), [], []
    lease = _lease(path, order, waits)
    exclusive_waits: list[float] = []
    autotune_s = None
    if autotune_steps:
        t0 = time.monotonic()
        for _ in range(autotune_steps):
            n = len(waits)
            lease.enter("compile", "exclusive")
            exclusive_waits += waits[n:]
            a = time.monotonic()
            time.sleep(rng.uniform(0.005, 0.015))
            held.append((a, time.monotonic()))
            lease.enter("compile_cpu", "none")
            time.sleep(0.02)
        autotune_s = time.monotonic() - t0
    for _ in range(jobs):
        lease.enter("correctness", "shared")
        a = time.monotonic()
        time.sleep(rng.uniform(0.05, 0.3))
        n = len(waits)
        lease.enter("timing", "exclusive")
        exclusive_waits += waits[n:]
        b = time.monotonic()
        time.sleep(rng.uniform(0.05, 0.15))
        held += [(a, b), (b, time.monotonic())]
        lease.enter("import", "none")
        time.sleep(rng.uniform(0.02, 0.1))
    out.put({"exclusive_waits": exclusive_waits, "held": held, "autotune_s": autotune_s})


def judge(path: str, order: str, workers: int, jobs: int, steps: int = 40) -> dict[str, Any]:
    out = mp.Queue()
    t0 = time.monotonic()
    procs = [mp.Process(target=_judge_worker, args=(path, order, jobs, i, steps if i == 0 else 0, out))
             for i in range(workers)]
    for p in procs:
        p.start()
    got = [out.get() for _ in procs]
    for p in procs:
        p.join()
    wall = time.monotonic() - t0
    waits = [w for g in got for w in g["exclusive_waits"]]
    return {"jobs": jobs * workers, "wall_s": round(wall, 2),
            "held_share": round(_union([s for g in got for s in g["held"]]) / wall, 3),
            "autotune_s": round(next(g["autotune_s"] for g in got if g["autotune_s"] is not None), 2),
            "exclusive_waits": len(waits), **_spread(waits)}


def _union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def _spread(waits: list[float]) -> dict[str, float]:
    if not waits:
        return {"median_ms": 0.0, "p90_ms": 0.0, "max_ms": 0.0, "total_s": 0.0}
    w = sorted(waits)
    return {"median_ms": round(statistics.median(w) * 1e3, 1), "p90_ms": round(w[int(0.9 * (len(w) - 1))] * 1e3, 1),
            "max_ms": round(w[-1] * 1e3, 1), "total_s": round(sum(w), 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=4, help="workers sharing the lease (default 4)")
    ap.add_argument("--jobs", type=int, default=30, help="jobs per worker in each judge arm (default 30)")
    ap.add_argument("--asks", type=int, default=30, help="the turns waiter's requests (default 30)")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    if args.workers < 2 or args.jobs < 1 or args.asks < 1:
        print("error: --workers needs at least 2, --jobs and --asks at least 1", file=sys.stderr)
        return 2
    mp.set_start_method("spawn", force=True)  # each worker a process of its own, as the judge's
    figures: dict[str, Any] = {"workers": args.workers, "jobs": args.jobs, "asks": args.asks, "turns": {}, "judge": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for order in ORDERS:
            path = str(Path(tmp) / f"{order}.lock")
            figures["turns"][order] = turns(path, order, asks=args.asks)
            figures["judge"][order] = judge(path, order, args.workers, args.jobs)
    print(f"one lease on the CPU, sleeps standing for GPU work; the judge batch at {args.workers} workers")
    print(f"turns: one worker asks for the lease exclusive {args.asks} times while three hold it shared in turns")
    for order, f in figures["turns"].items():
        print(f"  {order:16s} wait median {f['median_ms']:7.1f} ms, p90 {f['p90_ms']:7.1f} ms, "
              f"max {f['max_ms']:7.1f} ms, total {f['total_s']:5.2f} s")
    print(f"judge: {args.jobs} jobs per worker of shared, exclusive and no-lease phases, one worker "
          "autotuning first (40 exclusive steps); the batch ends when all are done")
    for order, f in figures["judge"].items():
        print(f"  {order:16s} exclusive waits: median {f['median_ms']:6.1f} ms, p90 {f['p90_ms']:6.1f} ms, "
              f"max {f['max_ms']:7.1f} ms; autotuning {f['autotune_s']:5.2f} s; batch {f['wall_s']:5.2f} s, "
              f"lease held {f['held_share']:.0%} of it")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
