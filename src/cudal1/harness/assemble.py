"""Turn a worker's :class:`~cudal1.harness.sandbox.JobOutcome` into a typed ``EvalResult``.

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
from typing import Any

from cudal1.config import EvalConfig
from cudal1.harness.sandbox import JobOutcome
from cudal1.harness.stats import bootstrap_speedup_ci, charge, speedup
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
    r.stderr_tail = outcome.log_tail[-4000:]
    r.config_hash = config.hash()
    r.build_s = r.phase_s.get("build", 0.0)  # extensions built inside ModelNew.__init__
    if outcome.built:
        r.build_s += float(outcome.built.get("build_s", 0.0))
        r.compile_log = str(outcome.built.get("compile_log", ""))
    degenerate = outcome.task.get("degenerate")
    try:
        return _assemble(outcome, config, r)
    finally:
        if degenerate:
            r.flags.append("degenerate_task")
            r.message = (r.message + "\n" if r.message else "") + f"degenerate task: {degenerate}"


def _assemble(outcome: JobOutcome, config: EvalConfig, r: EvalResult) -> EvalResult:
    if outcome.tamper:
        r.status, r.flags = Status.REJECTED, ["tampering"]
        r.message = outcome.tamper
        return r
    if outcome.result is None:
        return _no_verdict(outcome, r)
    data = outcome.result
    r.phase = str(data.get("phase") or outcome.phase)
    r.status = Status(data["status"])
    r.message = str(data.get("message", ""))
    r.flags = list(dict.fromkeys(data.get("flags", [])))
    if data.get("compile_log"):
        r.compile_log = str(data["compile_log"])
    if "build_s" in data:
        r.build_s = float(data["build_s"]) + r.phase_s.get("build", 0.0)
    if data.get("traceback"):
        r.message = f"{r.message}\n{data['traceback']}".strip()
    r.kernels = [str(k) for k in data.get("kernels") or []]
    corr = data.get("correctness")
    if corr:
        r.correctness = Correctness(**{k: v for k, v in corr.items() if k in Correctness.__dataclass_fields__})
    _timings(data, config, r)
    return r


def _no_verdict(outcome: JobOutcome, r: EvalResult) -> EvalResult:
    tail = outcome.log_tail.strip().splitlines()[-3:]
    where = f" during {outcome.phase}"
    if outcome.timed_out:
        r.status = Status.TIMEOUT
        r.message = f"{outcome.phase} exceeded its {outcome.limit_s:g}s limit; the worker was killed"
        return r
    r.status = Status.RUNTIME_ERROR
    code = outcome.exitcode
    if code is not None and code < 0:
        r.flags = ["signal"]
        r.message = f"worker killed by {_signal_name(code)}{where}"
    else:
        r.flags = ["no_verdict"]
        r.message = f"worker exited (code {code}) without a verdict{where}"
    if any(sign in outcome.log_tail for sign in ("illegal memory access", "invalid address space", "misaligned address", "unspecified launch failure")):
        r.flags.append("illegal_memory_access")
    if tail:
        r.message += ": " + " | ".join(tail)[-1000:]
    return r


def _timings(data: dict[str, Any], config: EvalConfig, r: EvalResult) -> None:
    ref, cand = data.get("ref_samples"), data.get("cand_samples")
    raw = data.get("raw")
    if raw:  # recompute the charge here from the raw clocks: the parent's numbers are authoritative
        charged = charge(raw["ref_stream"], raw["ref_device"], raw["cand_stream"], raw["cand_device"], data.get("calibration") or [])
        ref, cand = charged.ref_ms, charged.cand_ms
        if charged.side_stream and r.status is Status.OK:
            r.status = Status.REJECTED
            r.message = f"side-stream work escaped the calling stream ({charged.cand_excess_ms:.3g} ms per call beyond the join cost)"
        if charged.side_stream and "side_stream" not in r.flags:
            r.flags.append("side_stream")
    if not ref or not cand:
        return
    clock = str(data.get("clock", "cuda_event"))
    r.reference = Timing.from_samples(ref, clock, keep=config.keep_samples)
    r.candidate = Timing.from_samples(cand, clock, keep=config.keep_samples)
    if clock == "cpu_monotonic" and "cpu_timing" not in r.flags:
        r.flags.append("cpu_timing")
    spread = max(r.candidate.iqr_ms / max(r.candidate.median_ms, 1e-12), r.reference.iqr_ms / max(r.reference.median_ms, 1e-12))
    if spread > 0.10:
        r.flags.append("high_variance")
    if r.status is Status.OK:
        r.speedup = speedup(r.reference.median_ms, r.candidate.median_ms)
        r.speedup_ci = bootstrap_speedup_ci(ref, cand, config.bootstrap_samples)
