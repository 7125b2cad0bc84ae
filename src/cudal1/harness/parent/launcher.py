"""How worker children are started: one ``forkserver`` per judging process, preloaded with
``torch``, ``torch._dynamo`` and the worker modules (no CUDA context, nothing from the parent), so a
worker starts in milliseconds instead of importing torch again.

Contract: :func:`get_context` is the multiprocessing context every worker is started from
(``spawn`` where forkserver is unavailable).  :func:`prestart` starts the forkserver *now*, so its
preload (several seconds) overlaps whatever the caller does before its first job (the CLI calls
it before it imports torch itself).  This module imports no torch: the CLI can call it first.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import threading
from typing import Any, Iterator

# numpy.ma is what numpy's median loads on first use.  Not torch.utils.cpp_extension: importing it
# initialises CUDA, and a CUDA process cannot fork (the candidate's process wraps it lazily instead).
PRELOAD = ["torch", "torch._dynamo", "numpy.ma", "cudal1.harness.reference.worker", "cudal1.harness.child.worker",
           "cudal1.harness.parent.server_reaper"]  # the last: makes the server a subreaper (see that module)

_context: Any = None
_context_lock = threading.Lock()
_no_main = threading.local()  # set while this thread starts a worker or the forkserver


def _install_main_stripper() -> None:
    """Workers must not re-import the caller's ``__main__`` (multiprocessing's default): it
    would run the user's script inside the sandbox, fail for ``python -`` and cost time.
    The wrapper strips the main-module entries only while *this* module starts a worker."""
    from multiprocessing import spawn

    original = spawn.get_preparation_data
    if getattr(original, "_cudal1", False):
        return

    def get_preparation_data(name: str) -> dict:
        data = original(name)
        if getattr(_no_main, "active", False):
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
        return data

    get_preparation_data._cudal1 = True  # type: ignore[attr-defined]
    spawn.get_preparation_data = get_preparation_data


def get_context() -> Any:
    """The shared forkserver context (``spawn`` where forkserver is unavailable)."""
    global _context
    with _context_lock:
        if _context is None:
            _install_main_stripper()
            try:
                ctx = mp.get_context("forkserver")
                ctx.set_forkserver_preload(PRELOAD)
            except ValueError:
                ctx = mp.get_context("spawn")
            _context = ctx
        return _context


@contextlib.contextmanager
def launching() -> Iterator[None]:
    """Around starting a worker or the forkserver: the caller's ``__main__`` is left out of what
    the new process is told to prepare (see :func:`_install_main_stripper`)."""
    _no_main.active = True
    try:
        yield
    finally:
        _no_main.active = False


# The server's environment, read by what it preloads (libgomp reads it once, as torch loads it):
# idle OpenMP threads sleep instead of spinning.  With spinning threads, the reference worker's
# last parallel operation before a candidate's call (drawing its inputs) kept a core busy for
# milliseconds while the candidate computed: on a 2-core host an identical candidate read 0.23x
# (its threads waited a third of their runnable time for a CPU); both processes pay the same
# wake-ups instead.
SERVER_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
_server_lock = threading.Lock()


def ensure_server() -> None:
    """Start the forkserver if it is not running, with :data:`SERVER_ENV` in its environment
    (the caller's own environment is left as it was, a variable the caller set wins)."""
    if get_context().get_start_method() != "forkserver":
        return
    import os
    from multiprocessing import forkserver

    with _server_lock, launching():
        saved = {k: os.environ.get(k) for k in SERVER_ENV}
        os.environ.update({k: v for k, v in SERVER_ENV.items() if saved[k] is None})
        try:
            forkserver.ensure_running()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)


def prestart() -> None:
    """Start the forkserver now (returns at once; the preload runs in the server).  A no-op under
    ``spawn`` or when the server runs already; never raises (the first job would start it)."""
    try:
        ensure_server()
    except Exception:  # noqa: BLE001 - an optimisation only
        pass
