"""``cudal1 report RUN [RUN ...]``: a run's figures as a self-contained HTML page, Markdown or JSON.

RUN is a run directory (holding ``cudal1.sqlite``) or a store file; several runs are merged per
task.  ``--out FILE.html`` writes the HTML page (plots inline, nothing fetched from the network;
needs ``pip install "cudal1[report]"``); ``--format json`` prints one JSON document on stdout
(``summary``, ``levels``, ``baselines``, ``tasks``, ``techniques``, ``environment``);
``--format md`` prints Markdown.  Metric definitions and conventions: docs/report.md."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cudal1.cli.options import UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="a run's figures as HTML, Markdown or JSON", description=__doc__)
    p.add_argument("runs", nargs="+", metavar="RUN_DIR_OR_DB", help="run directories or run store files")
    p.add_argument(
        "--out",
        default=None,
        metavar="FILE",
        help="the report file to write (one file, so --out names a file here; default: report.html for html, "
        "stdout for json and md)",
    )
    p.add_argument("--format", choices=["html", "json", "md"], default=None,
                   help="html (default with --out or without --format), json or md (printed unless --out)")
    p.add_argument(
        "--json", action="store_true", help="same as --format json: one JSON document as the last stdout line"
    )
    p.add_argument("--conventions", choices=["all-tasks", "measured", "cuda-l1"], default="all-tasks",
                   help="how tasks without a verified or faster program count in the speedup statistics: all-tasks "
                        "(at 1.0x), measured (left out: solved tasks only) or cuda-l1 (docs/report.md)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cudal1.report import ReportError, render_report

    if args.json and args.format not in (None, "json"):
        raise UsageError(f"--json and --format {args.format} disagree")
    fmt = "json" if args.json else args.format or (
        Path(args.out).suffix.lstrip(".") if args.out and Path(args.out).suffix in (".json", ".md") else "html")
    if args.out and Path(args.out).is_dir():
        raise UsageError(
            f"--out {args.out} is a directory; the report is one file (e.g. --out {Path(args.out) / 'report.html'})"
        )
    try:
        text = render_report(args.runs, fmt, args.conventions)
    except (ReportError, ImportError) as exc:
        raise UsageError(str(exc)) from None
    out = args.out or ("report.html" if fmt == "html" else None)
    if out is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return 0
    try:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)
    except OSError as exc:
        raise UsageError(f"cannot write {out}: {exc.strerror or exc}") from None
    print(f"report: {out}", file=sys.stderr if fmt != "html" else sys.stdout)
    return 0
