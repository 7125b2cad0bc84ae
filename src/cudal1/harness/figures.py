"""The two timing figures of a job, and the clean side's bounds on the candidate's reported times,
from the raw rows both processes measured (:class:`~cudal1.harness.spec.TimingStage`).  Read by
the parent, which decides the verdict from them, and by the reference worker, which decides from
them whether a stricter second pass runs.

Contract: :func:`figures` trusts the reference worker's measurements and bounds the candidate's.
Two figures per call:

- ``gpu`` (the default speedup figure): the call's span on the GPU, enqueued behind the timer's
  gate so host latency is out of it (see :mod:`cudal1.harness.timer`), minus the clean side's
  empty-call span; when a side's calls typically end device-wide beyond the clean side's join
  cost by more than the side-stream noise (the candidate is then rejected), that median excess
  is charged to each of its calls, so the figures show what the calls took;
- ``host``: what a caller issuing calls back to back pays: the larger of the GPU figure and the
  host's time to issue the call.

The candidate's reported times must fit what the clean side saw (``timing_mismatch``): no call's
GPU span longer than its clean window (:mod:`cudal1.harness.window`), no block's calls longer than
the block, and no more slack (window minus span) than the reference's own beyond the noise
(:func:`window_check`): time the candidate's process hides from its report stays in the window.  No
call may be faster than writing its outputs once at the device's peak bandwidth
(``below_physical_limit``).  Work that outlived the call on another stream is ``side_stream``:
an output that changed after the calling stream finished, or a device-wide excess over the
clean side's join cost beyond the noise.  ``launch_bound``: the host's issue time exceeds the
GPU time (for the reference or the candidate), so the figures depend on the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cudal1.harness.spec import TimingStage

FIGURES = ("gpu", "host")
_FIT_SLACK_MS = 0.05  # events and the host clock are different clocks


def median(xs: list[float]) -> float:
    return float(np.median(xs)) if xs else 0.0


def iqr(xs: list[float]) -> float:
    return float(np.subtract(*np.percentile(xs, [75, 25]))) if len(xs) >= 2 else 0.0


# The timer's resolution: a call never reads below one microsecond (about an empty kernel's own
# duration on current GPUs, which the overhead subtraction removes along with the launch gap).
MIN_CALL_MS = 0.001
# Device work past the calling stream must exceed this (and the noise) before it is *rejected*
# (and charged) as a side stream.  The device-wide synchronize's wake-up differs between two
# processes by tens of microseconds (the candidate's host waits in it while the clean side opens
# the gate; neighbours load the host: an honest launch-bound record read 52 us on the H200), and
# work its outputs depend on is bounded by the clean window instead.
SIDE_STREAM_MIN_MS = 0.1


@dataclass
class Figures:
    """Both figures for both sides, and the parent's findings about the candidate's times."""

    gpu: dict[str, list[float]] = field(default_factory=dict)  # ref / cand -> ms per call
    host: dict[str, list[float]] = field(default_factory=dict)
    side_stream: str = ""  # why work escaped the call ('' when none did)
    timing_mismatch: str = ""  # why the candidate's times do not fit the clean side's clock
    below_physics: str = ""  # why a candidate call is faster than physics allows
    launch_bound: str = ""  # which side's host issue time exceeds its GPU time
    base_ms: float = 0.0  # the clean side's device-wide join cost
    cand_excess_ms: float = 0.0  # the candidate's median device-wide excess over it
    charged_ms: dict[str, float] = field(default_factory=dict)  # ref / cand -> excess charged to each call
    join_probe_ms: dict[str, float | None] = field(
        default_factory=dict
    )  # ref / cand -> median of the timer's join probe
    window: dict[str, Any] = field(default_factory=dict)  # the clean window's check (see window_check)

    def samples(self, figure: str, who: str) -> list[float]:
        return (self.gpu if figure == "gpu" else self.host)[who]


def _sides(stage: TimingStage) -> dict[str, list[list[Any]]]:
    return {"ref": [list(r) for r in stage.ref], "cand": [list(r) for r in stage.cand]}


def figures(stage: TimingStage) -> Figures:
    """Figures and findings from a job's timed rows."""
    rows = _sides(stage)
    overhead = float(stage.overhead_ms or 0.0)
    out = Figures()
    excess = {who: [float(r[1]) - float(r[0]) for r in rs] for who, rs in rows.items()}  # device_ms - gpu_ms per call
    ref_excess = excess["ref"]
    calibration = [float(x) for x in stage.calibration or []]
    # The join cost: the host's wake-up after the device-wide synchronize plus the output snapshot,
    # as the reference (trusted, one stream, same outputs) pays it.
    out.base_ms = max(median(calibration), median(ref_excess))
    bare_join = median(calibration) if calibration else out.base_ms  # the wake-up alone
    raw = {who: [max(float(r[0]) - overhead, MIN_CALL_MS) for r in rs] for who, rs in rows.items()}
    slack = max(SIDE_STREAM_MIN_MS, 3 * iqr(ref_excess), 3 * iqr(calibration), 0.05 * median(raw["cand"]))
    for who, rs in rows.items():
        # Work on other streams past the calling stream, beyond the noise (a side stream: the
        # candidate is rejected), is charged to every call at its typical (median) size, so the
        # figures show what the call took.  Below that, nothing is charged: the device-wide end
        # carries each process's host wake-up from the synchronize, which differs between the
        # two processes by microseconds, and work an output depends on is inside the clean window
        # (window_check) whatever stream it runs on.
        # A call whose own process saw an output change after the calling stream ended (escaped)
        # certainly left work running: it is charged at least its own device-wide excess over the
        # bare join (the calibration: no output snapshot, which ran beside the escaped work and
        # so hid inside it), however small the median excess is (the verdict is side_stream
        # either way; the figure shows what the call took).
        extra = median(excess[who]) - out.base_ms
        charge = extra if extra > slack else 0.0
        out.charged_ms[who] = charge
        out.gpu[who] = [g + (max(charge, e - bare_join) if bool(r[4]) else charge)
                        for g, e, r in zip(raw[who], excess[who], rs)]
        out.host[who] = [g if bool(r[3]) else max(g, float(r[2])) for g, r in zip(out.gpu[who], rs)]
    probe = [float(x) for x in stage.cand_join or []]
    out.join_probe_ms = {"ref": median(calibration) if calibration else None, "cand": median(probe) if probe else None}
    cand = rows["cand"]
    escaped = sum(1 for r in cand if bool(r[4]))
    out.cand_excess_ms = median(excess["cand"]) - out.base_ms
    if escaped:
        out.side_stream = f"{escaped} of {len(cand)} timed calls returned before their output was written"
    elif out.cand_excess_ms > slack:
        out.side_stream = (f"device work ran {out.cand_excess_ms:.3g} ms per call beyond the calling stream "
                           f"(noise {slack:.3g} ms)")
    out.window = window_check(rows, stage.clock or "cuda_event")
    out.timing_mismatch = _fit(cand, stage.blocks) or out.window.get("mismatch", "")
    physics = stage.physics_ms
    if physics:
        fastest = min((float(r[0]) for r in cand), default=float("inf"))
        if fastest < physics:
            out.below_physics = (
                f"a call took {fastest * 1e3:.3g} us, below the {physics * 1e3:.3g} us it takes to write "
                f"the outputs once at the device's peak bandwidth"
            )
    sides = [who for who in ("ref", "cand") if rows[who] and
             median([float(r[2]) for r in rows[who] if not bool(r[3])] or [0.0]) > median(out.gpu[who])]
    if sides:
        out.launch_bound = " and ".join({"ref": "reference", "cand": "candidate"}[w] for w in sides)
    return out


# What the clean window must explain beyond the reference's own slack, per call: a floor (the
# device's poll and launch gaps on a GPU; on a host, two pipe wake-ups and the unmasking beside
# whatever else runs: honest CPU candidates read 2.4-4.1 ms over the reference while compilers ran
# beside the judge on 2 cores, 2026-12-02), three times the spread of the reference's slack, and a
# share of the candidate's reported time.  Programs that move gigabytes around the call need no
# more: with both sides' steps in their own memory, level1/38 (8.6 GB in and out, a 10.8 ms slack)
# read an excess of -0.003 ms and level1/63 (8.5 GB out) 0.028 ms (H200, 2026-12-03).
WINDOW_FLOOR_MS = {"cuda_event": 0.020, "cpu_monotonic": 5.0}
WINDOW_SHARE = {"cuda_event": 0.01, "cpu_monotonic": 0.15}


def window_check(rows: dict[str, list[list[Any]]], clock: str) -> dict[str, Any]:
    """Compare each side's slack (the clean window minus the reported span and minus the run-queue
    waits of the threads the window depends on: the judge's own steps around the call) over the
    calls that did not block.  Both sides run the same steps on the same
    bytes, so an honest candidate's slack matches the reference's; time the candidate's process
    hid from its own report shows up as excess slack.  Returns the figures (``excess_ms``, the
    ``bound_ms`` it is held to: the smallest hidden time per call this verdict can tell from noise,
    and ``bound_share`` of the candidate's time) and ``mismatch``, the reason when it is over."""
    def slack(rs: list[list[Any]]) -> tuple[list[float], list[float]]:
        usable = [r for r in rs if len(r) > 5 and not bool(r[3])]
        # r[6]: the run-queue waits of the threads the window depends on (a busy host's, not the call's)
        return ([float(r[5]) - float(r[0]) - (float(r[6]) if len(r) > 6 else 0.0) for r in usable],
                [float(r[0]) for r in usable])

    ref_slack, _ = slack(rows["ref"])
    cand_slack, cand_span = slack(rows["cand"])
    if len(ref_slack) < 3 or len(cand_slack) < 3:
        return {"checked": False, "calls": len(cand_slack)}
    ref_ms, cand_ms = median(ref_slack), median(cand_slack)
    excess = cand_ms - ref_ms
    reported = median(cand_span)
    bound = WINDOW_FLOOR_MS.get(clock, 0.01) + 3 * iqr(ref_slack) + WINDOW_SHARE.get(clock, 0.01) * reported
    out: dict[str, Any] = {"checked": True, "calls": len(cand_slack), "reference_slack_ms": ref_ms,
                           "candidate_slack_ms": cand_ms, "excess_ms": excess, "bound_ms": bound,
                           "bound_share": bound / max(reported, 1e-9)}
    if excess > bound:
        out["mismatch"] = (f"the clean side's window holds {excess:.4g} ms per call that the candidate's own report "
                           f"leaves out (its slack {cand_ms:.4g} ms against the reference's "
                           f"{ref_ms:.4g} ms; noise bound {bound:.4g} ms)")
    return out


def _fit(cand: list[list[Any]], blocks: list[list[Any]]) -> str:
    """Why the candidate's reported times cannot be right on the clean side's clock ('' if they fit)."""
    for i, r in enumerate(cand):
        if len(r) > 5 and float(r[0]) > float(r[5]) + _FIT_SLACK_MS:
            return (
                f"timed call {i} reported {float(r[0]):.4g} ms on the GPU inside a clean window of {float(r[5]):.4g} ms"
            )
    i = 0
    for block in blocks:
        who, n, span = str(block[0]), int(block[1]), float(block[2])
        if who != "cand":
            continue
        total = sum(float(r[0]) for r in cand[i:i + n])
        i += n
        if total > span + _FIT_SLACK_MS:
            return f"a timing block of {n} calls reported {total:.4g} ms on the GPU inside {span:.4g} ms"
    return ""
