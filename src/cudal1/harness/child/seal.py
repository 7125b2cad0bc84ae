"""Seal the candidate's process once warm-up is over: from then on it can start no process.

Contract: :func:`seal` stacks one more seccomp filter on the calling process (and on every thread
it starts later): ``fork``/``vfork``, and ``clone`` without ``CLONE_THREAD``, kill the whole
process with SIGSYS (the parent reads that exit as ``rejected`` + ``new_process``); ``clone3``
fails with ENOSYS, so the C library falls back to ``clone``, whose flags a filter can read (a
thread start still works).  It returns ``"applied: ..."`` or ``"refused: <reason>"``; it needs
``no_new_privs``, which it sets (the confined process has it already).  torch.compile and Triton
start their compile workers during warm-up, before the seal; those processes are not sealed
(a filter only reaches later children), so the clean side lists them
(:class:`cudal1.harness.proctree.CandidateTree`): stopped while the reference is timed, killed
with the job, and any process that appears after the seal is ``new_process`` too.

:func:`stop_compile_workers` runs first: Inductor's compile-worker pool (a sidecar process that
starts its workers when it gets to them) may start them after warm-up, after the seal, on its own
schedule; an honest ``torch.compile`` candidate then read ``new_process`` (16 workers on a
16-core H200, 5 of the 14 builtin candidates of two tasks, 2026-12-02).  Shut down before the seal, the
pool starts nothing later; a compile during timing would start a new one, which is rejected.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import signal
import sys
import time

from cudal1.harness.child.seccomp import bpf

# machine -> (AUDIT_ARCH, {name: number}); fork and vfork exist on x86-64 only
_NUMBERS = {
    "x86_64": (0xC000003E, {"clone": 56, "fork": 57, "vfork": 58, "clone3": 435}),
    "aarch64": (0xC00000B7, {"clone": 220, "clone3": 435}),
}
_CLONE_THREAD = 0x00010000
_KILL_PROCESS, _ALLOW, _ENOSYS = 0x80000000, 0x7FFF0000, 0x00050000 | errno.ENOSYS
_REAP_S = 2.0  # how long a killed compile-worker process is waited for (one stuck in the kernel is left)


def seal_program(machine: str) -> list[tuple[int, int, int, int]]:
    """The classic-BPF filter as ``(code, jt, jf, k)`` (see the module doc)."""
    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06
    arch, numbers = _NUMBERS[machine]
    code: list[tuple[int, int, int, int]] = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, _ALLOW), (ld, 0, 0, 0)]
    for name in ("fork", "vfork"):
        if name in numbers:
            code += [(jeq, 0, 1, numbers[name]), (ret, 0, 0, _KILL_PROCESS)]
    code += [(jeq, 0, 1, numbers["clone3"]), (ret, 0, 0, _ENOSYS)]
    # clone: its first argument holds the flags (low word); a thread carries CLONE_THREAD
    code += [(jeq, 0, 4, numbers["clone"]), (ld, 0, 0, 16), (jset, 1, 0, _CLONE_THREAD), (ret, 0, 0, _KILL_PROCESS),
             (ret, 0, 0, _ALLOW)]
    code.append((ret, 0, 0, _ALLOW))
    return code


def stop_compile_workers() -> bool:
    """Shut down torch.compile's compile-worker pools in this process, if Inductor was loaded
    (its sidecar process and the workers it started or would start); True when it was.

    Each pool's sidecar is stopped (SIGSTOP: it starts nothing more), then it and every process
    below it are killed, before Inductor's own shutdown runs: that one asks the sidecar to finish
    and waits while its pool finishes starting the workers it has not started yet, which took up to
    8 s per job on an H200 (25 of 83 verdicts of two benchmark calls, 2026-12-03), all of it inside
    the timing phase's exclusive lease."""
    compile_module = sys.modules.get("torch._inductor.async_compile")
    if compile_module is None:
        return False
    for pool in list(getattr(compile_module, "_pool_set", ())):
        _kill_sidecar(getattr(pool, "process", None))
    try:
        compile_module.shutdown_compile_workers()
    except Exception:  # noqa: BLE001 - a pool that cannot be stopped: anything it starts later is new_process
        return False
    return True


def _kill_sidecar(process: object) -> None:
    """Kill a pool's sidecar (a ``subprocess.Popen``) and everything below it, and reap what this
    process may reap (the sidecar; its workers when this process is their subreaper)."""
    from cudal1.harness.proctree import descendants

    pid = getattr(process, "pid", None)
    if not isinstance(pid, int) or getattr(process, "returncode", None) is not None:
        return
    try:
        os.kill(pid, signal.SIGSTOP)
    except OSError:
        return
    doomed = [pid, *descendants(pid)]
    for p in doomed:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    pending, deadline = set(doomed), time.monotonic() + _REAP_S
    while pending and time.monotonic() < deadline:
        for p in list(pending):
            try:
                if os.waitpid(p, os.WNOHANG)[0]:
                    pending.discard(p)
            except OSError:  # not this process's child: its own parent reaps it
                pending.discard(p)
        if pending:
            time.sleep(0.005)


def seal() -> str:
    machine = platform.machine()
    if machine not in _NUMBERS:
        return f"refused: no syscall table for {machine}"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError as exc:
        return f"refused: {exc}"
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS (already set when the process was confined)
    prog = bpf(seal_program(machine))
    ctypes.set_errno(0)
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        err = ctypes.get_errno()
        return f"refused: {errno.errorcode.get(err, str(err))}"
    return "applied: fork, vfork and clone without CLONE_THREAD end the process; clone3 -> ENOSYS"
