"""``cudal1 compare A B``: two result sets side by side, per task and in aggregate.

A and B are each a run directory or store, a JSONL in CUDA-L1's release format (``cudal1
export`` output or a published release; its claimed ``score_default``), or a ``verify_report.json``
(measured speedups).  Rows: each task's speedup over eager in A and B and B / A; aggregate: each
side's figures and, over shared tasks, geomeans and B's wins / ties / losses (a difference must
exceed 1%)."""

from __future__ import annotations

import argparse

from cudal1.cli.options import UsageError
from cudal1.cli.output import print_json, table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="put two runs or result files side by side", description=__doc__)
    p.add_argument("a", metavar="A", help="run dir/store, CUDA-L1 JSONL or verify_report.json")
    p.add_argument("b", metavar="B", help="run dir/store, CUDA-L1 JSONL or verify_report.json")
    p.add_argument("--format", choices=["text", "md", "json"], default="text", help="output (default text)")
    p.add_argument("--json", action="store_true", help="same as --format json (one JSON document, last line)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cudal1.report import ReportError
    from cudal1.report.side_by_side import compare, read_side

    try:
        doc = compare(read_side(args.a), read_side(args.b))
    except ReportError as exc:
        raise UsageError(str(exc)) from None
    fmt = "json" if args.json else args.format
    if fmt == "json":
        print_json(doc)
        return 0
    rows = [(r["task"], r["a"], r["b"], r["b_over_a"]) for r in doc["tasks"]]
    heads = ["task", "A x", "B x", "B / A"]
    agg = [
        (
            side, doc[side]["tasks"], doc[side]["ok"], doc[side]["geomean"], doc[side]["median"],
            doc[side]["fast_p"]["1.0"],
        )
        for side in ("a", "b")
    ]
    aheads = ["side", "tasks", "ok", "geomean", "median", "fast_1.0"]
    c = doc["common"]
    tail = (f"A: {doc['a']['source']} ({doc['a']['kind']}); B: {doc['b']['source']} ({doc['b']['kind']})\n"
            f"shared tasks {c['tasks']}: geomean A {c['a_geomean'] and round(c['a_geomean'], 3)}, "
            f"B {c['b_geomean'] and round(c['b_geomean'], 3)}; B faster on {c['b_wins']}, "
            f"tie {c['ties']}, slower on {c['b_losses']}")
    if fmt == "md":
        from cudal1.report.markdown import md_table

        print(md_table(heads, rows) + "\n\n" + md_table(aheads, agg) + "\n\n" + tail)
        return 0
    print(table(heads, rows) + "\n\n" + table(aheads, agg) + "\n\n" + tail)
    return 0
