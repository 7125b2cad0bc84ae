"""The GPU lease: several judge workers may share one GPU, but nothing of theirs runs on it while
a candidate is timed.

Contract: one ``flock`` per physical GPU (``$TMPDIR/cudal1-leases/gpu<index>.lock``), shared by
every cudal1 process on the machine; on the CPU only when several workers share it (per cache
root).  The job's clean reference worker holds it for the whole job (the candidate's process acts
only when that worker asks it to): *shared* in phases that use the GPU (``reference``,
``construct``, ``correctness``), *exclusive* from ``timing`` to the verdict (from ``construct``
for a compile-mode baseline, whose torch.compile times kernels while it compiles), *none* during
start-up, the candidate's import, any build and, with ``EvalConfig.compile_off_lease``, a
torch.compile compile that does not autotune (``compile_cpu``).  A phase that uses the GPU starts only once its
lease is held; waiting is its own phase, ``lane``.  Linux drops a held ``flock`` when converting
it, even when a non-blocking attempt then fails, so an upgrade announces ``lane`` before the lock
is touched; giving the lease back is stamped before the lock goes; before any change of a held
lease the GPU is synchronized, so kernels a phase queued cannot run on into the next holder's
timing.  The kernel releases the lock when the worker exits, after its verdict is sent.

Order (``EvalConfig.lease_order``): ``flock`` serves waiters in no order, and grants a shared
request whenever no one holds the lease exclusive, so a worker waiting for it exclusive waits
until every shared holder happens to be gone at once while new ones keep coming.  Under
``choices-first`` every request but a release first passes a gate, a second lock beside the
lease's (``<lease>.gate``), and one for the exclusive lease in a phase other than ``timing`` (a
choice made by timing: an autotuner's or a compile's GPU steps, a chooser, a compile-mode
baseline's first call) holds the gate until it is served, so it waits only for the holders
already in; every other request holds the gate only while it tries the lease.  A timing waiter
does not hold the gate: it lets other workers' GPU phases run on meanwhile, which the GPU's
throughput needs (a gate for every exclusive request made the simulated batch no shorter).
``benchmarks/lease_order.py`` measures both orders with the real lease on the CPU.  No process
holds the lease while it waits for the gate (a change of a held lease gives it back first, as
``flock`` would), so the two locks cannot deadlock.  Only workers under ``choices-first`` pass the
gate: another run on the machine without it is not held back.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path
from typing import Callable

_OPS = {"none": fcntl.LOCK_UN, "shared": fcntl.LOCK_SH, "exclusive": fcntl.LOCK_EX}


def lease_path(device: str, gpu: int | None, workers_per_gpu: int, cache_root: Path) -> str | None:
    """The lock file of a lane's GPU lease: one per physical GPU on this machine; on the CPU only
    when several workers share it, per cache root."""
    if device == "cuda" and gpu is not None:
        root = Path(tempfile.gettempdir()) / "cudal1-leases"
        name = f"gpu{gpu}.lock"
    elif workers_per_gpu > 1:
        root, name = cache_root / "leases", "cpu.lock"
    else:
        return None
    root.mkdir(parents=True, exist_ok=True)
    try:
        os.chmod(root, 0o1777)  # other users' runs on this machine share the GPU's lease
    except OSError:
        pass
    return str(root / name)


class Lease:
    """A worker's hold on its GPU's lease.  ``phase(name)`` stamps a protocol phase (the parent
    reads it), ``sync()`` drains the worker's queued GPU work, ``release_memory()`` empties its
    allocator cache before it waits (the holders meanwhile get the GPU's memory);
    ``choices_first``: the order ``choices-first`` (module docstring)."""

    def __init__(self, path: str | None, phase: Callable[[str], None], sync: Callable[[], None],
                 release_memory: Callable[[], None], choices_first: bool = False) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666) if path else None
        self.gate = os.open(path + ".gate", os.O_RDWR | os.O_CREAT, 0o666) if path and choices_first else None
        self.held = "none"
        self._phase, self._sync, self._release_memory = phase, sync, release_memory

    def enter(self, name: str, want: str) -> None:
        """Hold the lease as ``want``, then start phase ``name`` (giving it back: the other way
        round, see the module docstring)."""
        if self.held != "none" and want != self.held:
            self._sync()
        if want == "none":
            self._phase(name)
            self._set(want)
        else:
            self._set(want, choice=want == "exclusive" and name != "timing")
            self._phase(name)

    def _set(self, want: str, choice: bool = False) -> None:
        if self.fd is None or want == self.held:
            return
        op = _OPS[want]
        if self.gate is not None and want != "none":
            self._through_gate(op, choice)
        elif self.held != "none" and want != "none":
            self._wait(op)  # a conversion drops the lock first: stamp 'lane' before touching it
        elif not _try(self.fd, op):
            self._wait(op)
        self.held = want

    def _through_gate(self, op: int, choice: bool) -> None:
        """Take the lease as ``op`` past the gate (``choices-first``): the gate first, never while
        holding the lease; then the lease, waiting for it with the gate held for a ``choice``,
        with the gate given back first otherwise.  ``lane`` is stamped before any wait, with a
        held lease still held."""
        assert self.fd is not None and self.gate is not None
        if self.held == "none" and _try(self.gate, fcntl.LOCK_EX):
            if _try(self.fd, op):
                fcntl.flock(self.gate, fcntl.LOCK_UN)
                return
            self._lane()
        else:
            self._lane(release=True)  # a held lease goes before the wait for the gate
            fcntl.flock(self.gate, fcntl.LOCK_EX)
        if choice:
            fcntl.flock(self.fd, op)  # no one else gets in meanwhile
            fcntl.flock(self.gate, fcntl.LOCK_UN)
            return
        got = _try(self.fd, op)
        fcntl.flock(self.gate, fcntl.LOCK_UN)
        if not got:
            fcntl.flock(self.fd, op)

    def _wait(self, op: int) -> None:
        self._lane()
        fcntl.flock(self.fd, op)

    def _lane(self, release: bool = False) -> None:
        """Stamp ``lane`` (with a held lease still held), then, with ``release``, give the lease
        back, and empty the allocator cache before the wait."""
        self._phase("lane")
        if release:
            assert self.fd is not None
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        self._release_memory()


def _try(fd: int, op: int) -> bool:
    """Take ``op`` on ``fd`` if that needs no wait."""
    try:
        fcntl.flock(fd, op | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
