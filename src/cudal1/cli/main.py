"""``cudal1`` entry point: dispatches to one module per subcommand.

Exit codes: 0 when the command completed (whatever the verdicts); 2 for bad usage or bad input,
with a one-line ``cudal1: error: ...`` on stderr; 1 for an internal failure (one line, plus the
traceback only with ``CUDAL1_DEBUG=1``); 130 on Ctrl-C (everything recorded so far is kept).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import traceback

from cudal1 import __version__
from cudal1.cli import analyze, baseline, collect, compare, eval as eval_cmd, eval_suite, export, optimize, report, train, verify
from cudal1.cli.common import UsageError


class _Parser(argparse.ArgumentParser):
    """argparse with the one-line error contract (subparsers inherit the class)."""

    def error(self, message: str):  # type: ignore[override]
        print(f"cudal1: error: {message} (see '{self.prog} --help')", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cudal1", description="Trustworthy GPU-kernel evaluation and optimization.")
    parser.add_argument("--version", action="version", version=f"cudal1 {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in (optimize, eval_cmd, eval_suite, baseline, verify, report, analyze, export, compare, collect, train):
        module.register(sub)
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    from cudal1.config import ConfigError
    from cudal1.extras import MissingExtra
    from cudal1.harness.api import HarnessError
    from cudal1.store import StoreError
    from cudal1.tasks import TaskError

    return (UsageError, ConfigError, MissingExtra, TaskError, HarnessError, StoreError)


def _interrupt(signum: int, _frame: object) -> None:
    """SIGTERM as Ctrl-C: the batch stops, workers are stopped, every verdict recorded so far stays."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if in_main else None  # a kill stops like Ctrl-C
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("cudal1: interrupted (results recorded so far are kept)", file=sys.stderr)
        return 130
    except _user_errors() as exc:
        print(f"cudal1: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback wall
        if os.environ.get("CUDAL1_DEBUG"):
            traceback.print_exc()
        print(f"cudal1: internal error: {type(exc).__name__}: {exc} (set CUDAL1_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main())
