"""The progress display of long commands, on stderr: a live tqdm bar on a terminal, lines in a log.

Contract: a :class:`Progress` is the ``on_event`` listener of a
:class:`~cudal1.recorded.RecordedJudge` (thread-safe: verdicts arrive from lane threads).  Every
settled slot (a new verdict, one read back from the store, a slot that never reached the judge)
advances it by one; ``expect`` events grow the total; ``note`` events ("resuming: 7 already
judged") are printed as lines.  On a terminal the bar shows the count, the rate and tqdm's ETA,
with the last task and its verdict (``diag_matmul: ok 2.13x``) and the verdicts so far; in a log
(stderr not a terminal) each new verdict is one line with the count, the elapsed time and an
ETA.  ``quiet`` prints nothing.  Nothing goes to stdout, so ``--json`` output stays one line.

:func:`progress` is the older counter (a bar with ``update(n)``, or :class:`LogProgress` lines in
a log) for commands that count work themselves rather than listen to a recorded judge.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections import Counter
from typing import Any, TextIO

from cudal1.speedup import result_cell


def verdict_text(result: Any) -> str:
    """``ok 2.13x``, ``incorrect``, ... for one verdict."""
    status = getattr(result.status, "value", result.status)
    return f"{status} {result_cell(result)}" if result.speedup is not None else str(status)


class Progress:
    """See the module docstring."""

    def __init__(self, desc: str, total: int = 0, *, quiet: bool = False, stream: TextIO | None = None,
                 bar: bool | None = None) -> None:
        self.desc, self.total, self.quiet = desc, total, quiet
        self.stream = stream or sys.stderr
        self.done = 0
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        use_bar = self.stream.isatty() if bar is None else bar
        self._bar = None
        if use_bar and not quiet:
            from tqdm import tqdm

            self._bar = tqdm(total=total or None, desc=desc, unit="cand", file=self.stream, dynamic_ncols=True)

    # ---- events -------------------------------------------------------------------------
    def __call__(self, event: Any) -> None:
        with self._lock:
            if event.kind == "expect":
                self.total += event.count
                if self._bar is not None:
                    self._bar.total = self.total
                    self._bar.refresh()
            elif event.kind == "note":
                self.line(event.note)
            else:
                self._settled(event)

    def _settled(self, event: Any) -> None:
        self.done += 1
        if event.result is not None:
            text = verdict_text(event.result)
            self.counts[getattr(event.result.status, "value", event.result.status)] += 1
        else:
            text = event.note.splitlines()[0][:120] if event.note else "not judged"
            self.counts["not judged"] += 1
        if self._bar is not None:
            tally = ", ".join(f"{k} {v}" for k, v in self.counts.most_common())
            self._bar.set_postfix_str(f"{event.task[:40]}: {text[:40]} | {tally}", refresh=False)
            self._bar.update(1)
        elif not self.quiet and event.kind != "recorded":
            self._print(f"{self.desc} {self.done}/{self.total or '?'} {event.task}: {text} ({self._timing()})")

    def _timing(self) -> str:
        from tqdm import tqdm

        elapsed = time.monotonic() - self._t0
        out = f"{tqdm.format_interval(elapsed)} elapsed"
        if self.total and 0 < self.done < self.total:
            out += f", ETA {tqdm.format_interval(elapsed / self.done * (self.total - self.done))}"
        return out

    # ---- lines --------------------------------------------------------------------------
    def line(self, text: str) -> None:
        """A line for people (not with ``quiet``), above the bar when there is one."""
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.write(f"{self.desc}: {text}", file=self.stream)
        else:
            self._print(f"{self.desc}: {text}")

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def progress_for(args: argparse.Namespace, desc: str, total: int = 0):
    """The command's :class:`Progress` (silent with ``-q``; no bar with ``--json``)."""
    quiet = bool(getattr(args, "quiet", False))
    return Progress(desc, total, quiet=quiet, bar=False if getattr(args, "json", False) else None)


class LogProgress:
    """Progress for logs (stderr not a terminal): one line ``desc: done/total (elapsed)`` at most
    every ``every_s`` seconds and at the end, so a long batch in a log file shows it is alive."""

    def __init__(self, total: int, desc: str, every_s: float = 15.0) -> None:
        import time

        self.total, self.desc, self.every_s, self.n = total, desc, every_s, 0
        self._clock = time.monotonic
        self.t0 = self.last = self._clock()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self._clock()
        if now - self.last >= self.every_s or (self.total and self.n >= self.total):
            self.last = now
            print(f"{self.desc}: {self.n}/{self.total or '?'} ({now - self.t0:.0f} s)", file=sys.stderr, flush=True)

    def __enter__(self) -> "LogProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def progress(total: int, desc: str, enabled: bool = True):
    """A tqdm bar on stderr when it is a terminal (not for --json); periodic lines
    (:class:`LogProgress`) when stderr is a log file, --json or not."""
    from tqdm import tqdm

    if not sys.stderr.isatty():
        return LogProgress(total, desc)
    return tqdm(total=total, desc=desc, unit="job", file=sys.stderr, disable=not enabled or None)
