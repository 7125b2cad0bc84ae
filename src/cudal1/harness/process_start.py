"""What each of a job's two processes (the clean reference worker and the candidate's process)
does the same way when it starts: send its output to its log, import a source file as a module,
set the math mode, and arm a stack dump for a phase that stalls.  Imports nothing of either side."""

from __future__ import annotations

import faulthandler
import importlib.util
import os
import sys
from typing import Any

from cudal1.harness.spec import PhaseLimits


def redirect_output(log_path: str) -> None:
    """stdout and stderr append to ``log_path`` (0600); stdin reads ``/dev/null``."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


def load_module(path: str, name: str) -> Any:
    """Import a source file as a real module under ``name`` (``@triton.jit`` needs the file for
    its source)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def set_math_mode(mode: str) -> None:
    """``strict``: no TF32 in matmuls or cuDNN and the highest fp32 matmul precision (both
    processes of a job set it before any task or candidate code runs); any other mode leaves
    torch's defaults."""
    if mode != "strict":
        return
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def arm_stall_dump(limits: PhaseLimits, phase: str) -> None:
    """A phase that stalls leaves every thread's stack in the log shortly before the parent's
    deadline for that phase kills the process."""
    faulthandler.dump_traceback_later(max(1.0, 0.8 * limits.of_phase(phase)), repeat=True)


def bind_threads_for_cpu_timing() -> str:
    """CPU-timed jobs, in both processes alike, before their code runs: this (main) thread on the
    first allowed CPU, torch's OpenMP workers off it, as OpenMP's ``proc_bind`` puts a team.
    The workers are started now, by a parallel operation run while this thread's affinity is
    every other CPU (a new thread inherits its creator's), then this thread moves to its own CPU;
    threads started later inherit that.  Only this thread's own affinity is ever set, which a
    confined process may still do.  Why: unbound, the scheduler moves the two processes' threads
    between a small host's cores from call to call, and an identical program's speedup interval is
    twice as wide (docs/harness.md, "Bound threads on the CPU clock").  Returns what was done."""
    import torch

    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (OSError, AttributeError):
        return "not applied: sched_getaffinity is unavailable"
    if len(cpus) < 2:
        return "not applied: one CPU"
    try:
        os.sched_setaffinity(0, set(cpus[1:]))
        torch.ones(1 << 20).add_(1)  # above the intra-op grain: OpenMP starts its workers here
        os.sched_setaffinity(0, {cpus[0]})
    except OSError as exc:
        try:
            os.sched_setaffinity(0, set(cpus))
        except OSError:
            pass
        return f"not applied: {exc.strerror or exc}"
    return f"applied: main thread on CPU {cpus[0]}, its OpenMP workers on CPUs {cpus[1]}-{cpus[-1]}"
