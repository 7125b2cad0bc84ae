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

``after(seconds, end=E)`` sets a *deadline* ``E`` seconds from now at once and requests the drain
at ``seconds``: from now on the local backend starts only a job that :func:`admits` (its expected
seconds, with a margin, fit before the deadline), so no job starts that a hard stop at ``E`` plus a
little would cut and lose; a job with no expected time yet (nothing like it judged in this process)
is sized by the caller's stand-in until the drain, and never starts after it; one too long for
any window with its margin starts only early in one (:func:`admits`).  Once nothing left
fits, the batch requests the drain itself (:func:`out_of_time`): time only runs out.  Ray's backend
honours the drain alone, not the deadline.
"""

from __future__ import annotations

import math
import threading
import time

_REQUESTED = threading.Event()
_DEADLINE: list[float] = []  # [monotonic time it was set, time by which a started job should have ended]
FIT_FACTOR, FIT_SLACK_S = 1.5, 5.0  # a job fits when FIT_FACTOR x its expected seconds + FIT_SLACK_S are left
START_SHARE = 0.1  # a job whose margin fits no window starts only in this first share of one (see admits)


class Drained(KeyboardInterrupt):
    """A drained batch stopped with jobs it never started (every started one has its verdict).
    ``stats``: the batch's ``BatchStats`` over the jobs it ran (local backend; else None)."""

    stats = None


def request() -> None:
    """Start no new job in any batch of this process; the running ones finish."""
    _REQUESTED.set()


def requested() -> bool:
    """Whether a drain was requested."""
    return _REQUESTED.is_set()


def clear() -> None:
    """Batches start jobs again (a drain is over)."""
    _REQUESTED.clear()
    _DEADLINE.clear()


def admits(expected_s: float, stand_in_s: float = math.inf) -> bool:
    """Whether a job expected to take ``expected_s`` seconds may start now.  Without a deadline:
    unless a drain was requested.  With one: when ``FIT_FACTOR`` x its seconds + ``FIT_SLACK_S``
    fit in the time left; a job with no expected time (``inf``) is sized by ``stand_in_s`` before
    the drain (none either: it starts) and never starts after it.  A job whose margin is longer
    than the whole window (set to deadline) would never start in any call, and its run never
    finish: it starts in the window's first ``START_SHARE`` if its seconds alone fit the time left
    (level3/23's 353 s max-autotune compile, x 1.5 + 5 s = 535 s, in a 540 s call's 525 s window)."""
    if not _DEADLINE:
        return not _REQUESTED.is_set()
    if not math.isfinite(expected_s):
        if _REQUESTED.is_set():
            return False
        if not math.isfinite(stand_in_s):
            return True
        expected_s = stand_in_s
    set_at, end = _DEADLINE
    now, need = time.monotonic(), FIT_FACTOR * expected_s + FIT_SLACK_S
    if need <= end - now:
        return True
    window = end - set_at
    return need > window and now - set_at <= START_SHARE * window and expected_s + FIT_SLACK_S <= end - now


def bounding() -> bool:
    """Whether a drain or a deadline may keep a job from starting (else :func:`admits` is true)."""
    return _REQUESTED.is_set() or bool(_DEADLINE)


def out_of_time(any_fits: bool) -> bool:
    """Whether a batch whose pending jobs ``any_fits`` (by :func:`admits`) should start nothing
    more: none fits and a drain was requested or a deadline is set (with one, none ever will:
    the estimates only grow and the time left only shrinks).  A deadline's end requests the drain
    here, so the batch raises ``Drained`` and every later batch stops at once."""
    if any_fits or not bounding():
        return False
    _REQUESTED.set()
    return True


def after(seconds: float, end: float | None = None) -> threading.Timer:
    """Request a drain ``seconds`` from now (a daemon timer; cancel it to call it off); with
    ``end`` (seconds from now, later than ``seconds``), a deadline from now on, by which every job
    started should have ended (:func:`admits`)."""
    if end is not None and end > seconds:
        now = time.monotonic()
        _DEADLINE[:] = [now, now + end]
    timer = threading.Timer(max(0.0, seconds), request)
    timer.daemon = True
    timer.start()
    return timer


def check(missing: int) -> None:
    """Raise :class:`Drained` when a drain left ``missing`` jobs of a batch unstarted."""
    if missing and requested():
        raise Drained(f"drained: {missing} job(s) not started")
