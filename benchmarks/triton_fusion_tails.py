"""How much faster the ``triton-fusion`` pass makes KernelBench's elementwise tails on this GPU.

Usage (from the repository root, on a CUDA machine)::

    python benchmarks/triton_fusion_tails.py [--tasks 2/81,2/4,2/7,2/20,1/88] [--json OUT.json]

For each task: the pass (with its own cost model) rewrites the reference, the fused and the eager
forward are timed with CUDA events (median of ``--reps`` calls after warm-up, no L2 flush: these
are the tails' steady-state figures, not the judge's), outputs are compared at the judge's fp32
tolerance, and the table printed last gives eager ms, fused ms and their ratio.  These tasks were
used to calibrate the pass's cost model, so the figures describe the pass, not an unbiased sample
(``benchmarks/builtin_kernelbench.py`` judges the policy on one).  ``CUDAL1_KERNELBENCH`` names
KernelBench's JSONL (default ``../shared/kernelbench/kernelbench.jsonl``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from cudal1.rewrite import ALGEBRAIC_REWRITES, rewrite_task
from cudal1.tables import table

REPO = Path(__file__).resolve().parents[1]


def timed(fn, inputs, reps: int) -> float:
    """Median milliseconds of one call (CUDA events, after three warm-up calls)."""
    with torch.no_grad():
        for _ in range(3):
            fn(*inputs)
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*inputs)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure(code: str, key: str, reps: int, workdir: Path) -> dict:
    outcome = rewrite_task(code, ALGEBRAIC_REWRITES + ("triton-fusion",))
    if not outcome.ok or "triton-fusion" not in outcome.applied:
        return {"task": key, "fused": False, "why": outcome.error or outcome.declined.get("triton-fusion", "")}
    path = workdir / f"tail_{key.replace('/', '_')}.py"
    path.write_text(code + "\n\n" + outcome.class_source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mod
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    ref = mod.Model(*mod.get_init_inputs()).cuda()
    new = mod.ModelNew(*mod.get_init_inputs()).cuda()
    new.load_state_dict(ref.state_dict())
    inputs = [t.cuda() if isinstance(t, torch.Tensor) else t for t in mod.get_inputs()]
    with torch.no_grad():
        torch.testing.assert_close(new(*inputs), ref(*inputs), atol=1e-4, rtol=1e-4)
    eager, fused = timed(ref, inputs, reps), timed(new, inputs, reps)
    return {"task": key, "fused": True, "eager_ms": eager, "fused_ms": fused, "speedup": eager / fused,
            "notes": outcome.notes.get("triton-fusion", [])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="2/81,2/4,2/7,2/20,1/88", help="level/problem ids")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    source = Path(os.environ.get("CUDAL1_KERNELBENCH", REPO.parent / "shared" / "kernelbench" / "kernelbench.jsonl"))
    rows = {(r["level"], r["problem_id"]): r["code"] for r in map(json.loads, source.open())}
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.tasks.split(","):
            level, pid = (int(x) for x in key.split("/"))
            results.append(measure(rows[(level, pid)], key, args.reps, Path(tmp)))
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    if args.json:
        Path(args.json).write_text(json.dumps({"environment": env, "results": results}, indent=1))
    print(env)
    print(table(["task", "eager ms", "fused ms", "eager / fused"],
                [[r["task"], f"{r['eager_ms']:.3f}", f"{r['fused_ms']:.3f}", f"{r['speedup']:.2f}"] if r["fused"]
                 else [r["task"], "-", "-", f"not fused: {r['why']}"] for r in results]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
