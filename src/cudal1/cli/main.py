"""``cudal1`` entry point: dispatches to one module per subcommand.

Exit codes: 0 when the command completed (whatever the verdicts); 2 for bad usage or bad input,
with a one-line ``cudal1: error: ...`` on stderr; 1 for a failure: an endpoint that does not
answer, a run whose policy produced no completion at all (one line saying why), or an internal
error (one line, plus the traceback only with ``CUDAL1_DEBUG=1``); 130 on Ctrl-C or SIGTERM
(everything recorded so far is kept). Logging: ``-v``/``-vv``/``-q`` before or after the
subcommand, else ``$CUDAL1_LOG_LEVEL``.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading
import traceback
from typing import Any

from cudal1 import __version__
from cudal1.cli import (
    analyze,
    baseline,
    collect,
    compare,
    evaluate,
    export,
    judge,
    judge_suite,
    optimize,
    profile,
    report,
    train,
    verify,
)
from cudal1.cli.options import RunFailure, UsageError

_RST = re.compile(r"``([^`]+)``|:(?:func|class|meth|mod|data|attr):`~?([^`]+)`")


def plain(text: str | None) -> str | None:
    """Help text without reStructuredText markup (module docstrings double as descriptions)."""
    return _RST.sub(lambda m: m.group(1) or m.group(2).rsplit(".", 1)[-1], text) if text else text


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions keep their paragraphs; RST markup is dropped; help lines without their
    default get it appended (flags whose default is None say theirs in the text)."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain(text) or "")

    def _get_help_string(self, action: argparse.Action) -> str:
        text = plain(action.help) or ""
        if "default" not in text and action.default not in (None, False, argparse.SUPPRESS) and action.option_strings:
            text += " (default: %(default)s)"
        return text


class _Parser(argparse.ArgumentParser):
    """argparse with the one-line error contract and the shared help format (subparsers inherit
    the class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # every parser gets the one format (a raw-description request is a subset of it)
        if kwargs.get("formatter_class") in (None, argparse.HelpFormatter, argparse.RawDescriptionHelpFormatter):
            kwargs["formatter_class"] = _Formatter
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        print(f"cudal1: error: {message} (see '{self.prog} --help')", file=sys.stderr)
        raise SystemExit(2)


def _log_flags(p: argparse.ArgumentParser, top: bool) -> None:
    """``-v``/``-q``, accepted before or after the subcommand (a subcommand's own copy leaves the
    value alone when not given there)."""
    default = 0 if top else argparse.SUPPRESS
    taken = set(p._option_string_actions)  # a subcommand that defines its own spelling keeps it
    if not taken & {"-v", "--verbose"}:
        p.add_argument("-v", "--verbose", action="count", default=default,
                       help="log more: -v progress details (INFO), -vv debugging (DEBUG); also $CUDAL1_LOG_LEVEL")
    if not taken & {"-q", "--quiet"}:
        p.add_argument("-q", "--quiet", action="store_true", default=False if top else argparse.SUPPRESS,
                       help="no progress display; errors only")


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases map to the same parser
                out += [sub, *_subparsers(sub)]
    return out


DESCRIPTION = """Trustworthy GPU-kernel evaluation and optimization.

Conventions shared by every command: --out is where the command writes (a run directory for
commands that make a run: optimize, judge-suite, verify, evaluate, baseline, train; a file for
commands that make one file: report --out, export, collect); --json prints one JSON document as
the last stdout line; --config FILE is the command's settings file, in the format of the
OUT/config.yaml that its runs save (feeding that file back reproduces the run); -v/-q anywhere;
exit 0 when the command completed, 2 for bad input, 1 for a failure (a run that got no
completion, an internal error), 130 when interrupted."""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cudal1", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"cudal1 {__version__}")
    _log_flags(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in (
        optimize, judge, judge_suite, baseline, verify, report, analyze, export, compare, collect, train,
        evaluate, profile,
    ):
        module.register(sub)
    for p in _subparsers(parser):
        _log_flags(p, top=False)
    return parser


def log_level(args: argparse.Namespace) -> int:
    """-q: errors only; -v: INFO; -vv: DEBUG; else $CUDAL1_LOG_LEVEL (a name or a number), else WARNING."""
    if getattr(args, "quiet", False):
        return logging.ERROR
    verbose = getattr(args, "verbose", 0) or 0
    if verbose:
        return logging.DEBUG if verbose > 1 else logging.INFO
    env = os.environ.get("CUDAL1_LOG_LEVEL", "").strip()
    if env:
        level = int(env) if env.isdigit() else logging.getLevelName(env.upper())
        if isinstance(level, int):
            return level
        print(f"cudal1: warning: CUDAL1_LOG_LEVEL={env!r} is not a logging level; using WARNING", file=sys.stderr)
    return logging.WARNING


# Exceptions that are the user's fault: (module, class name).  Looked up only in modules already
# imported when the error is caught, so a command that refuses bad input early never imports the
# judge (and torch) just to classify it: an exception of a class from a module never imported
# cannot have been raised.
USER_ERRORS = (("cudal1.config", "ConfigError"), ("cudal1.extras", "MissingExtra"), ("cudal1.tasks", "TaskError"),
               ("cudal1.harness.parent.plan", "HarnessError"), ("cudal1.store", "StoreError"))


def _user_errors() -> tuple[type[BaseException], ...]:
    loaded = [getattr(sys.modules[m], name, None) for m, name in USER_ERRORS if m in sys.modules]
    return (UsageError, *[c for c in loaded if isinstance(c, type)])


def one_line(exc: BaseException) -> str:
    """An error message on one line (a YAML parser's, for one, spans several)."""
    return " ".join(str(exc).split())


def _interrupt(signum: int, _frame: object) -> None:
    """SIGTERM as Ctrl-C: the batch stops, workers are stopped, every verdict recorded so far stays."""
    raise KeyboardInterrupt


def _drain(signum: int, _frame: object) -> None:
    """SIGUSR1: judged jobs finish and are kept, no new one starts (:mod:`cudal1.harness.parent.drain`)."""
    from cudal1.harness.parent import drain

    if not drain.requested():
        print("cudal1: draining: the running verdicts finish, no other starts", file=sys.stderr, flush=True)
    drain.request()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=log_level(args), format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if in_main else None  # a kill stops like Ctrl-C
    previous_usr1 = signal.signal(signal.SIGUSR1, _drain) if in_main else None
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt as exc:
        from cudal1.harness.parent.drain import Drained  # threading only: no judge imported

        what = "drained" if isinstance(exc, Drained) else "interrupted"
        print(f"cudal1: {what} (results recorded so far are kept)", file=sys.stderr)
        return 130
    except _user_errors() as exc:
        print(f"cudal1: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except RunFailure as exc:
        print(f"cudal1: error: {one_line(exc)}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback wall
        if os.environ.get("CUDAL1_DEBUG"):
            traceback.print_exc()
        print(
            f"cudal1: internal error: {type(exc).__name__}: {exc} (set CUDAL1_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 1
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
            signal.signal(signal.SIGUSR1, previous_usr1 if previous_usr1 is not None else signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main())
