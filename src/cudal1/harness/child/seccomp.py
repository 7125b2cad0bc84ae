"""The candidate's process's seccomp filters as classic BPF: the confinement's (:mod:`.confine`:
:data:`DENIED_SYSCALLS` and foreign ABIs refused, :data:`SELF_ONLY_SYSCALLS` on the caller only,
the subreaper kept) and the means to load any program (:func:`bpf`, used by :mod:`.seal` too).

Contract: a program is a list of ``(code, jt, jf, k)`` instructions; :func:`seccomp_program` builds
the confinement's for an architecture in :data:`SYSCALLS` (x86-64, aarch64).
"""

from __future__ import annotations

import ctypes
import errno
import platform
from typing import Sequence

DENIED_SYSCALLS = ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "process_madvise")
# syscall -> (argument index, required value) pairs: allowed only on the caller itself
SELF_ONLY_SYSCALLS: dict[str, tuple[tuple[int, int], ...]] = {
    "setpriority": ((0, 0), (1, 0)),  # PRIO_PROCESS, who=0 (PRIO_USER with 0 would mean every process of the uid)
    "ioprio_set": ((0, 1), (1, 0)),  # IOPRIO_WHO_PROCESS, who=0
    **{name: ((0, 0),) for name in ("sched_setparam", "sched_setscheduler", "sched_setaffinity", "sched_setattr",
                                    "prlimit64", "migrate_pages", "move_pages")},
}

SYSCALLS = {  # machine -> (AUDIT_ARCH, foreign x32 range, numbers)
    "x86_64": (
        0xC000003E,
        True,
        {
            "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "pidfd_getfd": 438,
            "process_madvise": 440, "prctl": 157, "setpriority": 141, "sched_setparam": 142,
            "sched_setscheduler": 144, "sched_setaffinity": 203, "ioprio_set": 251, "migrate_pages": 256,
            "move_pages": 279, "prlimit64": 302, "sched_setattr": 314,
        },
    ),
    "aarch64": (
        0xC00000B7,
        False,
        {
            "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272, "pidfd_getfd": 438,
            "process_madvise": 440, "prctl": 167, "setpriority": 140, "sched_setparam": 118,
            "sched_setscheduler": 119, "sched_setaffinity": 122, "ioprio_set": 30, "migrate_pages": 238,
            "move_pages": 239, "prlimit64": 261, "sched_setattr": 274,
        },
    ),
}


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(SockFilter))]


def bpf(program: list[tuple[int, int, int, int]]) -> SockFprog:
    """``program`` as the ``sock_fprog`` that ``prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ...)`` takes."""
    filters = (SockFilter * len(program))(*(SockFilter(*insn) for insn in program))
    return SockFprog(len(program), filters)


def seccomp_program(machine: str, deny: Sequence[str] = DENIED_SYSCALLS) -> list[tuple[int, int, int, int]]:
    """The classic-BPF filter, as ``(code, jt, jf, k)``: refuse ``deny`` and foreign ABIs with
    EPERM, allow :data:`SELF_ONLY_SYSCALLS` only with their required arguments, allow the rest."""
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, JMP|JGE|K, RET|K
    allow, eperm = 0x7FFF0000, 0x00050000 | errno.EPERM
    arch, x32, numbers = SYSCALLS[machine]
    code: list[tuple] = [(ld, 0, 0, 4), (jeq, 0, "deny", arch), (ld, 0, 0, 0)]
    if x32:
        code.append((jge, "deny", 0, 0x40000000))  # __X32_SYSCALL_BIT
    code += [(jeq, "deny", 0, numbers[name]) for name in deny]
    # prctl(PR_SET_CHILD_SUBREAPER, ...): the judge made the process a subreaper before confining it
    # (cudal1.harness.proctree); undoing that would let orphaned helpers leave its tree
    code += [(jeq, 0, "after prctl", numbers["prctl"]), (ld, 0, 0, 16), (jeq, "deny", 0, 36), (ret, 0, 0, allow),
             ("after prctl",)]
    for name, conds in SELF_ONLY_SYSCALLS.items():
        code.append((jeq, 0, f"after {name}", numbers[name]))
        for index, value in conds:  # 64-bit argument: low word == value, high word == 0 (little-endian)
            code += [
                (ld, 0, 0, 16 + 8 * index), (jeq, 0, "deny", value), (ld, 0, 0, 20 + 8 * index),
                (jeq, 0, "deny", 0),
            ]
        code += [(ret, 0, 0, allow), (f"after {name}",)]
    code += [(ret, 0, 0, allow), ("deny",), (ret, 0, 0, eperm)]
    labels: dict[str, int] = {}
    program = []
    for insn in code:
        if len(insn) == 1:
            labels[insn[0]] = len(program)
        else:
            program.append(insn)
    def offset(j: int | str, at: int) -> int:  # jumps count from the next instruction
        return labels[j] - at - 1 if isinstance(j, str) else j

    return [(op, offset(jt, at), offset(jf, at), k) for at, (op, jt, jf, k) in enumerate(program)]


# built at import (the judge's forkserver imports this module), not in each child
DEFAULT_PROGRAM = seccomp_program(platform.machine()) if platform.machine() in SYSCALLS else []
