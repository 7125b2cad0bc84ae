"""The candidate's processes, as the clean side sees them through ``/proc``: every process the
candidate's process started, in any session or process group, and (where the judge dropped the
candidate to its own uid) every process of that uid.

Contract: the candidate's process makes itself a *child subreaper* before any candidate code runs
(:func:`become_subreaper`; its seccomp filter then refuses to undo it), so an orphaned descendant
(a double-forked daemon, a helper started with ``start_new_session=True``) is re-parented to it
and stays in its tree.  :class:`CandidateTree` (in the clean processes) lists that tree, adds the
uid's processes when the uid is the candidate's own, stops and continues them (through pidfds
once :meth:`CandidateTree.freeze` fixed the set: no pid can be reused under it), and kills them.
A process of the uid that belongs to another job (a child of the same forkserver: an identical
source judged beside this one shares its uid) is left alone, with its descendants.

Limits: a process that exits between two listings is not seen by them; after the candidate's
process is sealed (:func:`seal_no_new_processes`) it can create none, so the set holds still while
the reference is timed.  Without ``/proc`` (not Linux) nothing here applies.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from pathlib import Path

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux >= 3.4); False where that is refused."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (every thread's list; empty when it is gone)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
        except OSError:
            continue
        out.extend(int(x) for x in text.split())
    return out


def descendants(pid: int) -> set[int]:
    """Every process below ``pid``."""
    seen: set[int] = set()
    todo = [pid]
    while todo:
        for child in children(todo.pop()):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


def orphans(server: int, jobs: set[int]) -> set[int]:
    """Children of the workers' forkserver ``server`` that are none of ``jobs`` (the worker
    processes the judge runs) and left the server's session: what a dead candidate's process left
    behind, re-parented to the server (a subreaper, :mod:`cudal1.harness.parent.server_reaper`).
    Every job process starts a session of its own, and so did or inherited all it started, while
    a process that another user of the same forkserver started (multiprocessing shares one per
    interpreter) stays in the server's session and is never counted."""
    own = session_of(server)
    return {p for p in set(children(server)) - jobs - {os.getpid()} if own is None or session_of(p) not in (own, None)}


def _stat_field(pid: int, index: int) -> str | None:
    """Field ``index`` of ``/proc/<pid>/stat`` after the command name (0: state, 1: parent,
    3: session); None when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        return text[text.rindex(")") + 2:].split()[index]
    except (OSError, ValueError, IndexError):
        return None


def session_of(pid: int) -> int | None:
    """The session id of ``pid`` (None when it is gone)."""
    field = _stat_field(pid, 3)
    return int(field) if field is not None else None


def uid_of(pid: int) -> int | None:
    """The real uid of ``pid`` (None when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def parent_of(pid: int) -> int | None:
    field = _stat_field(pid, 1)
    return int(field) if field is not None else None


def name_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def processes_of_uid(uid: int) -> set[int]:
    out: set[int] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and uid_of(int(entry)) == uid:
            out.add(int(entry))
    return out


def ancestry(pid: int, limit: int = 64) -> list[int]:
    """``pid``'s parents, nearest first (up to ``limit``)."""
    out: list[int] = []
    while len(out) < limit:
        parent = parent_of(pid)
        if not parent or parent in out:
            break
        out.append(parent)
        pid = parent
    return out


def state_of(pid: int) -> str:
    """The process's state letter from ``/proc`` (``""`` when it is gone)."""
    return _stat_field(pid, 0) or ""


def _wait_stopped(pids: list[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    todo = list(pids)
    while todo and time.monotonic() < deadline:
        todo = [p for p in todo if state_of(p) not in ("", "T", "t", "Z", "X")]
        if todo:
            time.sleep(0.0001)


class CandidateTree:
    """The candidate's process ``pid`` and everything it started.  ``sibling_root``: the
    forkserver both job processes came from (its other children are other jobs')."""

    def __init__(self, pid: int, sibling_root: int | None = None, judge_uid: int | None = None) -> None:
        self.pid = pid
        self.sibling_root = sibling_root
        self.judge_uid = os.getuid() if judge_uid is None else judge_uid
        self.uid: int | None = None  # the candidate's own uid, once seen (None: it shares the judge's or root's)
        self._frozen: dict[int, int] = {}  # pid -> pidfd, once the set is fixed
        self._stopped: list[int] = []

    def own_uid(self) -> int | None:
        """The candidate's uid when the judge dropped it to one of its own."""
        if self.uid is None:
            uid = uid_of(self.pid)
            if uid is not None and uid not in (0, self.judge_uid):
                self.uid = uid
        return self.uid

    def members(self) -> set[int]:
        """The candidate's process, its descendants and (with its own uid) that uid's processes
        outside other jobs."""
        found = {self.pid} | descendants(self.pid)
        uid = self.own_uid()
        if uid is not None:
            others: set[int] = set()
            if self.sibling_root:
                for sibling in children(self.sibling_root):
                    if sibling != self.pid:
                        others |= {sibling} | descendants(sibling)
            found |= processes_of_uid(uid) - others
        found.discard(os.getpid())
        return found

    def helpers(self) -> set[int]:
        """Members other than the candidate's process itself."""
        return (set(self._frozen) if self._frozen else self.members()) - {self.pid}

    def freeze(self) -> set[int]:
        """Fix the set (after warm-up, once the candidate's process can start no more): later
        signals go through pidfds.  Returns the set."""
        self.release()
        for pid in self.members():
            try:
                self._frozen[pid] = os.pidfd_open(pid)
            except (OSError, AttributeError):
                continue
        return set(self._frozen)

    def new_since_freeze(self) -> set[int]:
        """Processes in the tree now that were not there when it was frozen."""
        return self.members() - set(self._frozen) if self._frozen else set()

    def _signal(self, pid: int, sig: int) -> bool:
        fd = self._frozen.get(pid)
        try:
            if fd is not None:
                signal.pidfd_send_signal(fd, sig)
            else:
                os.kill(pid, sig)
            return True
        except (ProcessLookupError, PermissionError, OSError):
            return False

    def stop(self, settle_s: float = 0.05) -> int:
        """SIGSTOP the whole set: the helpers first, the candidate's process group last (so the
        candidate is never seen stopped beside a running helper); until nothing new appears when
        the set is not frozen; then wait (``settle_s`` at most) until each is really stopped (a
        signal reaches a process running on another core a moment later).  Returns how many
        processes were stopped."""
        stopped = set(self._stopped)
        for _ in range(1 if self._frozen else 8):
            todo = (set(self._frozen) if self._frozen else self.members()) - stopped - {self.pid}
            if not todo:
                break
            for pid in todo:
                if self._signal(pid, signal.SIGSTOP):
                    stopped.add(pid)
            if self._frozen:
                break
        _wait_stopped(list(stopped), settle_s)  # the helpers are really stopped before the candidate is
        try:
            os.killpg(self.pid, signal.SIGSTOP)
        except (ProcessLookupError, PermissionError):
            pass
        if self._signal(self.pid, signal.SIGSTOP):
            stopped.add(self.pid)
        self._stopped = list(stopped)
        _wait_stopped([self.pid], settle_s)
        return len(stopped)

    def cont(self) -> None:
        """SIGCONT what :meth:`stop` stopped: the candidate's process group first, the helpers last."""
        try:
            os.killpg(self.pid, signal.SIGCONT)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in sorted(self._stopped, key=lambda p: p != self.pid):
            self._signal(pid, signal.SIGCONT)
        self._stopped = []

    def kill(self) -> int:
        """Stop everything, then SIGKILL it all, the candidate's process first (its helpers, still
        stopped, cannot exit and free their pids meanwhile; never is a helper seen running beside a
        stopped candidate).  Returns how many processes were signalled."""
        self.stop()
        victims = set(self._stopped) | (set(self._frozen) if self._frozen else self.members())
        self._signal(self.pid, signal.SIGKILL)
        for pid in sorted(victims - {self.pid}):
            self._signal(pid, signal.SIGKILL)
        self._stopped = []
        return len(victims)

    def release(self) -> None:
        for fd in self._frozen.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._frozen = {}
