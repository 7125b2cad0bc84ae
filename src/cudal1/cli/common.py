"""Helpers shared by subcommands: config from flags, tables, progress, one-line errors."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

from cudal1.config import EvalConfig


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


def add_judge_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("judge")
    g.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None, help="where to run (default auto)")
    g.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="hard limit per phase (construct, correctness, timing)")
    g.add_argument("--build-timeout", type=float, default=None, metavar="SECONDS", help="hard limit for importing/building a candidate")
    g.add_argument("--trials", type=int, default=None, metavar="N", help="correctness trials with fresh inputs (default 5)")
    g.add_argument("--timing-trials", type=int, default=None, metavar="N", help="maximum timed calls per model")
    g.add_argument("--preset", default=None, help="config preset: default, fast, thorough, kernelbench-v0")
    g.add_argument("--config", default=None, metavar="YAML", help="config file (unknown keys are errors)")
    g.add_argument("--seed", type=int, default=None, help="fix the input seed (default: secret, random per run)")


def config_from_args(args: argparse.Namespace) -> EvalConfig:
    if args.config and args.preset:
        raise UsageError("give --config or --preset, not both")
    if args.config:
        config = EvalConfig.from_yaml(args.config)
    elif args.preset:
        config = EvalConfig.preset(args.preset)
    else:
        config = EvalConfig()
    return config.replace(
        device=args.device,
        timeout_s=args.timeout,
        build_timeout_s=args.build_timeout,
        correctness_trials=args.trials,
        timing_trials=args.timing_trials,
        input_seed=args.seed,
    )


def read_text(path: str, what: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1e4 else f"{x:.0f}"
    return str(x)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A plain aligned text table."""
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    out = [line(headers), line(["-" * w for w in widths])]
    out.extend(line(r) for r in cells)
    return "\n".join(out)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def progress(total: int, desc: str, enabled: bool = True):
    """A tqdm bar on stderr (disabled when not a terminal or for --json)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="job", file=sys.stderr, disable=not enabled or not sys.stderr.isatty() or None)
