"""The profile of one program on one call, as data: kernels, bytes, FLOPs, shares of peak, a class.

Contract: :class:`ProgramProfile` is what one profiled call of a program (reference or candidate)
measured; :class:`Profiles` pairs the reference's with the candidate's for one verdict.  Both
round-trip through ``to_dict``/``from_dict`` (the JSON under ``profile`` in ``cudal1 judge
--json`` and in the run store); unknown keys are ignored, missing ones take the defaults below.
Times are microseconds.  Plain data: nothing here imports torch.

Trust: the reference's figures come from the clean reference worker.  The candidate's kernel
list and times come from the candidate's own process, which can write anything there: they are
information for people and prompts, and no verdict or figure rests on them.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

TOOLS = ("cupti", "ncu")  # what --profile takes (cupti: torch.profiler; ncu: that plus Nsight Compute)


class ProfileStatus(str, enum.Enum):
    """``ok``: measured.  ``unavailable``: the tool cannot run here (the note says why).
    ``failed``: the profiled call or its collection raised (the note says what).  ``skipped``:
    not profiled (the verdict ended before timing, or the program was not asked for)."""

    OK = "ok"
    UNAVAILABLE = "unavailable"
    FAILED = "failed"
    SKIPPED = "skipped"


class BoundClass(str, enum.Enum):
    """What limits the call (the rule: :func:`cudal1.profile.rules.classify`)."""

    LAUNCH = "launch-bound"
    MEMORY = "memory-bound"
    COMPUTE = "compute-bound"
    MIXED = "mixed"


@dataclass
class KernelStat:
    """One kernel name's launches in the call (on the CPU: one operator's self time)."""

    name: str
    launches: int
    total_us: float
    mean_us: float
    share: float  # of all kernel time in the call (the shares of a call's kernels sum to 1)
    grid: list[int] | None = None  # CUDA only, from CUPTI (the first launch's)
    block: list[int] | None = None
    registers: int | None = None  # per thread
    shared_memory: int | None = None  # bytes per block, static + dynamic

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "KernelStat":
        return cls(**{k: d[k] for k in _FIELDS[cls] if k in d})


@dataclass
class NcuMetrics:
    """Nsight Compute's figures for the call, averaged over its kernels weighted by duration."""

    sm_throughput: float | None = None  # % of peak sustained
    dram_throughput: float | None = None  # % of peak sustained
    achieved_occupancy: float | None = None  # % of the SM's warps
    stalls: list[list[Any]] = field(default_factory=list)  # [reason, cycles per issued instruction], top first
    kernels: int = 0  # kernels ncu profiled

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "NcuMetrics":
        return cls(**{k: d[k] for k in _FIELDS[cls] if k in d})


@dataclass
class ProgramProfile:
    """One program's profiled call (see the module docstring for what can be trusted)."""

    status: ProfileStatus = ProfileStatus.SKIPPED
    tool: str = "cupti"  # cupti (torch.profiler; operator times on the CPU) | ncu
    device: str = ""  # cuda | cpu
    note: str = ""  # why it is not ok, or what to keep in mind
    call_us: float = 0.0  # the call's span: CUDA, first kernel's start to last kernel's end; CPU, the call
    busy_us: float = 0.0  # time at least one kernel ran (union of kernel intervals)
    kernels: list[KernelStat] = field(default_factory=list)  # every kernel, longest total first
    bytes_moved: int | None = None  # inputs, outputs and weights once (the task's, computed on the reference)
    flops: int | None = None  # torch.utils.flop_counter on the reference (the task's work)
    achieved_bandwidth: float | None = None  # bytes/s: bytes_moved / call_us
    bandwidth_share: float | None = None  # of the device's peak memory bandwidth
    achieved_flops: float | None = None  # FLOP/s: flops / call_us
    flops_share: float | None = None  # of the dtype's peak, where it is known
    intensity: float | None = None  # FLOPs per byte moved
    peak_bandwidth: float | None = None  # bytes/s, read from the device (None on the CPU)
    peak_flops: float | None = None  # FLOP/s of the call's main dtype, where known (cudal1.profile.rules)
    bound: BoundClass | None = None  # the class (JSON key: "class")
    ncu: NcuMetrics | None = None

    @property
    def ok(self) -> bool:
        return self.status is ProfileStatus.OK

    @property
    def launches(self) -> int:
        return sum(k.launches for k in self.kernels)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["status"] = self.status.value
        d["class"] = self.bound.value if self.bound else None
        del d["bound"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ProgramProfile":
        d = dict(d)
        out = cls(**{k: d[k] for k in _FIELDS[cls] if k in d and k not in ("status", "kernels", "bound", "ncu")})
        out.status = ProfileStatus(d.get("status") or "skipped")
        out.kernels = [KernelStat.from_dict(k) for k in d.get("kernels") or []]
        out.bound = BoundClass(d["class"]) if d.get("class") else None
        out.ncu = NcuMetrics.from_dict(d["ncu"]) if isinstance(d.get("ncu"), dict) else None
        return out

    @classmethod
    def not_ok(cls, status: ProfileStatus, note: str, tool: str = "cupti", device: str = "") -> "ProgramProfile":
        return cls(status=status, tool=tool, device=device, note=note)


@dataclass
class Profiles:
    """The reference's and the candidate's profiles of one verdict (``profile`` in its JSON)."""

    tool: str = "cupti"
    reference: ProgramProfile = field(default_factory=ProgramProfile)
    candidate: ProgramProfile = field(default_factory=ProgramProfile)
    candidate_trusted: bool = False  # always False: the candidate's process can forge its own profile

    def to_dict(self) -> dict[str, Any]:
        return {"tool": self.tool, "reference": self.reference.to_dict(), "candidate": self.candidate.to_dict(),
                "candidate_trusted": False}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Profiles":
        return cls(tool=str(d.get("tool") or "cupti"),
                   reference=ProgramProfile.from_dict(d.get("reference") or {}),
                   candidate=ProgramProfile.from_dict(d.get("candidate") or {}))


_FIELDS = {c: {f.name for f in dataclasses.fields(c)} for c in (KernelStat, NcuMetrics, ProgramProfile)}
