"""Profiles as text for people: one program's summary, two side by side, and where time moved.

Contract: pure functions of :class:`~cudal1.profile.model.ProgramProfile` values returning lines
(no trailing newline).  What a kernel engineer reads first comes first: the call's time and how
much of it the device was busy, the class, bandwidth and FLOP/s shares of peak, then the top
kernels by total time, then (for two programs) the time per kernel family before and after.
"""

from __future__ import annotations

import re

from cudal1.profile.model import Profiles, ProgramProfile

TOP = 5
FAMILIES = (  # first match wins; names are lower-cased
    ("gemm", re.compile(r"gemm|matmul|(^|::|_)b?mm(_|$)|addmm|cutlass|nvjet|xmma|^sm\d+_|ampere_|linear|\bdot\b")),
    ("conv", re.compile(r"conv|implicit_convolve|winograd|cudnn")),
    ("reduce", re.compile(r"reduce|softmax|norm|sum|mean|max|min|argmax|scan|triton_(red|per)_")),
    ("copy", re.compile(r"memcpy|memset|copy|cat|contiguous|transpose|permute|clone")),
    ("elementwise", re.compile(r"elementwise|vectorized|triton_poi_|relu|gelu|add|mul|sigmoid|tanh|exp|clamp")),
)


def family(name: str) -> str:
    """The kernel family a name suggests (``gemm``, ``conv``, ``reduce``, ``copy``,
    ``elementwise``), else ``other``: a reading of the name, not of the code."""
    low = name.lower()
    return next((fam for fam, pattern in FAMILIES if pattern.search(low)), "other")


def us(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v / 1e3:.3g} ms" if v >= 1000 else f"{v:.3g} us"


def pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%" if v < 10 else f"{100 * v:.3g}%"


def short(name: str, width: int) -> str:
    """``name`` cut in the middle to ``width`` characters (kernel names are long templates)."""
    return name if len(name) <= width else name[: width - 12] + "..." + name[-9:]


def headline(p: ProgramProfile) -> str:
    """One line: span, busy share, launches, class, bandwidth and FLOP/s shares."""
    if not p.ok:
        return f"{p.status.value}: {p.note}" if p.note else p.status.value
    busy = p.busy_us / p.call_us if p.call_us else None
    parts = [f"{us(p.call_us)} call", f"busy {pct(busy)}", f"{p.launches} launches",
             p.bound.value if p.bound else "unclassified"]
    if p.bandwidth_share is not None:
        parts.append(f"bandwidth {pct(p.bandwidth_share)} of peak")
    elif p.achieved_bandwidth:
        parts.append(f"{p.achieved_bandwidth / 1e9:.3g} GB/s")
    if p.flops_share is not None:
        parts.append(f"FLOP/s {pct(p.flops_share)} of peak")
    elif p.achieved_flops:
        parts.append(f"{p.achieved_flops / 1e9:.3g} GFLOP/s")
    return ", ".join(parts)


def kernel_lines(p: ProgramProfile, top: int = TOP, width: int = 60) -> list[str]:
    lines = []
    for k in p.kernels[:top]:
        launch = f"{k.launches}x {us(k.mean_us)}" if k.launches > 1 else "1x"
        where = f" grid {k.grid} block {k.block}" if k.grid and k.block else ""
        lines.append(f"  {pct(k.share):>6}  {us(k.total_us):>9}  {launch:<12} {short(k.name, width)}{where}")
    if len(p.kernels) > top:
        rest = p.kernels[top:]
        lines.append(f"  {pct(sum(k.share for k in rest)):>6}  {us(sum(k.total_us for k in rest)):>9}  "
                     f"{len(rest)} more")
    return lines


def ncu_lines(p: ProgramProfile) -> list[str]:
    n = p.ncu
    if n is None:
        return []
    stalls = ", ".join(f"{r} {v:g}" for r, v in n.stalls) or "-"
    return [f"  ncu: SM {n.sm_throughput if n.sm_throughput is not None else '-'}%, DRAM "
            f"{n.dram_throughput if n.dram_throughput is not None else '-'}%, occupancy "
            f"{n.achieved_occupancy if n.achieved_occupancy is not None else '-'}%, top stalls: {stalls}"]


def families(p: ProgramProfile) -> dict[str, float]:
    out: dict[str, float] = {}
    for k in p.kernels:
        out[family(k.name)] = out.get(family(k.name), 0.0) + k.total_us
    return out


def time_moved(ref: ProgramProfile, cand: ProgramProfile) -> list[str]:
    """Kernel time per family, reference -> candidate, largest change first."""
    if not (ref.ok and cand.ok):
        return []
    a, b = families(ref), families(cand)
    names = sorted(set(a) | set(b), key=lambda f: -abs(b.get(f, 0.0) - a.get(f, 0.0)))
    return [f"  {f:<12} {us(a.get(f, 0.0)):>9} -> {us(b.get(f, 0.0)):>9}" for f in names]


def _figures(p: ProgramProfile) -> dict[str, str]:
    if not p.ok:
        return {"status": p.status.value}
    bw = pct(p.bandwidth_share) if p.bandwidth_share is not None else (
        f"{p.achieved_bandwidth / 1e9:.3g} GB/s" if p.achieved_bandwidth else "-")
    fl = pct(p.flops_share) if p.flops_share is not None else (
        f"{p.achieved_flops / 1e9:.3g} GFLOP/s" if p.achieved_flops else "-")
    return {"call": us(p.call_us), "device busy": pct(p.busy_us / p.call_us if p.call_us else None),
            "launches": str(p.launches), "class": p.bound.value if p.bound else "-",
            "bandwidth" + (" (of peak)" if p.bandwidth_share is not None else ""): bw,
            "FLOP/s" + (" (of peak)" if p.flops_share is not None else ""): fl}


def side_by_side(ref: ProgramProfile, cand: ProgramProfile) -> list[str]:
    """The headline figures of both programs as two columns."""
    a, b = _figures(ref), _figures(cand)
    keys = list(dict.fromkeys([*a, *b]))
    lines = [f"  {'':<20} {'reference':>14} {'candidate':>14}"]
    lines += [f"  {k:<20} {a.get(k, '-'):>14} {b.get(k, '-'):>14}" for k in keys]
    for label, p in (("reference", ref), ("candidate", cand)):
        if not p.ok and p.note:
            lines.append(f"  {label}: {p.note}")
    return lines


def describe_profiles(pr: Profiles, top: int = TOP) -> list[str]:
    """Both programs side by side, their top kernels, then where time moved (the candidate's
    figures are its own report)."""
    lines = [f"profile ({pr.tool}; the candidate's profile comes from its own process: information only)"]
    lines += side_by_side(pr.reference, pr.candidate)
    for label, p in (("reference", pr.reference), ("candidate", pr.candidate)):
        if p.ok:
            lines.append(f"{label} top kernels (share of kernel time, total, launches x mean, name)")
            lines += kernel_lines(p, top) + ncu_lines(p)
    moved = time_moved(pr.reference, pr.candidate)
    if moved:
        lines.append("where time moved (kernel time per family, reference -> candidate)")
        lines += moved
    return lines


def describe_program(label: str, p: ProgramProfile, top: int = TOP) -> list[str]:
    return [f"{label:<11} {headline(p)}", *kernel_lines(p, top), *ncu_lines(p)]
