"""Parent side of the isolation: start a job's two children, enforce phase deadlines, collect
the verdict.

Contract: :func:`run_job` never raises for anything a child does.  A job is two processes, both
started from a ``forkserver`` whose only preloaded state is ``torch`` and the judge's modules (no
CUDA context, nothing from the parent; :mod:`cudal1.harness.parent.launcher`), each in its own process
group and killed with SIGKILL (with every process it started, e.g. a hung ``nvcc``) when a phase
overruns: the clean reference worker (:mod:`cudal1.harness.reference.worker`, never runs candidate code)
and the candidate's process (:mod:`cudal1.harness.child.worker`), joined by a private pipe that
only the two of them hold.  A build job is the candidate's process alone.  Messages from both are
read raw by reader threads and verified by :class:`~cudal1.harness.channel.Receiver`; a forged,
malformed or replayed message ends the job with ``tampering``, and so does a ``tamper`` report
from the candidate's audit hook (:mod:`cudal1.harness.child.signing_hook`).  Phases, deadlines and the
verdict come from the reference worker; from the candidate's process the parent takes only its
environment (with what confined it), its build report and tamper reports.  The parent re-checks
what it can of an ``ok`` verdict with its own copy of the job (:func:`verdict_problem`).  Mapping
the outcome to an :class:`~cudal1.types.EvalResult` (statistics and the checks on the
candidate's reported times included) is :mod:`cudal1.harness.parent.assemble`'s job.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import secrets
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from cudal1.harness.channel import MAX_MESSAGE_BYTES, ChannelError, Receiver
from cudal1.harness.numerics import LeafCheck
from cudal1.harness.parent.gpu_share import GpuWatch, Sharing
from cudal1.harness.parent.launcher import ensure_server, get_context, launching
from cudal1.harness.proctree import CandidateTree, orphans, parent_of
from cudal1.harness.spec import BuildStage, CandidateSpec, TaskFindings, WorkerSpec, WorkerVerdict
from cudal1.harness.window import shared_page

_log = logging.getLogger("cudal1.judge")  # what the judge is doing, live: -v (INFO) shows each job's phases
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
    isolation: dict[str, Any] = field(default_factory=dict)  # what confined the candidate's process
    candidate_exitcode: int | None = None
    candidate_gone: bool = False  # the reference worker saw the candidate's process end first
    candidate_log_tail: str = ""
    sharing: Sharing | None = None  # who else held a context on the GPU while the job was timed (GPU jobs)


def _reader(who: str, conn: Any, out: "queue.Queue[tuple[str, bytes | None]]") -> None:
    try:
        while True:
            out.put((who, conn.recv_bytes(MAX_MESSAGE_BYTES)))
    except (EOFError, OSError):
        pass
    finally:
        out.put((who, None))


_live_lock = threading.Lock()
_live: set = set()  # worker processes this process is running now


def stop_all() -> None:
    """Kill every worker process this process is running (an interrupted batch): their jobs end
    at once and give no verdict worth keeping; the caller must drop them."""
    with _live_lock:
        procs = list(_live)
    for proc in procs:
        _kill_group(proc)


def kill_orphans(server: int | None) -> int:
    """Kill what dead candidates left behind: every child of the workers' forkserver ``server``
    that is no worker this process runs (a helper whose candidate's process died first, re-parented
    to the server: :mod:`cudal1.harness.parent.server_reaper`), with what it started.  Returns how
    many were found.  ``server`` None (workers started by ``spawn``): nothing to do."""
    if not server:
        return 0
    with _live_lock:  # listed while no worker can start unregistered; killed after, without the lock
        found = orphans(server, {p.pid for p in _live if p.pid})
    for pid in found:
        CandidateTree(pid).kill()
    return len(found)


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


def _reap(procs: list[Any], conns: list[Any]) -> None:
    """Wait for killed workers to be gone (at most a few seconds each), then close their
    channels (their readers have seen the end by then)."""
    for proc in procs:
        proc.join(timeout=5)
        with _live_lock:
            _live.discard(proc)
    for conn in conns:
        conn.close()


def _close_inherited_fds(keep: list[int]) -> None:
    """Close every descriptor but stdio and ``keep`` (the channel, the link), so candidate code
    cannot scribble on the forkserver's or resource tracker's pipes (it could otherwise disturb
    later jobs)."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd > 2 and fd not in keep:
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


def _child_start(keep: list[int]) -> None:
    _die_with_parent()
    os.setsid()  # own process group, so a kill reaches builds it started too
    _close_inherited_fds(keep)
    _forget_inherited_helpers()


class _Fd:
    """A descriptor handed to a forkserver child: duplicated into it as the process starts."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        from multiprocessing import reduction

        return _Fd._rebuilt, (reduction.DupFd(self.fd),)

    @staticmethod
    def _rebuilt(dup: Any) -> "_Fd":
        return _Fd(dup.detach())


def _candidate_target(spec: CandidateSpec, conn: Any, key_holder: list, link: Any, page: _Fd | None = None) -> None:
    _child_start([conn.fileno()] + ([link.fileno()] if link is not None else []) + ([page.fd] if page else []))
    from cudal1.harness.child.worker import candidate_entry

    candidate_entry(spec, conn, key_holder, link, page.fd if page else None)  # empties key_holder


def _reference_target(spec: WorkerSpec, conn: Any, key_holder: list, link: Any, page: _Fd | None = None) -> None:
    _child_start([conn.fileno(), link.fileno()] + ([page.fd] if page else []))
    from cudal1.harness.reference.worker import reference_entry

    reference_entry(spec, conn, key_holder, link, page.fd if page else None)


def _start(ctx: Any, target: Any, spec: WorkerSpec | CandidateSpec, extra: Any,
           page: _Fd | None = None) -> tuple[Any, Any, bytes]:
    """Start one child: (process, read end of its signed channel, its key)."""
    key = secrets.token_bytes(32)
    ensure_server()
    recv_conn, send_conn = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, args=(spec, send_conn, [key], extra, page), daemon=False)
    with _live_lock, launching():  # started and registered at once: kill_orphans never mistakes it
        proc.start()
        _live.add(proc)
    send_conn.close()
    return proc, recv_conn, key


def run_job(spec: WorkerSpec | None, candidate: CandidateSpec, limits: dict[str, float],
            gpu: int | None = None) -> JobOutcome:
    """Run one job; ``limits`` maps phase name -> seconds (``setup``, ``import``, ...).  ``spec``
    None (build mode): the candidate's process alone imports the candidate.  Otherwise the clean
    reference worker runs the job and drives the candidate's process over a private pipe; on a GPU
    (``gpu``: its nvidia-smi index) the parent watches who else holds a context on it while the
    job is timed, and the job's own memory from its start (:mod:`cudal1.harness.parent.gpu_share`)."""
    ctx = get_context()
    outcome = JobOutcome()
    t0 = time.monotonic()
    procs: list[Any] = []
    conns: list[Any] = []
    messages: queue.Queue[tuple[str, bytes | None]] = queue.Queue()
    page: _Fd | None = None
    tree: CandidateTree | None = None
    server: int | None = None  # the workers' forkserver
    watch: GpuWatch | None = None
    try:
        link_ref = link_cand = None
        if spec is not None:
            link_ref, link_cand = ctx.Pipe(duplex=True)
            page = _Fd(shared_page())  # the clean window's page (cudal1.harness.window)
        cand_proc, cand_recv, cand_key = _start(ctx, _candidate_target, candidate, link_cand, page)
        tree = CandidateTree(cand_proc.pid or 0, sibling_root=parent_of(cand_proc.pid or 0))
        server = tree.sibling_root if ctx.get_start_method() == "forkserver" else None
        procs.append(cand_proc)
        conns.append(cand_recv)
        threading.Thread(target=_reader, args=("cand", cand_recv, messages), daemon=True).start()
        receivers = {"cand": Receiver(cand_key)}
        if spec is not None:
            link_cand.close()
            spec = dataclasses.replace(spec, candidate_pid=cand_proc.pid or 0)
            ref_proc, ref_recv, ref_key = _start(ctx, _reference_target, spec, link_ref, page)
            link_ref.close()
            procs.append(ref_proc)
            conns.append(ref_recv)
            receivers["ref"] = Receiver(ref_key)
            threading.Thread(target=_reader, args=("ref", ref_recv, messages), daemon=True).start()
            if gpu is not None and spec.device == "cuda":
                watch = GpuWatch(gpu, ref_proc.pid or 0, tree)
                watch.begin()  # the job's memory from its start; who else uses the GPU from its timing
        try:
            _monitor(procs, messages, receivers, limits, outcome, t0, spec if spec is not None else candidate, watch,
                     label=candidate.display_name or candidate.mode)
        finally:
            if watch is not None:
                outcome.sharing = watch.stop()
    finally:
        if page is not None:
            os.close(page.fd)
        if tree is not None and tree.pid:
            tree.kill()  # the candidate's process and everything it started, in any session
            kill_orphans(server)  # and what it started and left behind when it died first
        for proc in procs:
            _kill_group(proc)
        if spec is not None and outcome.result is not None and not outcome.candidate_gone:
            # A verdict needs neither exit status: both processes are reaped in the background,
            # so their teardown (a CUDA context each) is off this job's clock.
            threading.Thread(target=_reap, args=(procs, conns), daemon=True).start()
        else:
            _reap(procs, conns)
            outcome.exitcode = procs[-1].exitcode if procs else None
            outcome.candidate_exitcode = procs[0].exitcode if procs else None
        outcome.wall_s = time.monotonic() - t0
        outcome.log_tail = _tail(candidate.log_path) if spec is None else _tail(spec.log_path)
        outcome.candidate_log_tail = _tail(candidate.log_path)
    return outcome


def _monitor(procs: list[Any], messages: "queue.Queue[tuple[str, bytes | None]]", receivers: dict[str, Receiver],
             limits: dict[str, float], outcome: JobOutcome, t0: float, spec: WorkerSpec | CandidateSpec,
             watch: GpuWatch | None = None, label: str = "job") -> None:
    """Read both children's signed messages until the verdict (or a deadline, or tampering).
    The phases (and so the deadlines) are the reference worker's; in build mode, the candidate's
    process is alone and its ``result`` is the verdict."""
    judge = "ref" if "ref" in receivers else "cand"
    outcome.phase = "setup"
    phases = ["setup"]
    outcome.limit_s = limits["setup"]
    deadline = t0 + outcome.limit_s
    phase_start = t0
    wall_start = time.time() - (time.monotonic() - t0)  # the timeline's clock (see JobOutcome.timeline)
    open_channels = set(receivers)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            outcome.timed_out = outcome.result is None
            return
        alive = any(p.is_alive() for p in procs)
        try:
            who, raw = messages.get(timeout=min(remaining, _POLL_S if alive else 1.0))
        except queue.Empty:
            continue
        if raw is None:  # a channel closed: its child is gone (or closed it)
            open_channels.discard(who)
            if who == judge or not open_channels:
                return
            continue
        try:
            msg = receivers[who].decode(raw)
        except ChannelError as exc:
            outcome.tamper = f"verdict channel: {exc}"
            outcome.result = None
            return
        if msg.kind == "tamper":
            outcome.tamper = f"the candidate's audit guard stopped it: {msg.data.get('reason', '')}"
            outcome.result = None
            return
        if who == "cand" and msg.kind == "env":
            outcome.isolation = dict(msg.data.pop("isolation", None) or {})
            if judge == "cand":
                outcome.env = msg.data
            continue
        if who == "cand" and msg.kind == "built":
            outcome.built = BuildStage(build_s=float(msg.data.get("build_s") or 0.0),
                                       compile_log=str(msg.data.get("compile_log") or ""))
            continue
        if who != judge:
            continue  # nothing else from the candidate's process decides anything
        if msg.kind == "phase":
            now = time.monotonic()
            outcome.phase_times[outcome.phase] = outcome.phase_times.get(outcome.phase, 0.0) + now - phase_start
            wall_now = _stamp(msg.data, wall_start)
            outcome.timeline.append((outcome.phase, wall_start, wall_now))
            wall_start = wall_now
            phase_start = now
            outcome.phase = str(msg.data.get("name"))
            phases.append(outcome.phase)
            if outcome.phase != phases[-2]:
                _log.info("%s: %s (%.1f s into the job; %s took %.2f s)", label, outcome.phase, now - t0, phases[-2],
                          outcome.phase_times.get(phases[-2], 0.0))
            if watch is not None and outcome.phase == "timing":
                watch.start()
            outcome.limit_s = limits.get(outcome.phase, limits["default"])
            deadline = now + outcome.limit_s
        elif msg.kind == "env":
            outcome.env = msg.data
        elif msg.kind == "task" and outcome.phase == "reference":  # sent before the candidate ran anything
            outcome.task = TaskFindings.from_message(msg.data)
        elif msg.kind == "result":
            if outcome.result is not None:
                outcome.tamper = "verdict channel: a second verdict"
                outcome.result = None
                return
            now = time.monotonic()
            outcome.phase_times[outcome.phase] = outcome.phase_times.get(outcome.phase, 0.0) + now - phase_start
            outcome.timeline.append((outcome.phase, wall_start, _stamp(msg.data, wall_start)))
            problem = verdict_problem(spec, phases, msg.data) if isinstance(spec, WorkerSpec) else ""
            if problem:
                outcome.tamper = f"the verdict does not hold up: {problem}"
                outcome.result = None
                return
            try:
                outcome.result = WorkerVerdict.from_message(msg.data)
            except (KeyError, TypeError, ValueError) as exc:
                outcome.tamper = f"verdict channel: malformed verdict ({type(exc).__name__}: {exc})"
                return
            outcome.candidate_gone = bool(msg.data.get("candidate_gone"))
            _log.info("%s: verdict %s after %.1f s", label, msg.data.get("status"), now - t0)
            if judge == "ref":
                return  # the clean worker's verdict is final: its exit (a CUDA context's teardown) is not waited for
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
    if data.get("status") != "ok" or spec.mode == "build":
        return ""  # a build's 'ok' only says the import worked; the evaluation judges the rest
    want = _PROTOCOL.get(spec.mode, [])
    it = iter(phases)
    if not all(any(p == w for p in it) for w in want):
        return f"phases {phases} do not contain the protocol's {want} in order"
    corr = data.get("correctness") or {}
    trials = spec.config.correctness_trials
    if not (int(corr.get("passed") or 0) == int(corr.get("trials") or 0) >= trials):
        return f"{corr.get('passed')} of {corr.get('trials')} correctness trials passed, {trials} required"
    timing = data.get("timing") if isinstance(data.get("timing"), dict) else {}
    if not timing.get("cand") or len(timing.get("cand", [])) != len(timing.get("ref", [])):
        return "no timed calls reported"
    rule = spec.tolerances
    for dtype, record in (corr.get("exact_checks") or {}).items():
        if rule.exact is None:
            return "the worker judged with the exact rule, which this job's rule does not hold"
        check = LeafCheck.from_record(dtype, record)
        if check.ratio(rule.exact) > 1 + 1e-9:
            return (f"a {dtype} error of {check.cand_l2:.3g} (normwise, worst element {check.cand_inf:.3g}) "
                    f"exceeds the exact rule's bound {check.bounds(rule.exact)}")
    for dtype, (max_abs, max_ref) in (corr.get("by_dtype") or {}).items():
        atol, rtol = rule.limit(dtype)
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
