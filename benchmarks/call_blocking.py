"""Whether a task's program waits for the device inside a call, and on what: the judge's gated
timer holds the GPU while the host issues a call, so a call that waits for the device (a
synchronize, a blocking copy, a ``cudaFree``) is *blocked* there and its GPU figure includes
host time (``short_waits`` in a result's cost figures).  This runs the program outside the judge,
in one process per (task, mode) with its own Inductor cache (``--judge-cache`` reuses a judge's
cache root, so the same compiled code and autotuning choices load), and reports per program:

- ``issue_ms``: the host's time to issue one call (median of 10, nothing queued ahead);
- ``behind_ms``: the same with a ``--behind-ms`` spin kernel queued ahead on the stream (the
  judge's timer's own, ``CudaTimer.spin``; ``spin_ms`` what it ran): a call that waits for the
  device takes about that long to issue;
- ``waits``: the CUDA runtime/driver calls of one call issued behind the spin that took over half
  of it (name, ms, the Python frames above it), from ``torch.profiler``;
- ``api``: every CUDA API name seen in one plain call, with its count;
- ``gpu_ms``: CUDA-event time per call (median of 20, back to back, for scale);
- ``code``: lines of Inductor's generated code (under the cache) that name a TMA descriptor,
  a synchronize, ``.item()``/``.cpu()`` or a host copy.

    python benchmarks/call_blocking.py kernelbench:level3/23 --source $CUDAL1_KERNELBENCH \\
        --modes eager,compile-max-autotune-no-cudagraphs --out $OUT/call_blocking.json

Programs run in parallel (``--parallel``), each in a fresh process; a table is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Lines of generated code that may wait for the device or copy through the host.
SUSPECT = re.compile(r"tma|TensorDescriptor|descriptor|synchronize|\.item\(\)|\.cpu\(\)|\.tolist\(\)|"
                     r"copy_\(.*cpu|pin_memory", re.IGNORECASE)


def generated_code(cache: Path, limit: int = 40) -> list[str]:
    """Suspect lines (:data:`SUSPECT`) in the Python files Inductor wrote under ``cache``."""
    hits: list[str] = []
    for path in sorted(cache.rglob("*.py")) if cache.is_dir() else []:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if SUSPECT.search(line) and not line.lstrip().startswith("#"):
                hits.append(f"{path.name}:{n}: {line.strip()[:160]}")
                if len(hits) >= limit:
                    return hits
    return hits


def _frames(event: Any, depth: int = 6) -> list[str]:
    """The names of the profiler events above ``event`` (innermost first)."""
    out, parent = [], getattr(event, "cpu_parent", None)
    while parent is not None and len(out) < depth:
        out.append(parent.name[:120])
        parent = parent.cpu_parent
    return out


def _is_cuda_api(name: str) -> bool:
    return name.startswith(("cuda", "cu")) and not name.startswith("cudal1")


def _events_ms(fn: Any, n: int) -> list[float]:
    """CUDA-event time of ``n`` calls of ``fn``, back to back."""
    import torch

    ends = []
    for _ in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        ends.append((s, e))
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in ends]


def probe(task_name: str, source: str | None, mode: str, behind_ms: float) -> dict[str, Any]:
    """One program in this process (its cache is the environment's)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from cudal1.harness.baselines import wrap_baseline
    from cudal1.harness.process_start import load_module, set_math_mode
    from cudal1.harness.timer import CudaTimer
    from cudal1.tasks import load_tasks

    set_math_mode("strict")
    task = load_tasks(task_name, source)[0]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "task_module.py"
        path.write_text(task.source)
        mod = load_module(str(path), "task_module")
    torch.manual_seed(0)
    model = mod.Model(*mod.get_init_inputs()).cuda().eval()
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in mod.get_inputs()]
    program = wrap_baseline(mode, model, torch.device("cuda")) if mode != "eager" else model
    timer = CudaTimer(torch.device("cuda"), flush_l2=False)
    spin_ns = int(behind_ms * 1e6)
    row: dict[str, Any] = {"task": task.name, "mode": mode}
    with torch.no_grad():
        t0 = time.perf_counter()
        program(*inputs)
        torch.cuda.synchronize()
        row["first_s"] = round(time.perf_counter() - t0, 2)
        for _ in range(5):
            program(*inputs)
        torch.cuda.synchronize()

        def issue(behind: bool) -> float:
            torch.cuda.synchronize()
            if behind:
                timer.spin(spin_ns)
            t = time.perf_counter()
            program(*inputs)
            dt = (time.perf_counter() - t) * 1e3
            torch.cuda.synchronize()
            return dt

        row["behind_ms"] = [round(issue(True), 2) for _ in range(3)]
        row["spin_ms"] = round(statistics.median(_events_ms(lambda: timer.spin(spin_ns), 3)), 2)
        row["issue_ms"] = round(statistics.median(issue(False) for _ in range(10)), 3)
        row["gpu_ms"] = round(statistics.median(_events_ms(lambda: program(*inputs), 20)), 4)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            program(*inputs)
            torch.cuda.synchronize()
        api: dict[str, int] = {}
        for ev in prof.events():
            if _is_cuda_api(ev.name):
                api[ev.name] = api.get(ev.name, 0) + 1
        row["api"] = dict(sorted(api.items(), key=lambda kv: -kv[1]))
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            timer.spin(spin_ns)
            with record_function("cudal1_call"):
                program(*inputs)
            torch.cuda.synchronize()
        events = prof.events()
        call = next((ev for ev in events if ev.name == "cudal1_call"), None)
        waits = []
        for ev in events:
            ms = ev.cpu_time_total / 1e3
            inside = call is not None and call.time_range.start <= ev.time_range.start <= call.time_range.end
            if inside and _is_cuda_api(ev.name) and ms > behind_ms / 2:
                waits.append({"api": ev.name, "ms": round(ms, 2), "under": _frames(ev)})
        row["waits"] = waits
    return row


def judge_cache(root: str, task_name: str, source: str | None) -> Path:
    """The folder under a judge's cache root where a task's baselines compile
    (``cudal1.harness.build.baseline_dir``)."""
    from cudal1.harness.build import baseline_dir
    from cudal1.harness.parent.plan import DevicePlan
    from cudal1.tasks import load_tasks

    task = load_tasks(task_name, source)[0]
    return baseline_dir(Path(root), task.source, DevicePlan.detect("cuda").arch_list)


def child_main(args: argparse.Namespace) -> int:
    try:
        row = probe(args.one[0], args.source, args.one[1], args.behind_ms)
    except Exception as exc:  # noqa: BLE001 - reported as the row
        row = {"task": args.one[0], "mode": args.one[1], "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    print("ROW " + json.dumps(row), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tasks", nargs="*", help="task selectors or files (load_tasks)")
    ap.add_argument("--source", default=None, help="the suite's jsonl (KernelBench)")
    ap.add_argument("--modes", default="eager,compile-max-autotune-no-cudagraphs")
    ap.add_argument("--repeat", type=int, default=1, help="fresh compiles per (task, mode)")
    ap.add_argument("--parallel", type=int, default=4, help="programs at once")
    ap.add_argument("--behind-ms", type=float, default=50.0)
    ap.add_argument("--judge-cache", default="", help="a judge's cache root (baseline_choices --keep): each task "
                    "loads its baselines' compiled code and choices from it (else a fresh cache per program)")
    ap.add_argument("--out", default="call_blocking.json")
    ap.add_argument("--one", nargs=2, metavar=("TASK", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        return child_main(args)
    jobs = [(t, m, r) for t in args.tasks for m in args.modes.split(",") if m for r in range(args.repeat)]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="cudal1-call-blocking-") as tmp:
        pending, running = list(enumerate(jobs)), []
        while pending or running:
            while pending and len(running) < args.parallel:
                n, (task, mode, rep) = pending.pop(0)
                cache = judge_cache(args.judge_cache, task, args.source) if args.judge_cache else Path(tmp) / str(n)
                env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
                       "TRITON_CACHE_DIR": str(cache / "triton")}
                cmd = [sys.executable, __file__, "--one", task, mode, "--behind-ms", str(args.behind_ms)]
                if args.source:
                    cmd += ["--source", args.source]
                proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                running.append((proc, task, mode, rep, cache))
            time.sleep(0.5)
            for item in [r for r in running if r[0].poll() is not None]:
                running.remove(item)
                proc, task, mode, rep, cache = item
                out, err = proc.communicate()
                found = [json.loads(line[4:]) for line in out.splitlines() if line.startswith("ROW ")]
                row = found[0] if found else {"task": task, "mode": mode, "error": err.strip()[-300:]}
                row.update(rep=rep, code=generated_code(cache / "inductor"))
                rows.append(row)
                Path(args.out).write_text(json.dumps(rows, indent=1))
    print(f"{'task':<28} {'mode':<36} {'rep':>3} {'first s':>7} {'issue':>7} {'behind':>18} {'gpu ms':>8}  waits")
    for row in rows:
        if "error" in row:
            print(f"{row['task'][:28]:<28} {row['mode'][:36]:<36} {row['rep']:>3}  error: {row['error'][:120]}")
            continue
        waits = "; ".join(f"{w['api']} {w['ms']} ms under {' < '.join(w['under'][:3])}" for w in row["waits"]) or "-"
        print(f"{row['task'][:28]:<28} {row['mode'][:36]:<36} {row['rep']:>3} {row['first_s']:>7} "
              f"{row['issue_ms']:>7} {str(row['behind_ms']):>18} {row['gpu_ms']:>8}  {waits[:300]}")
        if row["code"]:
            print("    code: " + " | ".join(row["code"][:6]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
