"""Typed values that flow between cudal1's layers.

Contract: everything here is plain data (dataclasses and enums), JSON-serialisable through
``to_dict``/``from_dict``, and imports nothing heavy (no torch). A verdict is always an
:class:`EvalResult` with a :class:`Status`; there are no sentinel numbers such as ``-1.0``.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from dataclasses import dataclass, field
from typing import Any

from cudal1.profile.model import Profiles


class Status(str, enum.Enum):
    """Outcome of evaluating one candidate.

    ``ok``: compiled, correct on every trial, timed.  ``compile_error``: an exception while
    building or importing the candidate (or no ``ModelNew``).  ``runtime_error``: a crash
    (signal, illegal memory access, OOM) or an exception from construction on.
    ``incorrect``: ran but the outputs do not match the reference.  ``timeout``: a phase
    exceeded its hard limit and the worker was killed.  ``rejected``: the judge refused the
    candidate for behaviour it does not accept (tampering, lazy outputs, …); see ``flags``.
    """

    OK = "ok"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    INCORRECT = "incorrect"
    TIMEOUT = "timeout"
    REJECTED = "rejected"


def content_hash(*parts: str) -> str:
    """Stable SHA-256 hex digest of the given strings (length-prefixed, so order matters)."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


@dataclass(frozen=True)
class Task:
    """A KernelBench-format task: Python source defining ``Model``, ``get_inputs`` and
    ``get_init_inputs``.  ``name`` is human readable (``19_ReLU``); ``task_id`` is the
    selector-style id (``level1/19`` for suite tasks, the file stem otherwise)."""

    name: str
    source: str
    level: int | None = None
    problem_id: int | None = None
    origin: str = ""  # where it was loaded from (path, dataset name); informational

    @property
    def hash(self) -> str:
        return content_hash("task", self.source)

    @property
    def task_id(self) -> str:
        if self.level is not None and self.problem_id is not None:
            return f"level{self.level}/{self.problem_id}"
        return self.name

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"hash": self.hash}


@dataclass(frozen=True)
class Candidate:
    """Source code defining ``class ModelNew`` with ``Model``'s constructor signature."""

    source: str
    task_hash: str = ""
    label: str = ""  # free-form origin tag (file name, policy name, ...)

    @property
    def hash(self) -> str:
        return content_hash("candidate", self.source)


def reference_candidate(task: Task) -> Candidate:
    """The reference itself as a candidate: the 1.00x anchor of a task's pool (search round 0,
    GRPO's anchor, the report's baseline).  One definition, so every app gets the same hash."""
    return Candidate(f"{task.source.rstrip()}\n\n\nModelNew = Model\n", task_hash=task.hash, label="reference")


@dataclass
class Correctness:
    """What the correctness phase saw.  Errors are over all trials checked so far."""

    trials: int = 0  # trials run (including the failing one)
    passed: int = 0
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    failing_trial: int | None = None
    detail: str = ""  # short human-readable mismatch summary (shape, dtype, values...)
    rechecked: int = 0  # timed outputs re-checked against the reference
    rule: str = ""  # what judged the values: exact (float64 answer), fixed (per-dtype limits) or exact+fixed
    rule_note: str = ""  # why an output fell back to the fixed table ('' when none did)
    ref_err: float | None = None  # exact rule: the fp32 reference's own normwise error against float64
    cand_err: float | None = None  # exact rule: the candidate's normwise error against float64
    bound: float | None = None  # exact rule: the bound cand_err had to stay within (tightest check)


@dataclass
class Timing:
    """Summary of one timed callable, in milliseconds.  ``clock`` says what measured it:
    ``cuda_event`` (device events, all streams joined) or ``cpu_monotonic`` (host clock)."""

    median_ms: float
    iqr_ms: float
    mean_ms: float
    min_ms: float
    trials: int
    clock: str
    samples_ms: list[float] = field(default_factory=list)

    @classmethod
    def from_samples(cls, samples: list[float], clock: str, keep: bool = True) -> "Timing":
        import statistics

        s = sorted(samples)
        n = len(s)
        q = statistics.quantiles(s, n=4, method="inclusive") if n >= 2 else [s[0]] * 3
        return cls(
            median_ms=statistics.median(s),
            iqr_ms=q[2] - q[0],
            mean_ms=sum(s) / n,
            min_ms=s[0],
            trials=n,
            clock=clock,
            samples_ms=list(samples) if keep else [],
        )


@dataclass
class Environment:
    """Where a number was measured.  A number without its environment is not reported."""

    device: str = "cpu"  # "cuda" or "cpu"
    gpu_name: str | None = None
    gpu_capability: str | None = None
    driver: str | None = None
    cuda: str | None = None
    torch: str | None = None
    triton: str | None = None
    python: str | None = None
    cudal1: str | None = None
    hostname: str | None = None
    isolation: dict[str, str] = field(
        default_factory=dict
    )  # what confined the candidate's process (measure -> applied / refused: why)
    slots: str = ""  # how inputs and outputs crossed the two processes: cuda_ipc, host_files (and why)

    def key(self) -> str:
        """Identity used for caching baselines: device, GPU, torch and CUDA versions."""
        return content_hash("env", self.device, str(self.gpu_name), str(self.torch), str(self.cuda))


@dataclass
class EvalResult:
    """The judge's verdict on one candidate for one task."""

    status: Status
    task_name: str = ""
    task_hash: str = ""
    candidate_hash: str = ""
    message: str = ""  # one-paragraph human explanation (exception, mismatch, kill reason)
    flags: list[str] = field(default_factory=list)  # named behaviours (see cudal1.flags)
    correctness: Correctness = field(default_factory=Correctness)
    reference: Timing | None = None
    candidate: Timing | None = None
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None  # bootstrap 95% CI of the speedup
    compile_log: str = ""  # compiler output (kept for feedback to an LLM)
    stderr_tail: str = ""  # last lines the worker wrote to stdout/stderr
    phase: str = ""  # last phase reached (setup, import, construct, correctness, timing, done)
    environment: Environment = field(default_factory=Environment)
    config_hash: str = ""
    wall_s: float = 0.0  # wall time the judge spent on this candidate, builds included
    build_s: float = 0.0  # part of wall_s spent building/importing the candidate
    phase_s: dict[str, float] = field(default_factory=dict)  # wall seconds per worker phase
    kernels: list[str] = field(default_factory=list)  # CUDA kernels of one profiled forward
    timing_figure: str = ""  # what reference/candidate/speedup measure: gpu (device time) or host (host-inclusive)
    figures: dict[str, Any] = field(
        default_factory=dict
    )  # gpu/host -> reference_ms, candidate_ms, speedup (gpu: also join); information beside them, some of it
    # one number (gpu_memory_mib, exclusive_before_timing_s)
    profile: Profiles | None = None  # measured profiles (judge --profile): information only, see cudal1.profile

    @property
    def correct(self) -> bool:
        return self.status is Status.OK

    @property
    def reference_ms(self) -> float | None:
        return self.reference.median_ms if self.reference else None

    @property
    def candidate_ms(self) -> float | None:
        return self.candidate.median_ms if self.candidate else None

    def summary(self) -> dict[str, Any]:
        """The stable JSON contract of ``cudal1 eval --json`` (extra keys may be added)."""
        return {
            "status": self.status.value,
            "correct": self.correct,
            "speedup": self.speedup,
            "speedup_ci": list(self.speedup_ci) if self.speedup_ci else None,
            "reference_ms": self.reference_ms,
            "candidate_ms": self.candidate_ms,
            "flags": list(self.flags),
            "message": self.message,
            "task": self.task_name,
            "task_hash": self.task_hash,
            "candidate_hash": self.candidate_hash,
            "phase": self.phase,
            "clock": self.candidate.clock if self.candidate else None,
            "timing_figure": self.timing_figure or None,
            "figures": self.figures,
            "correctness": dataclasses.asdict(self.correctness),
            "environment": dataclasses.asdict(self.environment),
            "profile": self.profile.to_dict() if self.profile else None,
        }

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["status"] = self.status.value
        d["profile"] = self.profile.to_dict() if self.profile else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EvalResult":
        d = dict(d)
        d["status"] = Status(d["status"])
        d["correctness"] = Correctness(**d.get("correctness") or {})
        for key in ("reference", "candidate"):
            if d.get(key) is not None:
                d[key] = Timing(**d[key])
        d["environment"] = Environment(**d.get("environment") or {})
        if d.get("speedup_ci") is not None:
            d["speedup_ci"] = tuple(d["speedup_ci"])
        d["profile"] = Profiles.from_dict(d["profile"]) if isinstance(d.get("profile"), dict) else None
        return cls(**d)


# ---- policies and prompts (the optimizer's data; the judge never sees these) -------------------


@dataclass(frozen=True)
class Exemplar:
    """An earlier candidate shown in a contrastive prompt, with what the judge measured."""

    code: str
    speedup: float | None  # measured speedup (None for failed candidates)
    status: str = "ok"  # a Status value
    feedback: str = ""  # for failed ones: truncated compiler error or mismatch summary
    candidate_hash: str = ""


@dataclass(frozen=True)
class Prompt:
    """One chat request: ``system`` + ``user`` messages, and where they came from."""

    task_name: str
    task_hash: str
    system: str
    user: str
    template_version: str
    exemplar_hashes: tuple[str, ...] = ()
    task_source: str = ""  # the reference source (for policies that transform code, e.g. builtin)
    exemplar_codes: tuple[str, ...] = ()  # the exemplars' code, best last

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.user}]


@dataclass
class Completion:
    """A policy's answer to one prompt.  ``error`` is set (and ``text`` empty) when the request
    failed after retries; failures are recorded, never dropped."""

    text: str
    policy: str
    model: str = ""
    usage: dict[str, int] = field(default_factory=dict)  # prompt_tokens, completion_tokens
    error: str = ""
    latency_s: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)  # policy-specific (e.g. builtin passes)


@dataclass
class ParsedResponse:
    """A response split into CUDA-L1's sections.  ``code`` is None for a format failure."""

    analysis: str
    design: str
    code: str | None
    problem: str = ""  # why the format failed ("" when code was found)

    @property
    def format_ok(self) -> bool:
        return self.code is not None
