"""``cudal1 export RUN --format cuda-l1 --out FILE.jsonl``: a run's best kernels in CUDA-L1's
release format (``level_id``, ``task_id``, ``ref_code``, ``custom_code``, ``score_*`` from the
measured baselines), one line per task; ``cudal1 verify FILE.jsonl`` re-judges it."""

from __future__ import annotations

import argparse

from cudal1.cli.options import UsageError
from cudal1.cli.output import print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a run's best kernels in CUDA-L1's release format", description=__doc__)
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories or run store files (merged)")
    p.add_argument("--format", choices=["cuda-l1"], default="cuda-l1", help="output format (default cuda-l1)")
    p.add_argument("--out", required=True, metavar="FILE.jsonl", help="output file")
    p.add_argument("--json", action="store_true", help="print {records, with_code, out} as the last stdout line")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cudal1.report import ReportError, load_runs
    from cudal1.report.export import cuda_l1_records, export

    try:
        data = load_runs(args.runs)
        written = export(data, args.out, args.format)
    except ReportError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot write {args.out}: {exc.strerror or exc}") from None
    with_code = sum(1 for r in cuda_l1_records(data) if r["custom_code"])
    if args.json:
        print_json({"records": written, "with_code": with_code, "out": args.out})
    else:
        print(f"{written} record(s), {with_code} with a verified kernel: {args.out}")
    return 0
