"""GPU evidence as reports, in resumable steps.

Stages (run from the repository root on the CUDA machine; each writes under ``--out``):

* ``h100``: ``cudal1 verify`` over CUDA-L1's H100 release (``--release``, default
  ``.data/h100.jsonl``, a copy of ``../shared/cuda-l1/h100.jsonl``: 250 records) on all
  local GPUs, stopped after ``--budget`` seconds and resumed by the next run from that
  store (``--resume DIR``: a folder holding an earlier run's ``verify/cudal1.sqlite``), then the
  report of what is judged so far: ``h100_report.html`` / ``.md`` / ``.json``, and
  ``verify_report.json`` once verify finished.  At ~18 s per record and lane (2026-11-30), 250
  records take ~75 lane-minutes: about 40 minutes on two H200s.
* ``builtin``: the report of a builtin-policy KernelBench run directory (``--run``, e.g. the
  ``benchmarks/runs/stride5`` directory of ``benchmarks/builtin_kernelbench.py``): ``builtin_report.html`` /
  ``.md`` / ``.json``.  Needs no GPU (it reads the store; a run directory holds it as
  ``cudal1.sqlite.gz``, which ``builtin_kernelbench.py ... --report-only`` unpacks; an earlier
  run's state is restored as benchmarks/README.md, "Run state", says).

    python benchmarks/report_evidence.py h100 --out $OUT [--resume .runs/h100] [--budget 500]
    python benchmarks/report_evidence.py builtin --run .runs/kb --out $OUT

Then look at the HTML: ``python benchmarks/report_render.py``'s ``--screenshot`` path, or open it
in a browser; ``cudal1 report --format md`` prints the same figures for a terminal.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "cudal1.cli.main"]


def reports(run: Path, out: Path, stem: str) -> None:
    """HTML, Markdown and JSON reports of ``run`` as ``out/stem.*``."""
    subprocess.run([*CLI, "report", str(run), "--out", str(out / f"{stem}.html")], check=False)
    for fmt in ("md", "json"):
        with open(out / f"{stem}.{fmt}", "w") as f:
            subprocess.run([*CLI, "report", str(run), "--format", fmt], stdout=f, check=False)
    print((out / f"{stem}.md").read_text()[:3000])


def h100(args: argparse.Namespace, out: Path) -> int:
    vdir = out / "verify"
    vdir.mkdir(parents=True, exist_ok=True)
    if args.resume and (Path(args.resume) / "verify" / "cudal1.sqlite").exists():
        shutil.copy(Path(args.resume) / "verify" / "cudal1.sqlite", vdir / "cudal1.sqlite")
    cmd = [*CLI, "verify", args.release, "--device", args.device, "--out", str(vdir), *shlex.split(args.verify_args)]
    proc = subprocess.Popen(cmd, start_new_session=True)  # its own group: workers stop with it
    try:
        rc = proc.wait(timeout=args.budget)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)  # cudal1 stops cleanly on Ctrl-C, keeping every verdict so far
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        rc = 124  # cut short: the next run resumes from the store
    print(f"verify rc={rc}" + (" (budget reached; resume with --resume)" if rc == 124 else ""), flush=True)
    if (vdir / "verify_report.json").exists():
        shutil.copy(vdir / "verify_report.json", out / "verify_report.json")
    reports(vdir, out, "h100_report")
    return 0


def builtin(args: argparse.Namespace, out: Path) -> int:
    if not args.run:
        print("builtin needs --run DIR (the builtin benchmark's run directory or store)", file=sys.stderr)
        return 2
    reports(Path(args.run), out, "builtin_report")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=["h100", "builtin"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--release", default=".data/h100.jsonl", help="CUDA-L1 release JSONL (h100)")
    ap.add_argument("--resume", default=None, help="folder with an earlier run's verify/cudal1.sqlite (h100)")
    ap.add_argument("--budget", type=float, default=500, help="seconds of verify in this run (h100)")
    ap.add_argument("--device", default="cuda", help="judge device (h100; cpu only to try the script)")
    ap.add_argument("--run", default=None, help="builtin run directory or store (builtin)")
    ap.add_argument(
        "--verify-args", default="", help='extra cudal1 verify flags, e.g. "--preset kernelbench-v0 --gpus 0,1"'
    )
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return h100(args, out) if args.stage == "h100" else builtin(args, out)


if __name__ == "__main__":
    sys.exit(main())
