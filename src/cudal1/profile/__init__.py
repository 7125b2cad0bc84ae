"""Measured kernel profiles of a program on one call: data, collection, rules, text.

* :mod:`.model`: :class:`ProgramProfile` (kernels, bytes, FLOPs, shares of peak, class) and
  :class:`Profiles` (reference and candidate of one verdict), JSON round-trips.
* :mod:`.collect`: one call under torch.profiler (CUPTI on CUDA, operator times on the CPU);
  the task's bytes and FLOPs.  Imports torch inside its functions.
* :mod:`.rules`: peaks, shares of peak and the class (the rule is written there).
* :mod:`.ncu`: Nsight Compute's metrics where ``ncu`` runs, or one line saying why not.
* :mod:`.text`: profiles as text for people.

A base package: it imports no other cudal1 layer.  The judge runs the collection after timing,
off the verdict's path (docs/harness.md, "Profiles"); a candidate's profile is information only.
"""

from cudal1.profile.model import (
    TOOLS,
    BoundClass,
    KernelStat,
    NcuMetrics,
    Profiles,
    ProfileStatus,
    ProgramProfile,
)

__all__ = ["TOOLS", "BoundClass", "KernelStat", "NcuMetrics", "ProfileStatus", "Profiles", "ProgramProfile"]
