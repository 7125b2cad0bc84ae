"""The progress display of long commands, on stderr: a live tqdm bar on a terminal, lines in a log.

Contract: a :class:`Progress` is the ``on_event`` listener of a
:class:`~cudal1.recorded.RecordedJudge` (thread-safe: verdicts arrive from lane threads).  Every
settled slot (a new verdict, one read back from the store or shared with an identical candidate,
a slot that never reached the judge) advances it by one; ``expect`` events grow the total, which
counts resumed and deduplicated slots too; the count never passes the total (a slot nobody
announced grows it).  ``note`` events ("resuming: 7 already judged") are printed as lines.

The ETA is measured: the seconds per slot that cost work so far (new verdicts and unjudged
slots; not the ones read back, which cost nothing), times the slots left; none before the first
such slot.  On a terminal the bar shows the count, the elapsed time and that ETA, with the last
task and its verdict (``diag_matmul: ok 2.13x``) and the verdicts so far; in a log (stderr not a
terminal) each slot that cost work is one line with the count, the elapsed time and the ETA, and
closing prints the final count when the last line did not show it.  ``verbose`` (``-v``) adds a
line per new verdict with what the judge did (phases, build, wall time, both timings);
``verbose >= 2`` (``-vv``) adds its timed calls and the correctness figures.  ``quiet`` prints
nothing.  Nothing goes to stdout, so ``--json`` output stays one line.

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
from cudal1.tables import fmt


def verdict_text(result: Any) -> str:
    """``ok 2.13x``, ``incorrect``, ... for one verdict."""
    status = getattr(result.status, "value", result.status)
    return f"{status} {result_cell(result)}" if result.speedup is not None else str(status)


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60:02d}:{rest % 60:02d}"


def judge_detail(result: Any, verbose: int) -> list[str]:
    """What the judge did for one verdict, for ``-v`` (one line: wall time, build, phases, the
    two timings) and ``-vv`` (also its timed calls and the correctness figures)."""
    phases = ", ".join(f"{k} {v:.2f}" for k, v in (getattr(result, "phase_s", None) or {}).items())
    line = (f"  judge: {result.task_name} {result.candidate_hash[:12]}: {verdict_text(result)}"
            + (f" (95% CI {fmt(result.speedup_ci[0])}-{fmt(result.speedup_ci[1])})" if result.speedup_ci else "")
            + f"; {result.wall_s:.1f} s wall, build {result.build_s:.2f} s; phases (s): {phases or '-'}")
    lines = [line]
    ref, cand = result.reference, result.candidate
    if ref is not None and cand is not None:
        lines.append(f"  judge: reference {fmt(ref.median_ms)} ms (IQR {fmt(ref.iqr_ms)}, n={ref.trials}), candidate "
                     f"{fmt(cand.median_ms)} ms (IQR {fmt(cand.iqr_ms)}, n={cand.trials}), clock {cand.clock}"
                     + (f"; flags {', '.join(result.flags)}" if result.flags else ""))
    if result.message:
        lines.append(f"  judge: message: {result.message.splitlines()[0][:300]}")
    if verbose >= 2:
        for name, timing in (("reference", ref), ("candidate", cand)):
            if timing is not None and timing.samples_ms:
                lines.append(f"  judge: {name} calls (ms): " + " ".join(fmt(x) for x in timing.samples_ms))
        for name, fig in (result.figures or {}).items():
            parts = fig.items() if isinstance(fig, dict) else [("", fig)]  # a figure of one number
            lines.append(f"  judge: {name} figure: " + ", ".join(
                f"{k} {fmt(v) if isinstance(v, float) else v}".strip() for k, v in parts))
        c = result.correctness
        if c.trials:
            lines.append(f"  judge: correctness {c.passed}/{c.trials} trials, rule {c.rule}, max abs err "
                         f"{fmt(c.max_abs_error)}, max rel err {fmt(c.max_rel_error)}, bound {fmt(c.bound)}, "
                         f"{c.rechecked} timed outputs re-checked")
    return lines


class Progress:
    """See the module docstring."""

    def __init__(self, desc: str, total: int = 0, *, quiet: bool = False, stream: TextIO | None = None,
                 bar: bool | None = None, verbose: int = 0) -> None:
        self.desc, self.total, self.quiet, self.verbose = desc, total, quiet, verbose
        self.stream = stream or sys.stderr
        self.done = 0  # settled slots
        self.worked = 0  # settled slots that cost work now (new verdicts, unjudged slots)
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        self._shown = 0  # the count on the last line printed (log mode)
        use_bar = self.stream.isatty() if bar is None else bar
        self._bar = None
        if use_bar and not quiet:
            from tqdm import tqdm

            # tqdm's own rate and ETA would count slots read back from the store as work: ours instead
            self._bar = tqdm(total=total or None, desc=desc, unit="cand", file=self.stream, dynamic_ncols=True,
                             bar_format="{desc}: {n_fmt}/{total_fmt} |{bar}| {elapsed}{postfix}")

    # ---- events -------------------------------------------------------------------------
    def __call__(self, event: Any) -> None:
        with self._lock:
            if event.kind == "expect":
                self._grow(self.total + event.count)
            elif event.kind == "note":
                self.line(event.note)
            else:
                self._settled(event)

    def _grow(self, total: int) -> None:
        self.total = total
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def _settled(self, event: Any) -> None:
        self.done += 1
        if self.done > self.total:  # a slot nobody announced: the total was short
            self._grow(self.done)
        if event.kind != "recorded":
            self.worked += 1
        if event.result is not None:
            text = verdict_text(event.result)
            self.counts[getattr(event.result.status, "value", event.result.status)] += 1
        else:
            text = event.note.splitlines()[0][:120] if event.note else "not judged"
            self.counts["not judged"] += 1
        if self._bar is not None:
            tally = ", ".join(f"{k} {v}" for k, v in self.counts.most_common())
            eta = self.eta()
            self._bar.set_postfix_str((f"ETA {_clock(eta)} | " if eta is not None else "")
                                      + f"{event.task[:40]}: {text[:40]} | {tally}", refresh=False)
            self._bar.update(1)
        elif not self.quiet and event.kind != "recorded":
            self._print(f"{self.desc} {self.done}/{self.total or '?'} {event.task}: {text} ({self._timing()})")
            self._shown = self.done
        if self.verbose and event.kind == "verdict" and event.result is not None and not self.quiet:
            for line in judge_detail(event.result, self.verbose):
                self._write(line)

    def eta(self) -> float | None:
        """Seconds left: the elapsed seconds per slot that cost work, times the slots left."""
        if not self.worked or not self.total or self.done >= self.total:
            return None
        return (time.monotonic() - self._t0) / self.worked * (self.total - self.done)

    def _timing(self) -> str:
        out = f"{_clock(time.monotonic() - self._t0)} elapsed"
        eta = self.eta()
        return out + (f", ETA {_clock(eta)}" if eta is not None else "")

    # ---- lines --------------------------------------------------------------------------
    def line(self, text: str) -> None:
        """A line for people (not with ``quiet``), above the bar when there is one."""
        if not self.quiet:
            self._write(f"{self.desc}: {text}")

    def _write(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            self._print(text)

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif not self.quiet and self.done and self._shown != self.done:
            read_back = self.done - self.worked
            self._print(
                f"{self.desc} {self.done}/{self.total}: {self.worked} settled now, {read_back} read back from the "
                f"run store or shared with an identical candidate ({self._timing()})"
            )
            self._shown = self.done

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def progress_for(args: argparse.Namespace, desc: str, total: int = 0):
    """The command's :class:`Progress` (silent with ``-q``; no bar with ``--json``; judge details
    with ``-v``/``-vv``)."""
    quiet = bool(getattr(args, "quiet", False))
    return Progress(desc, total, quiet=quiet, bar=False if getattr(args, "json", False) else None,
                    verbose=int(getattr(args, "verbose", 0) or 0))


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
