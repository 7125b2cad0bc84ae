"""Parent side of the isolation: start a worker child, enforce phase deadlines, collect its verdict.

Contract: :func:`run_job` never raises for anything the child does.  The child is started from a
``forkserver`` whose only preloaded state is ``torch`` and the worker module (no CUDA context,
nothing from the parent; :mod:`cudal1.harness.launcher`), runs in its own process group, and is
killed with SIGKILL (with every process it started, e.g. a hung ``nvcc``) when a phase overruns.
Messages are read raw by a reader thread and verified by :class:`~cudal1.harness.channel.Receiver`;
a forged, malformed or replayed message ends the job with ``tampering``, and so does a ``tamper``
report from the worker's audit hook (:mod:`cudal1.harness.signing_hook`: candidate code reached
for frames, ``gc`` or the channel).  The parent also re-checks what it can of an ``ok`` verdict
with its own copy of the job (:func:`verdict_problem`): the protocol's phases all announced, in
order; every correctness trial run and passed; the reported errors within *its* tolerance table.
The outcome says what happened; mapping it to an :class:`~cudal1.types.EvalResult` is
:mod:`cudal1.harness.assemble`'s job.
"""

from __future__ import annotations

import os
import queue
import secrets
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from cudal1.harness.channel import MAX_MESSAGE_BYTES, ChannelError, Receiver
from cudal1.harness.launcher import get_context, launching
from cudal1.harness.numerics import LeafCheck
from cudal1.harness.spec import BuildStage, TaskFindings, WorkerSpec, WorkerVerdict

_EXIT_GRACE_S = 15.0
_POLL_S = 0.05

@dataclass
class JobOutcome:
    """What a worker child did.  ``result`` is its signed ``result`` message, typed."""

    result: WorkerVerdict | None = None
    env: dict[str, Any] = field(default_factory=dict)
    built: BuildStage | None = None  # the worker's ``built`` message (import finished)
    task: TaskFindings = field(default_factory=TaskFindings)  # task-level findings (degenerate, float64 answers)
    phase: str = "start"
    timed_out: bool = False
    limit_s: float = 0.0
    tamper: str = ""
    exitcode: int | None = None
    log_tail: str = ""
    wall_s: float = 0.0
    phase_times: dict[str, float] = field(default_factory=dict)
    # (phase, start, end) on the worker's own clock (time.time(), from its phase and result
    # messages; the first start is the parent's at launch): orders phases across workers
    timeline: list[tuple[str, float, float]] = field(default_factory=list)


def _reader(conn: Any, out: "queue.Queue[bytes | None]") -> None:
    try:
        while True:
            out.put(conn.recv_bytes(MAX_MESSAGE_BYTES))
    except (EOFError, OSError):
        pass
    finally:
        out.put(None)


_live_lock = threading.Lock()
_live: set = set()  # worker processes this process is running now


def stop_all() -> None:
    """Kill every worker process this process is running (an interrupted batch): their jobs end
    at once and give no verdict worth keeping; the caller must drop them."""
    with _live_lock:
        procs = list(_live)
    for proc in procs:
        _kill_group(proc)


def _kill_group(proc: Any) -> None:
    pid = proc.pid
    if pid is None:
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except (ProcessLookupError, AttributeError):
        pass


def _close_inherited_fds(keep: int) -> None:
    """Close every descriptor but stdio and the channel, so candidate code cannot scribble on
    the forkserver's or resource tracker's pipes (it could otherwise disturb later jobs)."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd > 2 and fd != keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _forget_inherited_helpers() -> None:
    """Make multiprocessing start its own resource tracker (and forkserver) in this worker.

    The worker inherits the forkserver's bookkeeping of those helpers, whose pipes
    ``_close_inherited_fds`` just closed.  Left alone, the first semaphore the worker creates
    (torch.compile's compile pool does) makes the resource tracker probe its old descriptor
    number, find it "dead" and ``os.close`` it, although by then that number belongs to something
    else: the CUDA driver's device files.  The candidate then fails at random with
    ``cudaErrorOperatingSystem`` or "unspecified launch failure" (seen on the H200)."""
    from multiprocessing import forkserver, resource_tracker

    tracker = resource_tracker._resource_tracker  # type: ignore[attr-defined]
    for name in ("_fd", "_pid"):
        if hasattr(tracker, name):
            setattr(tracker, name, None)
    server = forkserver._forkserver  # type: ignore[attr-defined]
    for name in ("_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid"):
        if hasattr(server, name):
            setattr(server, name, None)


def _die_with_parent() -> None:
    """Linux: SIGKILL this worker when its parent (the forkserver) dies, so a killed judge
    leaves no hung worker holding a GPU."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:
        os._exit(1)


def _job_target(spec: WorkerSpec, conn: Any, key_holder: list) -> None:
    _die_with_parent()
    os.setsid()  # own process group, so a kill reaches builds it started too
    _close_inherited_fds(conn.fileno())
    _forget_inherited_helpers()
    from cudal1.harness.worker import worker_entry

    worker_entry(spec, conn, key_holder)  # empties key_holder: the key ends up in the audit hook only


def run_job(spec: WorkerSpec, limits: dict[str, float]) -> JobOutcome:
    """Run one worker job; ``limits`` maps phase name → seconds (``setup``, ``import``, ...)."""
    ctx = get_context()
    key = secrets.token_bytes(32)
    recv_conn, send_conn = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_job_target, args=(spec, send_conn, [key]), daemon=False)
    outcome = JobOutcome()
    t0 = time.monotonic()
    with launching():
        proc.start()
    with _live_lock:
        _live.add(proc)
    send_conn.close()
    messages: queue.Queue[bytes | None] = queue.Queue()
    threading.Thread(target=_reader, args=(recv_conn, messages), daemon=True).start()
    try:
        _monitor(proc, messages, Receiver(key), limits, outcome, t0, spec)
    finally:
        _kill_group(proc)
        with _live_lock:
            _live.discard(proc)
        proc.join(timeout=5)
        recv_conn.close()
        outcome.exitcode = proc.exitcode
        outcome.wall_s = time.monotonic() - t0
        outcome.log_tail = _tail(spec.log_path)
    return outcome


def _monitor(proc: Any, messages: "queue.Queue[bytes | None]", receiver: Receiver, limits: dict[str, float],
             outcome: JobOutcome, t0: float, spec: WorkerSpec | None = None) -> None:
    outcome.phase = "setup"
    phases = ["setup"]
    outcome.limit_s = limits["setup"]
    deadline = t0 + outcome.limit_s
    phase_start = t0
    wall_start = time.time() - (time.monotonic() - t0)  # the timeline's clock (see JobOutcome.timeline)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            outcome.timed_out = outcome.result is None
            return
        try:
            raw = messages.get(timeout=min(remaining, _POLL_S if proc.is_alive() else 1.0))
        except queue.Empty:
            continue
        if raw is None:  # channel closed: the child is gone (or closed it)
            return
        try:
            msg = receiver.decode(raw)
        except ChannelError as exc:
            outcome.tamper = f"verdict channel: {exc}"
            outcome.result = None
            return
        if msg.kind == "phase":
            now = time.monotonic()
            outcome.phase_times[outcome.phase] = outcome.phase_times.get(outcome.phase, 0.0) + now - phase_start
            wall_now = _stamp(msg.data, wall_start)
            outcome.timeline.append((outcome.phase, wall_start, wall_now))
            wall_start = wall_now
            phase_start = now
            outcome.phase = str(msg.data.get("name"))
            phases.append(outcome.phase)
            outcome.limit_s = limits.get(outcome.phase, limits["default"])
            deadline = now + outcome.limit_s
        elif msg.kind == "env":
            outcome.env = msg.data
        elif msg.kind == "built":
            outcome.built = BuildStage(build_s=float(msg.data.get("build_s") or 0.0),
                                       compile_log=str(msg.data.get("compile_log") or ""))
        elif msg.kind == "task" and outcome.phase == "reference":  # sent before candidate code runs
            outcome.task = TaskFindings.from_message(msg.data)
        elif msg.kind == "tamper":
            outcome.tamper = f"the worker's audit guard stopped the candidate: {msg.data.get('reason', '')}"
            outcome.result = None
            return
        elif msg.kind == "result":
            if outcome.result is not None:
                outcome.tamper = "verdict channel: a second verdict"
                outcome.result = None
                return
            now = time.monotonic()
            outcome.phase_times[outcome.phase] = outcome.phase_times.get(outcome.phase, 0.0) + now - phase_start
            outcome.timeline.append((outcome.phase, wall_start, _stamp(msg.data, wall_start)))
            problem = verdict_problem(spec, phases, msg.data) if spec is not None else ""
            if problem:
                outcome.tamper = f"the verdict does not hold up: {problem}"
                outcome.result = None
                return
            try:
                outcome.result = WorkerVerdict.from_message(msg.data)
            except (KeyError, TypeError, ValueError) as exc:
                outcome.tamper = f"verdict channel: malformed verdict ({type(exc).__name__}: {exc})"
                return
            deadline = time.monotonic() + _EXIT_GRACE_S  # let it exit; a later message is tampering


def _stamp(data: dict[str, Any], after: float) -> float:
    """A message's ``t`` (the worker's ``time.time()``), never before ``after``."""
    try:
        return max(after, float(data.get("t") or after))
    except (TypeError, ValueError):
        return after


_PROTOCOL = {"build": ["setup", "import"],
             "eval": ["setup", "reference", "import", "construct", "correctness", "timing"],
             "baseline": ["setup", "reference", "import", "construct", "correctness", "timing"]}


def verdict_problem(spec: WorkerSpec, phases: list[str], data: dict[str, Any]) -> str:
    """Why an ``ok`` verdict cannot be right, judged with the parent's own copy of the job
    ('' when it holds up).  Only a worker whose judge state was tampered with can trip these:
    they are re-checks, not the primary decision."""
    if data.get("status") != "ok":
        return ""
    want = _PROTOCOL.get(spec.mode, [])
    it = iter(phases)
    if not all(any(p == w for p in it) for w in want):
        return f"phases {phases} do not contain the protocol's {want} in order"
    if spec.mode == "build":
        return ""
    corr = data.get("correctness") or {}
    trials = spec.config.correctness_trials
    if not (int(corr.get("passed") or 0) == int(corr.get("trials") or 0) >= trials):
        return f"{corr.get('passed')} of {corr.get('trials')} correctness trials passed, {trials} required"
    raw = data.get("raw") or {}
    if not raw.get("cand_stream") or len(raw.get("cand_stream", [])) != len(raw.get("ref_stream", [])):
        return "no timed calls reported"
    tolerances = spec.tolerances
    for dtype, record in (corr.get("exact_checks") or {}).items():
        if "@exact" not in tolerances:
            return "the worker judged with the exact rule, which this job's table does not hold"
        check = LeafCheck.from_record(dtype, record)
        if check.ratio(tolerances) > 1 + 1e-9:
            return (f"a {dtype} error of {check.cand_l2:.3g} (normwise, worst element {check.cand_inf:.3g}) "
                    f"exceeds the exact rule's bound {check.bounds(tolerances)}")
    for dtype, (max_abs, max_ref) in (corr.get("by_dtype") or {}).items():
        atol, rtol = tolerances.get(dtype, (1e-4, 1e-4))
        bound = (float(atol) + float(rtol) * float(max_ref)) * (1 + 1e-9)
        if float(max_abs) > bound:
            return (f"a {dtype} error of {float(max_abs):.3g} exceeds the judge's tolerance "
                    f"(atol {atol:g} + rtol {rtol:g} x max |ref| {float(max_ref):.3g})")
    return ""


def _tail(path: str, limit: int = 8000) -> str:
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""
