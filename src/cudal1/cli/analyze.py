"""``cudal1 analyze FILE [--reference REF] [--json]``: the techniques a candidate uses.

Labels come from a fixed vocabulary (CUDA-L1's eight families ``memory_layout``,
``memory_coalescing``, ``operation_fusion``, ``algebraic_shortcut``, ``block_config``,
``warp_reduction``, ``smem_register_caching``, ``async_execution``, plus ``torch_compile``,
``cuda_graph``, ``library_call``, ``cuda_kernel``, ``triton_kernel``, ``pytorch_rewrite``), found
statically from the code (Python AST, CUDA and Triton source; comments are never read; with
``--reference`` the two programs' operations are compared, which only adds labels).  A file that
is not Python is a usage error (exit 2).  ``--json``: the last stdout line is ``{"techniques": [...], "evidence":
{technique: [source lines]}}``."""

from __future__ import annotations

import argparse

from cudal1.cli.options import UsageError, read_text
from cudal1.cli.output import print_json, table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "analyze", help="label a candidate with the optimization techniques it uses", description=__doc__
    )
    p.add_argument("file", metavar="FILE", help="candidate source (.py)")
    p.add_argument("--reference", default=None, metavar="REF", help="the reference task, to find algebraic shortcuts")
    p.add_argument("--analysis", default=None, metavar="TEXT", help="a file with the model's Performance Analysis")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last stdout line")
    p.set_defaults(func=run)


def _python(path: str, what: str) -> str:
    """The text of ``path``, which must be Python source (a usage error otherwise)."""
    import ast

    text = read_text(path, what)
    try:
        ast.parse(text)
    except SyntaxError as exc:
        raise UsageError(f"{what} {path}: not valid Python (line {exc.lineno}: {exc.msg})") from None
    except ValueError as exc:  # e.g. null bytes
        raise UsageError(f"{what} {path}: not valid Python ({exc})") from None
    return text


def run(args: argparse.Namespace) -> int:
    from cudal1.report.techniques import analyze

    source = _python(args.file, "candidate")
    reference = _python(args.reference, "reference") if args.reference else None
    analysis = read_text(args.analysis, "analysis") if args.analysis else ""
    result = analyze(source, reference, analysis)
    if args.json:
        print_json(result.to_dict())
        return 0
    if not result.techniques:
        print("no technique recognised")
        return 0
    print(table(["technique", "evidence"], [(t, result.evidence[t][0][:100]) for t in result.techniques]))
    return 0
