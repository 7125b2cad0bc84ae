"""What the reference worker does with outputs once a call returned: compare the candidate's with
the reference's (including outputs the candidate's process could only describe), tell a stale
re-checked output from a rounding difference, record which correctness rule judged, and scrub a
reference output before it is freed.

Contract: runs in the reference worker only; every comparison goes through
:func:`cudal1.harness.compare.compare` under the job's :class:`~cudal1.tolerances.Tolerances`.
"""

from __future__ import annotations

from typing import Any

import torch

from cudal1.harness import compare as cmp
from cudal1.harness.numerics import LeafCheck, deviation
from cudal1.tolerances import Tolerances


def compare_described(ref_out: Any, out: Any, rule: Tolerances, device_type: str,
                      exact: Any = None, limits: dict[str, tuple[float, float]] | None = None) -> tuple[Any, Any]:
    """:func:`cudal1.harness.compare.compare`, after the leaves the candidate's process could only
    describe (:class:`~cudal1.harness.wire.Described`) are judged from their description."""
    from cudal1.harness.wire import Described

    ref_leaves, out_leaves = cmp.leaves(ref_out), cmp.leaves(out)
    for path, leaf in out_leaves:
        if isinstance(leaf, Described):
            want = dict(ref_leaves).get(path)
            flag, detail = leaf.problem(device_type, want)
            return cmp.Mismatch(flag, f"{path}: {detail}"), cmp.Errors()
    return cmp.compare(ref_out, out, rule, device_type, exact=exact, limits=limits)


_STALE_REL = 0.25  # normwise difference from the reference that no rounding produces


def stale(ref_out: Any, out: Any) -> bool:
    """Whether a re-checked output is not the answer for its inputs at all (normwise relative
    difference above ``_STALE_REL`` on some floating output, or any other mismatch), as opposed to
    a rounding-sized difference."""
    for (_, r), (_, o) in zip(cmp.leaves(ref_out), cmp.leaves(out)):
        if (
            not isinstance(r, torch.Tensor)
            or not isinstance(o, torch.Tensor)
            or r.shape != o.shape
            or r.dtype != o.dtype
        ):
            return True
        if not (r.is_floating_point() and o.is_floating_point()):
            if not torch.equal(r, o):
                return True
            continue
        if not torch.equal(torch.isfinite(r), torch.isfinite(o)):
            return True
        ref_l2, diff_l2, _, _ = deviation(r, o)
        if diff_l2 > _STALE_REL * max(ref_l2, 1e-30):
            return True
    return False


def record_rule(corr: dict[str, Any], errors: Any, rule: Tolerances, exact: Any) -> None:
    """Fold one trial's errors into the correctness block: which rule judged, the tightest
    exact-rule check per dtype (the parent re-checks it with its own constants) and the
    numbers people read (``ref_err``, ``cand_err``, ``bound``: normwise, relative to |exact|)."""
    for check in errors.exact:
        assert rule.exact is not None  # checks against the float64 answer come from the exact rule
        seen = corr["exact_checks"].get(check.dtype)
        if seen is None or check.ratio(rule.exact) > LeafCheck.from_record(check.dtype, seen).ratio(rule.exact):
            corr["exact_checks"][check.dtype] = check.record()
        if check.ratio(rule.exact) >= corr.get("worst_ratio", -1.0):
            corr.update(check.summary(rule.exact))
    corr["fixed_outputs"].update(errors.fixed)
    if rule.exact is not None and corr["exact_checks"]:
        corr["rule"] = "exact+fixed" if corr["fixed_outputs"] or corr["by_dtype"] or errors.by_dtype else "exact"
    else:
        corr["rule"] = "fixed"
    notes = [f"{p}: {why}" for p, why in list(corr["fixed_outputs"].items())[:3]]
    if exact is not None and exact.unavailable:
        notes.insert(0, exact.unavailable)
    corr["rule_note"] = "; ".join(notes)[:500]


def scrub(obj: Any) -> None:
    """Overwrite a reference output in place before it is freed (NaN for floats)."""
    for _, leaf in cmp.leaves(obj):
        if isinstance(leaf, torch.Tensor) and leaf.numel():
            try:
                leaf.fill_(float("nan") if leaf.is_floating_point() else 0)
            except RuntimeError:
                pass
