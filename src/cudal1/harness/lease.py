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
    allocator cache before it waits (the holders meanwhile get the GPU's memory)."""

    def __init__(self, path: str | None, phase: Callable[[str], None], sync: Callable[[], None],
                 release_memory: Callable[[], None]) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666) if path else None
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
            self._set(want)
            self._phase(name)

    def _set(self, want: str) -> None:
        if self.fd is None or want == self.held:
            return
        op = _OPS[want]
        if self.held != "none" and want != "none":
            self._wait(op)  # a conversion drops the lock first: stamp 'lane' before touching it
        else:
            try:
                fcntl.flock(self.fd, op | fcntl.LOCK_NB)
            except BlockingIOError:
                self._wait(op)
        self.held = want

    def _wait(self, op: int) -> None:
        self._phase("lane")
        self._release_memory()
        fcntl.flock(self.fd, op)
