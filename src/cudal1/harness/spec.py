"""What the parent hands the two children of a job, and what comes back: typed, not dicts.

Contract: :class:`WorkerSpec` is the clean reference worker's whole job and
:class:`CandidateSpec` the candidate's process's (both frozen; pickled to forkserver children).
The reference worker's ``config`` is the resolved :class:`~cudal1.config.EvalConfig`, so defaults
are stated once, in the config, never restated by a reader.  The candidate's spec holds only what
its process needs (:class:`CandidateSettings`, taken from that config): no seed, no tolerances, no
timing plan; the weights' seed comes with its ``construct`` request, the inputs call by call.
:class:`WorkerVerdict` is the reference worker's signed ``result`` message parsed into stages
(build, correctness, timing); unknown keys in a message are ignored, missing ones take the defaults below.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from cudal1.config import EvalConfig
from cudal1.tolerances import Tolerances

MODES = ("eval", "build", "baseline")


# What a confined CUDA process needs writable beyond its own directories: the device files
# (``/dev``; narrowed to NVIDIA's when the candidate stays at uid 0) and ``/proc`` (the driver
# writes there at start-up: its init fails with cudaErrorOperatingSystem otherwise; narrowed to
# its own entry at uid 0).  Ownership keeps an unprivileged uid out of other processes' entries.
CUDA_WRITABLE = ("/dev", "/proc")

@dataclass(frozen=True)
class PhaseLimits:
    """Each phase's deadline as the parent enforces it (a stalled process dumps its stacks at 80%)."""

    setup_s: float
    build_s: float  # the import, builds outside it, and torch.compile's compiling inside a call
    call_s: float  # every other phase

    @classmethod
    def of(cls, config: EvalConfig) -> "PhaseLimits":
        return cls(config.setup_timeout_s, config.build_timeout_s, config.timeout_s)

    def of_phase(self, phase: str) -> float:
        return {"setup": self.setup_s, "import": self.build_s, "build": self.build_s,
                "compile": self.build_s, "compile_cpu": self.build_s}.get(phase, self.call_s)


@dataclass(frozen=True)
class CandidateSettings:
    """What the candidate's process takes from the judge config: how it sets up the device and
    its own timer, and its deadlines (nothing a verdict rests on)."""

    math_mode: str  # strict: TF32 off (the reference worker sets the same); torch-default: as torch ships
    flush_l2: bool  # its timer flushes L2 before each timed call, as the reference worker's does
    poison_freed_memory: bool  # fill the allocator's free blocks with NaN after each checked call
    limits: PhaseLimits
    bind_cpu_threads: bool = False  # on the CPU clock, bind its threads as the reference worker binds its own
    compile_off_lease: bool = False  # EvalConfig.compile_off_lease: its Triton compiles are marked too
    autotune_off_lease: bool = False  # EvalConfig.autotune_off_lease: an autotuning compile goes off the lease too

    @classmethod
    def of(cls, config: EvalConfig) -> "CandidateSettings":
        return cls(config.math_mode, config.flush_l2, config.poison_freed_memory, PhaseLimits.of(config),
                   binds_cpu_threads(config), config.compile_off_lease,
                   config.compile_off_lease and config.autotune_off_lease)


def binds_cpu_threads(config: EvalConfig) -> bool:
    """Whether a CPU-timed job's two processes bind their threads
    (:func:`cudal1.harness.process_start.bind_threads_for_cpu_timing`): asked for, and one job at a
    time (jobs timed side by side would all put their main threads on the same CPU)."""
    return config.cpu_binding and config.workers_per_gpu == 1


@dataclass(frozen=True)
class ExactCacheSpec:
    """Where the float64 answers of the task's correctness inputs live in this batch."""

    path: str
    digest: str | None = None  # what the file must hash to (sent by an earlier worker); None: compute


@dataclass(frozen=True)
class KnownProbe:
    """The degenerate-task check's finding for this batch's inputs, from an earlier worker of the
    task (its ``task`` message, sent before any candidate code ran): a later worker of the task in
    the batch takes it instead of running the check again."""

    degenerate: str | None = None  # why the reference output is degenerate (None when it is not)


@dataclass(frozen=True)
class WorkerSpec:
    mode: str  # eval (the full protocol) | build (import only, no GPU) | baseline (reference vs wrapped copy)
    device: str  # cpu | cuda (the worker sees one GPU, index 0)
    config: EvalConfig
    tolerances: Tolerances  # the correctness rule
    input_seed: int  # secret per-batch seed of every input the worker draws
    reference_path: str
    reference_module: str
    log_path: str  # everything the child prints goes here
    env: dict[str, str] = field(default_factory=dict)  # set in the child before anything else
    candidate_path: str | None = None
    candidate_module: str | None = None
    baseline_mode: str | None = None
    exact_cache: ExactCacheSpec | None = None
    known_probe: KnownProbe | None = None  # the task's degenerate check, done by an earlier worker of the batch
    cwd: str | None = None  # the child's working directory: relative paths a candidate writes land there
    gpu_lease: str | None = (
        None  # lock file of the GPU's lease (shared while using it, exclusive while timing); None: none
    )
    slot_dir: str = ""  # where CPU slots (shared with the candidate's process) are created
    candidate_pid: int = 0  # the candidate's process (stopped while the reference is timed); 0: none

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {self.mode!r}")

    def fingerprint(self) -> str:
        """A canonical text of the whole spec (the runtime guard compares it before and after
        candidate calls)."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True, default=repr)


@dataclass(frozen=True)
class CandidateSpec:
    """The candidate's process: import (and build) the candidate, construct it, run the calls the
    reference worker asks for.  ``mode``: eval | build (import only, no GPU: fills the build cache)
    | baseline (the reference wrapped by ``baseline_mode`` plays the candidate)."""

    mode: str
    device: str  # cpu | cuda (the process sees one GPU, index 0)
    settings: CandidateSettings
    reference_path: str
    reference_module: str
    log_path: str
    env: dict[str, str] = field(default_factory=dict)
    candidate_path: str | None = None
    candidate_module: str | None = None
    baseline_mode: str | None = None
    cwd: str | None = None
    confine: dict[str, Any] = field(default_factory=dict)  # ConfinePolicy fields; {}: not confined
    display_name: str = ""  # how messages name the candidate's file (its label), instead of the staged copy

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {self.mode!r}")

    def fingerprint(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, default=repr)


@dataclass
class BuildStage:
    build_s: float | None = None  # seconds the import (and any extension build) took
    compile_log: str = ""
    build_error: bool = False  # a compiler error (not an import-time exception of other kinds)


@dataclass
class TimingStage:
    """The timed calls as measured (figures and statistics are computed from them:
    :mod:`cudal1.harness.figures`, :mod:`cudal1.harness.parent.stats`).
    ``ref``/``cand``: one row per call, ``[gpu_ms, device_ms, host_ms, blocked, escaped, window_ms,
    waited_ms]``; ``window_ms`` is the reference worker's own clock from handing out the call's key
    to seeing its outputs' digest (:mod:`cudal1.harness.window`), for both sides; ``waited_ms``
    the run-queue waits inside it of the threads it depends on (:mod:`cudal1.harness.reference.hostload`).
    ``blocks``: ``[who, calls, span_ms]`` per timing block, in order."""

    clock: str = ""  # cuda_event | cpu_monotonic
    ref: list[list[float]] = field(default_factory=list)
    cand: list[list[float]] = field(default_factory=list)
    blocks: list[list[Any]] = field(default_factory=list)
    overhead_ms: float = 0.0  # the clean side's empty-call span (subtracted from every gpu_ms)
    calibration: list[float] = field(default_factory=list)  # device_ms - gpu_ms on busy clean calls
    cand_join: list[float] = field(default_factory=list)  # the same probe in the candidate's process (reported, unused)
    floor_ms: float | None = None  # memory floor: inputs + outputs at measured copy bandwidth (CUDA only)
    physics_ms: float | None = None  # outputs written once at the device's peak bandwidth (CUDA only)
    sealed: str = ""  # what sealing the candidate's process against new processes did (applied / refused: why)
    helpers: int = 0  # processes of the candidate's beside its own when it was sealed (compile workers, helpers)
    load: dict[str, Any] = field(
        default_factory=dict
    )  # host load per block (cudal1.harness.reference.hostload.BlockLoad)
    cost_ms: dict[str, float] = field(default_factory=dict)  # where the phase's wall went (reference.spans.Spans)
    short_waits: int = 0  # timed calls (both sides) whose gate waited the short time (timer.GateWait)
    planned_trials: int = 0  # calls a side planned from the device time, cut to the budget (0: not cut)


@dataclass
class TaskFindings:
    """The worker's ``task`` message: what it learned about the task before any candidate code
    ran (the parent accepts it only in the reference phase)."""

    degenerate: str | None = None  # why the reference output is degenerate (None when it is not)
    exact_digest: str = ""  # SHA-256 of the float64-answer file this worker wrote ('' when none)
    exact_source: str = "none"  # none | cache | computed | per-candidate (too large to keep)
    sent: bool = False  # the worker sent them (its reference phase ended)

    @classmethod
    def from_message(cls, data: dict[str, Any]) -> "TaskFindings":
        return cls(degenerate=data.get("degenerate") or None, exact_digest=str(data.get("exact_digest") or ""),
                   exact_source=str(data.get("exact_source") or "none"), sent=True)


@dataclass
class WorkerVerdict:
    """The worker's ``result`` message."""

    status: str
    message: str = ""
    flags: list[str] = field(default_factory=list)
    phase: str = ""  # the protocol phase it ended in ("done" after timing)
    build: BuildStage = field(default_factory=BuildStage)
    correctness: dict[str, Any] = field(default_factory=dict)  # the correctness block (see worker.Worker.correctness)
    timing: TimingStage | None = None  # None unless timing ran
    kernels: list[str] | None = None  # CUDA kernels of one profiled call (CUDA only)
    profile: dict[str, Any] | None = None  # cudal1.profile.Profiles as a dict (config.profile; information only)
    traceback: str = ""
    slots: str = ""  # how inputs and outputs crossed the two processes (CUDA IPC, or host memory and why)
    reference_cost: dict[str, float] = field(default_factory=dict)  # the reference phase's spans, ms (information)
    exclusive_s: float | None = None  # the lease held exclusive before timing, s (information; RefWorker.enter)

    @classmethod
    def from_message(cls, data: dict[str, Any]) -> "WorkerVerdict":
        build = BuildStage(
            build_s=float(data["build_s"]) if data.get("build_s") is not None else None,
            compile_log=str(data.get("compile_log") or ""),
            build_error=bool(data.get("build_error")),
        )
        timing = None
        if isinstance(data.get("timing"), dict):
            raw = data["timing"]
            timing = TimingStage(**{f.name: raw[f.name] for f in dataclasses.fields(TimingStage) if f.name in raw})
        kernels = data.get("kernels")
        return cls(
            status=str(data["status"]),
            message=str(data.get("message") or ""),
            flags=[str(f) for f in data.get("flags") or []],
            phase=str(data.get("phase") or ""),
            build=build,
            correctness=dict(data.get("correctness") or {}),
            timing=timing,
            kernels=[str(k) for k in kernels] if kernels is not None else None,
            profile=data["profile"] if isinstance(data.get("profile"), dict) else None,
            traceback=str(data.get("traceback") or ""),
            slots=str(data.get("slots") or ""),
            reference_cost=numbers_in(data.get("reference_cost")),
            exclusive_s=number_in(data.get("exclusive_s")),
        )


def numbers_in(value: Any) -> dict[str, float]:
    """The number-valued entries of a dict from a worker's message (a span table), as floats;
    {} when it is not a dict."""
    if not isinstance(value, dict):
        return {}
    return {str(k): float(v) for k, v in value.items() if number_in(v) is not None}


def number_in(value: Any) -> float | None:
    """A number-valued field of a worker's message as a float; None when it is not a number."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def calls_torch_compile(spec: WorkerSpec | CandidateSpec) -> bool:
    """The job calls ``torch.compile``: a compile-mode baseline, or a candidate whose source names
    it (a text search).  The candidate's process imports Inductor in its import phase, which holds
    no GPU lease, instead of on its first ``torch.compile``; for a compile-mode baseline the
    reference worker also holds the lease exclusive from ``construct`` on (on a GPU: see
    :meth:`cudal1.harness.reference.worker.RefWorker.construct_lease`)."""
    if spec.mode == "baseline":
        from cudal1.compile_modes import COMPILE_MODES
        from cudal1.harness.baselines import canonical_mode

        return canonical_mode(spec.baseline_mode or "") in COMPILE_MODES
    return _names(spec, "torch.compile")


def names_triton(spec: WorkerSpec | CandidateSpec) -> bool:
    """A candidate whose source names Triton (a text search): its process marks Triton's compiles
    when compiling runs off the GPU's lease (:mod:`cudal1.harness.child.compiling`)."""
    return _names(spec, "triton")


def _names(spec: WorkerSpec | CandidateSpec, text: str) -> bool:
    if spec.mode == "eval" and spec.candidate_path:
        try:
            with open(spec.candidate_path) as f:
                return text in f.read()
        except OSError:
            return False
    return False
