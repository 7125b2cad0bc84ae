"""The verdict's profiles, taken by the clean reference worker after timing (``config.profile``).

Contract: :func:`profile_both` profiles one reference call here and asks the candidate's process
for one profiled call of its own (``kernel_profile``), each on fresh inputs with L2 flushed
(:mod:`cudal1.profile.collect`), then fills both with the task's bytes and FLOPs (measured on the
reference) and the device's peaks (:func:`cudal1.harness.cuda_api.peak_bandwidth`, as the
physics floor reads it).  It returns :class:`cudal1.profile.model.Profiles` as a dict for the
``result`` message, and never raises: whatever goes wrong becomes a profile's ``failed`` status
and note, so profiling cannot change a verdict.  The candidate's reply is re-typed field by field
and capped (it may send anything); its figures stay information only.

Order: the candidate's process is asked to set its profiler up (``warm``) while this process sets
up its own (CUPTI's start overlaps); the candidate's process tree is then stopped for the
reference's profiled call, as while the reference is timed, and resumed for its own call.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from cudal1.profile.collect import (
    MAX_KERNELS,
    MAX_NAME,
    call_bytes,
    count_flops,
    main_dtype,
    profile_call,
    warm_profiler,
)
from cudal1.profile.model import KernelStat, Profiles, ProfileStatus, ProgramProfile
from cudal1.profile.rules import derive, peak_flops

SEED_OFFSET = 90_000  # the profiled call's inputs: fresh, apart from every other phase's seeds


def profile_both(worker: Any, ref_model: Any, link: Any) -> dict[str, Any]:
    """Both programs' profiles (see the module docstring); ``worker`` is the RefWorker."""
    try:
        return _profile_both(worker, ref_model, link)
    except Exception as exc:  # noqa: BLE001 - the guarantee: profiling never changes a verdict
        failed = ProgramProfile.not_ok(ProfileStatus.FAILED, f"profiling failed: {_why(exc)}")
        return Profiles(reference=failed, candidate=failed).to_dict()


def _profile_both(worker: Any, ref_model: Any, link: Any) -> dict[str, Any]:
    device = worker.device
    pair = Profiles(tool="cupti")
    seed = worker.input_seed + SEED_OFFSET
    nbytes = flops = None
    dtype = "float32"
    warming = _warm_candidate(worker, link)
    try:
        warm_profiler(device)  # beside the candidate's own set-up: the two processes' CUPTI starts overlap
    except Exception:  # noqa: BLE001 - the profiled call below tries again and says why
        pass
    lost = ""
    if warming:
        try:
            link.read()
        except BaseException as exc:  # noqa: BLE001 - a refusal, a lost process: its profile says so
            lost = f"the candidate's process: {_why(exc)}"
    try:
        link.pause()  # nothing of the candidate's runs beside the reference's profiled call
        try:
            with torch.no_grad():
                pair.reference, out = profile_call(ref_model, worker.make_inputs(seed), device)
        finally:
            link.resume()
        with torch.no_grad():
            inputs = worker.make_inputs(seed)
            nbytes, dtype = call_bytes(inputs, out, ref_model), main_dtype(inputs, out)
            del out
            flops = count_flops(ref_model, worker.make_inputs(seed))
    except Exception as exc:  # noqa: BLE001 - off the verdict's path
        pair.reference = ProgramProfile.not_ok(ProfileStatus.FAILED, _why(exc), device=device.type)
    pair.candidate = (ProgramProfile.not_ok(ProfileStatus.FAILED, lost, device=device.type) if lost
                      else _candidate(worker, link, seed))
    bandwidth, peak = _peaks(device, dtype)
    for p in (pair.reference, pair.candidate):
        derive(p, nbytes, flops, bandwidth, peak)
    return pair.to_dict()


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def _warm_candidate(worker: Any, link: Any) -> bool:
    """Ask the candidate's process to set its profiler up (its reply is read later); False when
    there is no candidate process to ask or the request could not be sent."""
    if worker.spec.mode == "baseline":
        return False
    try:
        link.send("kernel_profile", warm=True)
        return True
    except BaseException:  # noqa: BLE001 - a lost process: its profile will say so
        return False


def _candidate(worker: Any, link: Any, seed: int) -> ProgramProfile:
    if worker.spec.mode == "baseline":
        return ProgramProfile.not_ok(ProfileStatus.SKIPPED, "a baseline has no candidate process to profile")
    try:
        reply = link.request("kernel_profile", inputs=link.stage(worker.make_inputs(seed)), targets=[])
    except BaseException as exc:  # noqa: BLE001 - a refusal, a lost process: the verdict stands as timed
        return ProgramProfile.not_ok(ProfileStatus.FAILED, f"the candidate's process: {_why(exc)}",
                                     device=worker.device.type)
    return retype(reply.get("profile"))


def retype(raw: Any) -> ProgramProfile:
    """The candidate's profile as typed, capped data (anything malformed: a ``failed`` profile)."""
    try:
        if not isinstance(raw, dict):
            raise ValueError("no profile in the reply")
        status = ProfileStatus(str(raw.get("status")))
        p = ProgramProfile(status=status, tool="cupti", device=str(raw.get("device") or "")[:8],
                           note=str(raw.get("note") or "")[:300], call_us=_num(raw.get("call_us")),
                           busy_us=_num(raw.get("busy_us")))
        for k in list(raw.get("kernels") or [])[:MAX_KERNELS]:
            p.kernels.append(KernelStat(
                name=str(k["name"])[:MAX_NAME], launches=max(int(k["launches"]), 0), total_us=_num(k["total_us"]),
                mean_us=_num(k["mean_us"]), share=min(_num(k["share"]), 1.0), grid=_dims(k.get("grid")),
                block=_dims(k.get("block")), registers=_opt_int(k.get("registers")),
                shared_memory=_opt_int(k.get("shared_memory"))))
        p.busy_us = min(p.busy_us, p.call_us)
        return p
    except (KeyError, TypeError, ValueError) as exc:
        return ProgramProfile.not_ok(ProfileStatus.FAILED, f"the candidate's profile is malformed: {_why(exc)}")


def _num(v: Any) -> float:
    x = float(v)
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"not a duration: {v!r}")
    return x


def _opt_int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _dims(v: Any) -> list[int] | None:
    return [int(x) for x in v[:3]] if isinstance(v, list) and all(isinstance(x, int) for x in v[:3]) else None


def _peaks(device: Any, dtype: str) -> tuple[float | None, float | None]:
    """(peak bandwidth in bytes/s, peak FLOP/s of ``dtype``); None where unknown (the CPU)."""
    if device.type != "cuda":
        return None, None
    from cudal1.harness import cuda_api

    name = torch.cuda.get_device_name(device)
    return cuda_api.peak_bandwidth(device.index or 0), peak_flops(name, dtype)
