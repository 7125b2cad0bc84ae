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
"""

from __future__ import annotations

import threading

_REQUESTED = threading.Event()


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


def after(seconds: float) -> threading.Timer:
    """Request a drain ``seconds`` from now (a daemon timer; cancel it to call it off)."""
    timer = threading.Timer(max(0.0, seconds), request)
    timer.daemon = True
    timer.start()
    return timer


def check(missing: int) -> None:
    """Raise :class:`Drained` when a drain left ``missing`` jobs of a batch unstarted."""
    if missing and requested():
        raise Drained(f"drained: {missing} job(s) not started")
