"""The order of the GPU lease's waiters (``EvalConfig.lease_order``, harness/lease.py): under
``choices-first`` a worker waiting for the lease exclusive to make a choice by timing (any phase
but ``timing``) stops new holders until it is served; under ``any`` (flock's own), and for a
timing waiter, a shared request gets in past it.  Each worker here is a thread with its own open
file description of the lock, which ``flock`` treats as another holder."""

from __future__ import annotations

import fcntl
import os
import threading
import time

import pytest

from cudal1.config import ConfigError, EvalConfig
from cudal1.harness.lease import Lease
from test_reference_worker import _try_lock  # a fresh open file description's try, released at once


class _Worker:
    """A :class:`Lease` whose phases are stamped with the time, and an event per phase name."""

    def __init__(self, path, choices_first: bool, stamps: list[tuple[str, str, float]], name: str) -> None:
        self.name, self.stamps = name, stamps
        self.seen: dict[str, threading.Event] = {}
        self.lease = Lease(str(path), self._phase, lambda: None, lambda: None, choices_first=choices_first)

    def _phase(self, phase: str) -> None:
        self.stamps.append((self.name, phase, time.monotonic()))
        self.event(phase).set()

    def event(self, phase: str) -> threading.Event:
        return self.seen.setdefault(phase, threading.Event())

    def enter_in_thread(self, phase: str, want: str) -> threading.Thread:
        self.event(phase)  # created before the thread can set it
        t = threading.Thread(target=self.lease.enter, args=(phase, want), daemon=True)
        t.start()
        return t


@pytest.mark.parametrize(("order", "phase"), [("any", "compile"), ("choices-first", "compile"),
                                            ("choices-first", "timing")])
def test_only_a_choice_waiting_under_choices_first_stops_new_holders(tmp_path, order, phase):
    path = tmp_path / "gpu0.lock"
    first = order == "choices-first" and phase != "timing"
    holder = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # a worker in a shared GPU phase
    fcntl.flock(holder, fcntl.LOCK_SH)
    stamps: list[tuple[str, str, float]] = []
    waiter = _Worker(path, order == "choices-first", stamps, "waiter")
    newcomer = _Worker(path, order == "choices-first", stamps, "newcomer")

    waiting = waiter.enter_in_thread(phase, "exclusive")
    assert waiter.event("lane").wait(5), "the waiter never started to wait"
    joining = newcomer.enter_in_thread("correctness", "shared")
    got_in = newcomer.event("correctness").wait(0.5)
    assert got_in is not first  # flock lets a shared request past the waiter; the gate, held, does not

    fcntl.flock(holder, fcntl.LOCK_UN)  # the first holder's phase ends
    if first:
        assert waiter.event(phase).wait(5)  # served before the newcomer ...
        assert not newcomer.event("correctness").is_set()
        waiter.lease.enter("import", "none")  # ... which gets in once the choice is made
        assert newcomer.event("correctness").wait(5)
    else:
        assert not waiter.event(phase).wait(0.3)  # still waits: the newcomer holds it shared
        newcomer.lease.enter("import", "none")
        assert waiter.event(phase).wait(5)
    waiting.join(5)
    joining.join(5)
    order_seen = [(who, p) for who, p, _ in stamps if p in (phase, "correctness")]
    assert order_seen == ([("waiter", phase), ("newcomer", "correctness")] if first
                          else [("newcomer", "correctness"), ("waiter", phase)])
    os.close(holder)


def test_holders_going_exclusive_at_once_under_choices_first_are_served_one_after_the_other(tmp_path):
    """No deadlock between the gate and the lease: a holder changing its lease gives it back
    before it waits for the gate, so shared holders that all go exclusive, to make a choice or to
    be timed, are all served, and their exclusive phases never overlap."""
    path = tmp_path / "gpu0.lock"
    stamps: list[tuple[str, str, float]] = []
    workers = [_Worker(path, True, stamps, f"w{i}") for i in range(4)]
    for w in workers:
        w.lease.enter("correctness", "shared")
    spans: dict[str, tuple[float, float]] = {}

    def go_exclusive(w: _Worker, phase: str) -> None:
        w.lease.enter(phase, "exclusive")
        began = time.monotonic()
        time.sleep(0.05)
        spans[w.name] = (began, time.monotonic())  # before the lease goes
        w.lease.enter("import", "none")

    threads = [threading.Thread(target=go_exclusive, args=(w, "compile" if i % 2 else "timing"), daemon=True)
               for i, w in enumerate(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads), "a holder never got the exclusive lease"
    ordered = sorted(spans.values())
    assert len(ordered) == 4 and all(a[1] <= b[0] for a, b in zip(ordered, ordered[1:]))
    assert all(phases.count("lane") == 1 for phases in
               ([p for who, p, _ in stamps if who == w.name] for w in workers))


@pytest.mark.parametrize("phase", ["compile", "timing"])
def test_an_upgrade_past_the_gate_ends_the_phase_while_its_shared_lock_is_held(tmp_path, phase):
    """As without the gate (test_reference_worker.py): ``lane`` is stamped before the shared
    lock goes, so no other worker can be timed while this one's GPU phase has not ended."""
    path = tmp_path / "gpu0.lock"
    other = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    still_held: list[bool] = []

    def probe(name: str) -> None:
        if name == "lane":
            still_held.append(not _try_lock(path, fcntl.LOCK_EX))

    lease = Lease(str(path), probe, lambda: None, lambda: None, choices_first=True)
    lease.enter("correctness", "shared")
    lease.enter(phase, "exclusive")
    assert still_held == [True] and lease.held == "exclusive"
    with pytest.raises(BlockingIOError):
        fcntl.flock(other, fcntl.LOCK_SH | fcntl.LOCK_NB)
    lease.enter("done", "none")
    fcntl.flock(other, fcntl.LOCK_SH | fcntl.LOCK_NB)  # given back
    os.close(other)


def test_the_lease_order_is_checked_and_changes_no_verdict():
    with pytest.raises(ConfigError, match="lease_order"):
        EvalConfig(lease_order="fifo").validate()
    EvalConfig(lease_order="choices-first").validate()
    assert EvalConfig(lease_order="choices-first").hash() == EvalConfig().hash()
