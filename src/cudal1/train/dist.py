"""Several processes (``torchrun`` / ``accelerate launch``): who does what, and waiting for it.

Contract: the rank facts come from the environment the launchers set (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``); without them this is one process of rank 0 and every function here is a no-op
(nothing is imported, nothing initialised).  :func:`barrier` uses ``torch.distributed`` when it
is initialised and otherwise lets ``accelerate.PartialState`` initialise the process group
(backend gloo on CPUs, NCCL on GPUs; the trainers then reuse that group, so its timeout replaces
their ``ddp_timeout``) with a timeout of ``CUDAL1_DIST_TIMEOUT_S`` seconds (default 10800: ssl's
rank 0 generates and judges a whole round while the others wait).  :func:`main_first` runs a
block on rank 0, then on the others; :func:`finish` waits for every rank and tears the group down
at the end of a command; :func:`leave` then ends the process without the interpreter's teardown.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Iterator

DEFAULT_TIMEOUT_S = 10800


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main() -> bool:
    """Rank 0 (or the only process)."""
    return rank() == 0


def distributed() -> bool:
    return world_size() > 1


def _group_ready() -> None:
    """Make sure the process group exists (initialised through accelerate when it does not)."""
    import torch.distributed as td

    if td.is_available() and td.is_initialized():
        return
    from datetime import timedelta

    from accelerate import PartialState

    PartialState(timeout=timedelta(seconds=float(os.environ.get("CUDAL1_DIST_TIMEOUT_S", DEFAULT_TIMEOUT_S))))


def barrier() -> None:
    """Wait until every process reaches this point (no-op in a single process)."""
    if not distributed():
        return
    import torch.distributed as td

    _group_ready()
    td.barrier()


@contextmanager
def main_first() -> Iterator[None]:
    """Rank 0 runs the block first; the others run it after rank 0 has finished it."""
    if not is_main():
        barrier()
    yield
    if is_main():
        barrier()


def finish() -> None:
    """End of a command: wait for every rank, then tear the process group down (no-op alone)."""
    if not distributed():
        return
    import torch.distributed as td

    if td.is_available() and td.is_initialized():
        td.barrier()
        td.destroy_process_group()


def leave(code: int) -> None:
    """Under several processes, end this process now with ``code``: Python's exit handlers run
    (``atexit``: logging, multiprocessing's children, trackers), stdout and stderr are flushed,
    and the interpreter's own teardown is skipped.  Alone: a no-op (the caller returns as usual).

    Why: once DDP has run on a gloo group, the group outlives :func:`finish`'s
    ``destroy_process_group`` (its ``pt_gloo_runloop`` and ``gloo_tcp_loop`` threads stay up; seen
    with torch 2.13 on CPUs, a bare DDP module of two ranks is enough), and tearing the interpreter
    down around those threads once aborted a rank after every result was written (SIGABRT,
    "terminate called without an active exception"), which ``torchrun`` reports as a failed run.
    Call it after the command's last output."""
    if not distributed():
        return
    import atexit

    atexit._run_exitfuncs()  # the handlers a normal exit runs, before os._exit skips the rest
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def describe() -> dict:
    """What ran where: ``{"world_size", "backend", "ranks": [{"rank", "device"}, ...]}``.  Under
    several processes this is a collective (every rank must call it; the group must still be up):
    each rank reports the device its trainer used; alone, one entry and backend ``None``."""
    import torch

    device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    mine = {"rank": rank(), "device": device}
    if not distributed():
        return {"world_size": 1, "backend": None, "ranks": [mine]}
    import torch.distributed as td

    _group_ready()
    gathered: list = [None] * td.get_world_size()
    td.all_gather_object(gathered, mine)
    backend = str(td.get_backend())
    if backend == "undefined" and hasattr(td, "get_backend_config"):  # a group made for several device types
        backend = str(td.get_backend_config())
    return {"world_size": td.get_world_size(), "backend": backend, "ranks": gathered}


def all_gather(obj: object) -> list:
    """``obj`` from every rank, in rank order (a collective; alone: ``[obj]``).  Objects travel
    pickled: keep them to plain data."""
    if not distributed():
        return [obj]
    import torch.distributed as td

    _group_ready()
    gathered: list = [None] * td.get_world_size()
    td.all_gather_object(gathered, obj)
    return gathered
