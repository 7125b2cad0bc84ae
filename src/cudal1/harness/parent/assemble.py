"""Turn a worker's :class:`~cudal1.harness.parent.sandbox.JobOutcome` into a typed ``EvalResult``.

Contract: statistics (medians, IQR, speedup, bootstrap CI) are computed here, in the parent,
from the raw samples; the worker only reports measurements.  Missing verdicts are classified:
a kill at a deadline is ``timeout``; a child that died before its verdict is ``runtime_error``
(flag ``signal`` for a signal such as SIGSEGV, ``no_verdict`` for a silent exit); a failed
message verification, a ``tamper`` report from the worker's audit guard, or an ``ok`` verdict
that fails the parent's re-checks (``sandbox.verdict_problem``) is ``rejected`` with
``tampering``.
"""

from __future__ import annotations

import signal

from cudal1.config import EvalConfig
from cudal1.flags import check as check_flag
from cudal1.harness.faults import is_cuda_fault
from cudal1.harness.figures import FIGURES, figures, median
from cudal1.harness.parent.sandbox import JobOutcome
from cudal1.harness.parent.stats import cpu_protocol_ci, host_contention, speedup, speedup_ci
from cudal1.harness.spec import TimingStage, numbers_in
from cudal1.types import Correctness, Environment, EvalResult, Status, Timing

_ENV_FIELDS = set(Environment.__dataclass_fields__)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def assemble(outcome: JobOutcome, config: EvalConfig, base: EvalResult) -> EvalResult:
    """Fill ``base`` (which carries task/candidate identity) from the outcome."""
    r = base
    r.phase = outcome.phase
    r.wall_s = outcome.wall_s
    r.phase_s = {k: round(v, 4) for k, v in outcome.phase_times.items()}
    r.environment = Environment(**{k: v for k, v in outcome.env.items() if k in _ENV_FIELDS})
    r.environment.isolation = {str(k): str(v) for k, v in outcome.isolation.items()}
    if outcome.result is not None:
        r.environment.slots = outcome.result.slots
        timing = outcome.result.timing
        if timing is not None and timing.sealed:
            r.environment.isolation["new_processes"] = (
                f"{timing.sealed} ({timing.helpers} helper process(es) when sealed)"
            )
    if outcome.sharing is not None:
        r.environment.isolation["gpu_sharing"] = outcome.sharing.summary()[:500]
    r.stderr_tail = _logs(outcome)
    r.config_hash = config.hash()
    r.build_s = r.phase_s.get("build", 0.0)  # extensions built inside ModelNew.__init__
    if outcome.built is not None:
        r.build_s += outcome.built.build_s or 0.0
        r.compile_log = outcome.built.compile_log
    degenerate = outcome.task.degenerate
    try:
        _assemble(outcome, config, r)
        _shared_gpu(outcome, r)
        return r
    finally:
        if degenerate:
            r.flags.append("degenerate_task")
            r.message = (r.message + "\n" if r.message else "") + f"degenerate task: {degenerate}"
        for name in r.flags:  # the registry is the contract: a misspelt flag is the judge's bug, loudly
            check_flag(name)


def _shared_gpu(outcome: JobOutcome, r: EvalResult) -> None:
    """What the parent saw on the GPU while the job was timed: the candidate's own helper with a
    context is ``foreign_gpu_work`` (rejected); anyone else makes the timing ``contended``.  And
    the job's memory, from its start: ``figures["gpu_memory_mib"]``."""
    s = outcome.sharing
    if s is not None and s.job_mib:
        r.figures["gpu_memory_mib"] = s.job_mib  # a scheduling figure (cudal1.harness.parent.batch)
    if s is None or not s.checked:
        return
    if s.candidate:
        if r.status is Status.OK:
            r.status = Status.REJECTED
        r.flags.append("foreign_gpu_work")
        r.message = (f"a process the candidate started held its own context on the GPU while it was timed: "
                     f"{s.summary()}\n{r.message}").strip()
        r.speedup = r.speedup_ci = None
    elif s.others:
        r.flags.append("contended")
        r.figures.setdefault("contention", {})["gpu"] = s.others
        r.message = (f"{r.message}\ncontended: the GPU was shared while this was timed ({s.summary()}); "
                     "the timing is not trusted").strip()


def _logs(outcome: JobOutcome) -> str:
    """What the candidate printed (its process's log), then the reference worker's own last
    lines when it wrote any (a stall dump, an internal error)."""
    text = outcome.candidate_log_tail[-4000:]
    if outcome.log_tail.strip() and outcome.log_tail is not outcome.candidate_log_tail:
        text = (text + "\n--- reference worker ---\n" + outcome.log_tail[-1500:]).strip()
    return text[-5000:]


def _assemble(outcome: JobOutcome, config: EvalConfig, r: EvalResult) -> EvalResult:
    if outcome.tamper:
        r.status, r.flags = Status.REJECTED, ["tampering"]
        r.message = outcome.tamper
        return r
    if outcome.result is None:
        return _no_verdict(outcome, r)
    v = outcome.result
    if outcome.candidate_gone:  # the candidate's process ended first: say how
        return _no_verdict(outcome, r, candidate=True)
    r.phase = v.phase or outcome.phase
    r.status = Status(v.status)
    r.message = v.message
    r.flags = list(dict.fromkeys(v.flags))
    if v.build.compile_log:
        r.compile_log = v.build.compile_log
    if v.build.build_s is not None:
        r.build_s = v.build.build_s + r.phase_s.get("build", 0.0)
    if v.traceback:
        r.message = f"{r.message}\n{v.traceback}".strip()
    r.kernels = list(v.kernels or [])
    if v.profile is not None:
        from cudal1.profile.model import Profiles

        r.profile = Profiles.from_dict(v.profile)
    if v.reference_cost:  # where the reference phase's wall went (information only)
        r.figures["reference_cost"] = dict(v.reference_cost)
    if v.exclusive_s is not None:  # what it kept every other job off the GPU for, untimed (information only)
        r.figures["exclusive_before_timing_s"] = v.exclusive_s
    corr = v.correctness
    if corr:
        r.correctness = Correctness(**{k: v for k, v in corr.items() if k in Correctness.__dataclass_fields__})
        if isinstance(corr.get("cost_ms"), dict):  # where the correctness phase's wall went (information only)
            r.figures["correctness_cost"] = numbers_in(corr["cost_ms"])
    _timings(v.timing, config, r)
    return r


def _no_verdict(outcome: JobOutcome, r: EvalResult, candidate: bool = False) -> EvalResult:
    """No verdict (a kill at a deadline, a crash), or the candidate's process died under the
    reference worker (``candidate``): its exit status and log say how."""
    log = outcome.candidate_log_tail if candidate else outcome.log_tail
    tail = log.strip().splitlines()[-3:]
    where = f" during {outcome.phase}"
    if outcome.timed_out:
        r.status = Status.TIMEOUT
        r.message = f"{outcome.phase} exceeded its {outcome.limit_s:g}s limit; the worker was killed"
        return r
    r.status = Status.RUNTIME_ERROR
    code = outcome.candidate_exitcode if candidate else outcome.exitcode
    who = "the candidate's process" if candidate else "worker"
    if candidate and code == -signal.SIGSYS:  # the seal's seccomp filter (harness.child.seal)
        r.status = Status.REJECTED
        r.flags = ["new_process"]
        r.message = f"the candidate's process tried to start a process after warm-up{where} and was stopped"
        return r
    if code is not None and code < 0:
        r.flags = ["signal"]
        r.message = f"{who} killed by {_signal_name(code)}{where}"
    else:
        r.flags = ["no_verdict"]
        r.message = f"{who} exited (code {code}) without a verdict{where}"
    if is_cuda_fault(log):
        r.flags.append("illegal_memory_access")
    if tail:
        r.message += ": " + " | ".join(tail)[-1000:]
    return r


def _timings(t: TimingStage | None, config: EvalConfig, r: EvalResult) -> None:
    """Both figures from the raw times; the parent's findings about the candidate's times can
    only turn an ``ok`` into ``rejected``."""
    if t is None or not t.ref or not t.cand:
        return
    f = figures(t)
    clock = t.clock or "cuda_event"
    figure = config.timing_figure if clock == "cuda_event" else "gpu"
    host = host_contention(t.load or {})
    # the host's share matters to a figure the host is part of: the CPU's, the host figure, or
    # a launch-bound call's (its GPU time follows the host's issue)
    host_bound = clock != "cuda_event" or figure == "host" or bool(f.launch_bound)
    # On the CPU clock the clean window's check subtracts the judge's run-queue waits from each
    # side's slack; on a contended host those waits swing by tens of milliseconds a call (an A/A
    # pair on 2 busy cores read slacks 50 ms apart), so an excess there is not evidence: the verdict
    # is contended (not trusted: never faster or slower, cudal1.speedup) instead of rejected.  A
    # report that cannot fit the window at all (``_fit``) is rejected whatever the host did, and so
    # is any excess on a GPU's clock, whose bound is microseconds (the reward credits a contended
    # verdict's speedup: a timing lie must not pass there by loading the host).
    unchecked = ""
    if (clock != "cuda_event" and host.get("contended") and f.window.get("mismatch")
            and f.timing_mismatch == f.window["mismatch"]):
        unchecked, f.timing_mismatch = f.timing_mismatch, ""
    for flag, why in (("side_stream", f.side_stream), ("timing_mismatch", f.timing_mismatch),
                      ("below_physical_limit", f.below_physics)):
        if not why:
            continue
        if r.status is Status.OK:
            r.status = Status.REJECTED
            r.message = why
        if flag not in r.flags:
            r.flags.append(flag)
    if f.launch_bound and "launch_bound" not in r.flags:
        r.flags.append("launch_bound")
        note = f"launch-bound: the host's issue time exceeds the GPU time ({f.launch_bound})"
        r.message = f"{r.message}\n{note}".strip()
    r.timing_figure = figure
    r.reference = Timing.from_samples(f.samples(figure, "ref"), clock, keep=config.keep_samples)
    r.candidate = Timing.from_samples(f.samples(figure, "cand"), clock, keep=config.keep_samples)
    if clock == "cpu_monotonic" and "cpu_timing" not in r.flags:
        r.flags.append("cpu_timing")
    spread = max(
        r.candidate.iqr_ms / max(r.candidate.median_ms, 1e-12), r.reference.iqr_ms / max(r.reference.median_ms, 1e-12)
    )
    if spread > 0.10:
        r.flags.append("high_variance")
    for name in FIGURES:
        ref, cand = f.samples(name, "ref"), f.samples(name, "cand")
        r.figures[name] = {"reference_ms": median(ref), "candidate_ms": median(cand),
                           "speedup": speedup(median(ref), median(cand)) if r.status is Status.OK else None}
    if f.window:
        r.figures["gpu"]["window"] = {k: v for k, v in f.window.items() if k != "mismatch"}
        share = f.window.get("bound_share") or 0.0
        if r.status is Status.OK and share > 0.10:
            part = f"{share:.0%} of its time" if share < 1 else f"{share:.3g}x its time"
            bound = f.window["bound_ms"]
            within = f"{bound * 1e3:.3g} us" if bound < 1 else f"{bound:.3g} ms"
            r.message = (f"{r.message}\nthe clean window checks this candidate's timing reports to within "
                         f"{within} per call ({part}): smaller under-reports cannot be told from noise").strip()
    if clock == "cuda_event":  # what the device-wide join cost, and what of it each side was charged
        r.figures["gpu"]["join"] = {
            "base_ms": f.base_ms,
            "charged_ms": {"reference": f.charged_ms.get("ref", 0.0), "candidate": f.charged_ms.get("cand", 0.0)},
            "probe_ms": {"reference": f.join_probe_ms.get("ref"), "candidate": f.join_probe_ms.get("cand")}}
    if r.status is Status.OK:
        r.speedup = speedup(r.reference.median_ms, r.candidate.median_ms)
        r.speedup_ci = speedup_ci(
            f.samples(figure, "ref"), f.samples(figure, "cand"), t.blocks, config.bootstrap_samples
        )
        if clock == "cpu_monotonic":  # the upper bound covers the handoff's cost per call (stats)
            r.speedup_ci = cpu_protocol_ci(r.speedup_ci, r.candidate.median_ms)
    if t.cost_ms:  # where the clean worker's timing phase spent its wall time (information only)
        r.figures["cost"] = (dict(t.cost_ms) | ({"short_waits": t.short_waits} if t.short_waits else {})
                             | ({"planned_trials": t.planned_trials} if t.planned_trials else {}))
    blocked = {side: sum(1 for row in rows if len(row) > 3 and row[3]) for side, rows in
               (("reference", t.ref), ("candidate", t.cand))}
    if clock == "cuda_event" and any(blocked.values()):  # their GPU figure holds host time (timer.GateWait)
        r.figures["blocked_calls"] = blocked | {"calls": {"reference": len(t.ref), "candidate": len(t.cand)}}
    if host:
        r.figures["contention"] = {"host": host}
        if host["contended"] and host_bound and r.status is Status.OK:
            r.flags.append("contended")
            share = host["wait_share"]
            r.message = (
                f"{r.message}\ncontended: the host was shared while this was timed (the reference's threads "
                f"waited {share['reference']:.0%} of their runnable time for a CPU, the candidate's "
                f"{share['candidate']:.0%}; {host.get('runnable', 0):.3g} tasks runnable on {host['cpus']} CPUs): "
                "the timing is not trusted"
            ).strip()
            if unchecked:
                r.message += f"; nor could the clean window check its reports ({unchecked})"
