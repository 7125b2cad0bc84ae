"""The candidate's profiled call (``kernel_profile``), after timing; its answer is information only.

Contract: :func:`profile_candidate` runs one call of the candidate on private copies of the
inputs it is handed under :func:`cudal1.profile.collect.profile_call`, runs the usual second-line
checks after it, and replies ``{"profile": ProgramProfile as a dict}``; with ``warm`` it only sets
the profiler up (CUPTI's start), which the reference worker overlaps with its own.  The candidate can forge
that reply like anything in its process; the reference worker re-types it and no verdict or
figure depends on it.

The guards stay as they are: torch.profiler without ``with_stack`` installs no Python trace or
profile hook, so the audit hook (:mod:`cudal1.harness.child.signing_hook`) needs no exception for
it, and a candidate that installs one during the profiled call is refused as during any other
call.  CUPTI starts threads of its own, not processes, so the sealed process accepts it.
"""

from __future__ import annotations

from typing import Any

from cudal1.profile.collect import profile_call, warm_profiler
from cudal1.profile.model import ProfileStatus, ProgramProfile


def profile_candidate(proc: Any, request: dict[str, Any]) -> dict[str, Any]:
    """One profiled call (``proc``: the CandidateProcess); see the module docstring."""
    if proc.spec.mode == "baseline":
        return {"profile": ProgramProfile.not_ok(ProfileStatus.SKIPPED, "baseline").to_dict()}
    if request.get("warm"):  # set the profiler up while the reference worker sets up its own
        warm_profiler(proc.device)
        return {"warm": True}
    args, views = proc.inputs(request)
    result, out = profile_call(proc.model, args, proc.device)
    busy = proc.threads()
    if out is not None:
        proc.after_call("profiled call", args, views, out, busy)
    del out
    return {"profile": result.to_dict()}
