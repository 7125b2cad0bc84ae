"""Draining: a stop that keeps the work in flight.

An interrupt (Ctrl-C, SIGTERM) stops a batch at once: running workers are killed and their jobs
leave no verdict.  A *drain* lets them finish: once :func:`request` is called (from any thread or
a signal handler), no batch of this process starts another job, the running ones are judged and
recorded as usual (``on_result``), and the batch then raises :class:`Drained` for the jobs it never
started.  ``Drained`` is a ``KeyboardInterrupt``, so whatever already stops cleanly on Ctrl-C (a
run store, a search resumed later) stops the same way, with every finished verdict kept.

A drain lasts for the rest of the process (a later batch raises at once) unless :func:`clear` is
called.  Both backends honour it: the local one between jobs of a lane, Ray's between dispatches.
The CLI requests one on SIGUSR1.

``after(seconds, end=E)`` makes the drain a window that ends ``E`` seconds from now: until then
the local backend still starts a job that :func:`admits` (its expected seconds, with a margin, fit
in the time left: a job of a task judged before in this process, whose longest job is known); at
``E`` nothing starts any more.  Ray's backend starts nothing in the window.
"""

from __future__ import annotations

import math
import threading
import time

_REQUESTED = threading.Event()
_WINDOW_END: list[float] = []  # monotonic time a drain window ends (empty: none)
FIT_FACTOR, FIT_SLACK_S = 1.5, 5.0  # a job fits when FIT_FACTOR x its expected seconds + FIT_SLACK_S are left


class Drained(KeyboardInterrupt):
    """A drained batch stopped with jobs it never started (every started one has its verdict)."""


def request() -> None:
    """Start no new job in any batch of this process; the running ones finish."""
    _REQUESTED.set()


def requested() -> bool:
    """Whether a drain was requested."""
    return _REQUESTED.is_set()


def clear() -> None:
    """Batches start jobs again (a drain is over)."""
    _REQUESTED.clear()
    _WINDOW_END.clear()


def admits(expected_s: float) -> bool:
    """Whether a job expected to take ``expected_s`` seconds may start now: always without a drain,
    never after a plain one, in a drain window when it fits in the time the window has left."""
    if not _REQUESTED.is_set():
        return True
    if not _WINDOW_END:
        return False
    left = _WINDOW_END[0] - time.monotonic()
    return math.isfinite(expected_s) and FIT_FACTOR * expected_s + FIT_SLACK_S <= left


def after(seconds: float, end: float | None = None) -> threading.Timer:
    """Request a drain ``seconds`` from now (a daemon timer; cancel it to call it off); with
    ``end`` (seconds from now, later than ``seconds``), a window in which jobs that fit still start."""
    if end is not None and end > seconds:
        deadline = time.monotonic() + end

        def start_window() -> None:  # past the deadline nothing fits: admits says no from then on
            _WINDOW_END[:] = [deadline]
            request()

        timer = threading.Timer(max(0.0, seconds), start_window)
    else:
        timer = threading.Timer(max(0.0, seconds), request)
    timer.daemon = True
    timer.start()
    return timer


def check(missing: int) -> None:
    """Raise :class:`Drained` when a drain left ``missing`` jobs of a batch unstarted."""
    if missing and requested():
        raise Drained(f"drained: {missing} job(s) not started")
