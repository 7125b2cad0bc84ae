"""Where a batch is judged: the device plan (which GPUs time candidates, for which
architectures builds target, which backend runs the jobs) and the unit of work, a :class:`Job`.

Contract: :meth:`DevicePlan.detect` reads the machine (``nvidia-smi``) and raises
:class:`HarnessError` for bad usage (``device='cuda'`` with no GPU); nothing here starts a process.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from cudal1.harness.envinfo import Gpu, gpu_inventory
from cudal1.types import Candidate, Task


class HarnessError(RuntimeError):
    """Bad usage of the judge (not a verdict on a candidate)."""


BACKENDS = ("local", "ray")


@dataclass(frozen=True)
class DevicePlan:
    device: str  # "cuda" | "cpu"
    lanes: tuple[int | None, ...]  # GPU index per timing lane; (None,) on CPU
    arch_list: str  # TORCH_CUDA_ARCH_LIST for builds ("" on CPU): each distinct capability once, no PTX
    driver: str | None = None
    backend: str = "local"  # local (threads + processes here) | ray (actors and tasks on a Ray cluster)
    ray_address: str | None = None  # None with backend ray: a local cluster started on demand

    def with_backend(self, backend: str, ray_address: str | None = None) -> "DevicePlan":
        if backend not in BACKENDS:
            raise HarnessError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
        return dataclasses.replace(self, backend=backend, ray_address=ray_address if backend == "ray" else None)

    def hardware_name(self) -> str:
        """What judges this plan's candidates, for run records: the GPU model(s), "CPU", or the Ray cluster."""
        if self.backend == "ray":
            return f"Ray cluster ({len(self.lanes)} {'GPU' if self.device == 'cuda' else 'CPU'} lane(s))"
        if self.device != "cuda":
            return "CPU"
        return ", ".join(sorted({g.name for g in gpu_inventory() if g.index in self.lanes})) or "CUDA GPU"

    @classmethod
    def detect(cls, device: str, gpus: list[int] | None = None) -> "DevicePlan":
        inventory: list[Gpu] = gpu_inventory() if device in ("auto", "cuda") else []
        if gpus is not None:
            inventory = [g for g in inventory if g.index in gpus]
        if device == "cuda" and not inventory:
            raise HarnessError("--device cuda: no NVIDIA GPU found (nvidia-smi lists none)")
        if not inventory:
            return cls("cpu", (None,), "")
        arch = ";".join(sorted({g.capability for g in inventory}))
        return cls("cuda", tuple(g.index for g in inventory), arch, inventory[0].driver)


@dataclass
class Job:
    """One unit of work for a timing lane: a candidate, or a baseline mode, for a task."""

    task: Task
    candidate: Candidate | None = None
    baseline_mode: str | None = None

    @property
    def label(self) -> str:
        return self.baseline_mode or (self.candidate.label if self.candidate else "")
