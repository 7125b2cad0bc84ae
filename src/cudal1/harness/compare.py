"""Output checks run inside the worker: structure, plain-tensor type, NaN/Inf positions, values.

Contract: ``compare(ref, out, tolerances, device_type, exact=None)`` returns a :class:`Mismatch`
or ``None`` and the errors it saw.  With ``exact`` (the reference's float64 outputs) every
floating output the exact rule can judge is judged by it (:mod:`cudal1.harness.numerics`); the
others, and every output when ``exact`` is None, by the rule's per-dtype limits
(:class:`cudal1.tolerances.Tolerances`): errors computed in float64 (``|out - ref|`` against
``atol + rtol * |ref|`` elementwise).  NaN/Inf
positions must match the fp32 reference's exactly.  Integer and
bool outputs must match exactly.  Only plain ``torch.Tensor`` objects (not subclasses, not
meta/fake tensors) count as outputs; anything else is a ``lazy_output``.

The torch callables used here are captured at import time, before any candidate code runs, so
that a candidate rebinding ``torch.isnan`` and friends cannot change the comparison.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from cudal1.harness.numerics import LeafCheck, exact_applies, leaf_check, within_limits
from cudal1.tolerances import ExactRule, Tolerances

# Captured before candidate code runs (see module docstring).
_Tensor = torch.Tensor
_isnan = torch.isnan
_isinf = torch.isinf
_equal = torch.equal
_abs = torch.abs
_where = torch.where
_zeros = torch.zeros
_stack = torch.stack
_maximum = torch.maximum
_is_floating = torch.is_floating_point
_is_complex = torch.is_complex
_view_as_real = torch.view_as_real


@dataclass
class Mismatch:
    flag: str  # shape_mismatch | nan_mismatch | value_mismatch | lazy_output
    detail: str
    max_abs: float | None = None
    max_rel: float | None = None


@dataclass
class Errors:
    max_abs: float = 0.0
    max_rel: float = 0.0
    max_ref: float = 0.0  # largest finite |ref| (with max_abs: the parent's tolerance re-check)
    by_dtype: dict[str, list[float]] = field(default_factory=dict)  # dtype -> [max_abs, max_ref] (fixed rule)
    exact: list[LeafCheck] = field(default_factory=list)  # outputs judged by the exact rule
    fixed: dict[str, str] = field(default_factory=dict)  # output path -> why the fixed rule judged it


def leaves(obj: Any, path: str = "out") -> list[tuple[str, Any]]:
    """Flatten nested tuples/lists/dicts into (path, leaf) pairs, in a stable order."""
    if isinstance(obj, (tuple, list)):
        out: list[tuple[str, Any]] = []
        for i, item in enumerate(obj):
            out.extend(leaves(item, f"{path}[{i}]"))
        return out
    if isinstance(obj, dict):
        out = []
        for k in sorted(obj, key=str):
            out.extend(leaves(obj[k], f"{path}[{k!r}]"))
        return out
    return [(path, obj)]


def plain_tensor_problem(t: Any, device_type: str) -> str | None:
    """Why ``t`` is not an ordinary materialized tensor on ``device_type``; None if it is."""
    if type(t) is not _Tensor:
        return f"type {type(t).__module__}.{type(t).__qualname__} is not torch.Tensor"
    if t.is_meta or t.device.type != device_type:
        return f"tensor on device {t.device}, expected {device_type}"
    if t.layout is not torch.strided:
        return f"layout {t.layout} is not strided"
    if t.requires_grad and t.grad_fn is None and not t.is_leaf:
        return "tensor without data"
    return None


_CHUNK = 1 << 24  # elements per float64 chunk: bounds the comparison's temporary memory


def output_problem(out: Any, device_type: str) -> str | None:
    """Why an output tree is not made of plain materialized tensors (None when it is).  Runs
    before anything touches the values, so a meta, sparse or NumPy output is ``lazy_output``,
    not a crash."""
    for path, leaf in leaves(out):
        if isinstance(leaf, _Tensor) or hasattr(leaf, "__torch_function__"):
            problem = plain_tensor_problem(leaf, device_type)
            if problem:
                return f"{path}: {problem}"
        elif hasattr(leaf, "__array__") or hasattr(leaf, "__array_interface__"):
            return f"{path}: {type(leaf).__module__}.{type(leaf).__qualname__} is not a torch.Tensor"
    return None


def _value_errors(ref: Any, out: Any, atol: float, rtol: float) -> tuple[Errors, int, str]:
    """float64 errors, chunked and accumulated on the device (one synchronization, another to
    locate the first bad element when there is one); returns (errors, count of elements out of
    tolerance, first bad)."""
    r_all, o_all = ref.detach().reshape(-1), out.detach().reshape(-1)
    counts, maxes = [], _zeros(3, dtype=torch.float64, device=r_all.device)  # |out - ref|, relative, |ref|

    def chunk(start: int) -> tuple[Any, Any, Any, Any, Any, Any]:
        r = r_all[start:start + _CHUNK].to(torch.float64)
        o = o_all[start:start + _CHUNK].to(torch.float64)
        finite = ~(_isnan(r) | _isinf(r))
        diff = _where(finite, _abs(o - r), 0.0)
        scale = _abs(r)
        bad = (diff > (atol + rtol * scale)) | (_isinf(r) & (o != r))  # inf must be the same inf
        return r, o, finite, diff, scale, bad

    starts = range(0, r_all.numel(), _CHUNK)
    for start in starts:
        _, _, finite, diff, scale, bad = chunk(start)
        counts.append(bad.sum())
        rel = _where(finite, diff / scale.clamp_min(1e-12), 0.0)
        maxes = _maximum(maxes, _stack([diff.max(), rel.max(), _where(finite, scale, 0.0).max()]))
    per_chunk = _stack(counts).tolist() if counts else []
    errors = Errors()
    errors.max_abs, errors.max_rel, errors.max_ref = maxes.tolist()
    n_bad, first = int(sum(per_chunk)), ""
    if n_bad:
        start = starts[next(i for i, c in enumerate(per_chunk) if c)]
        r, o, _, _, _, bad = chunk(start)
        idx = int(bad.nonzero()[0].item())
        first = f"first at flat index {start + idx}: got {o[idx].item():.6g}, want {r[idx].item():.6g}"
    return errors, n_bad, first


def compare(ref: Any, out: Any, tolerances: Tolerances, device_type: str,
            exact: Any = None, limits: dict[str, tuple[float, float]] | None = None) -> tuple[Mismatch | None, Errors]:
    """Check ``out`` against ``ref`` (and ``exact``, the float64 answer, when given).  ``limits``
    (output path -> relative limits from the correctness trials, see ``LeafCheck.limits``) judges
    those outputs against ``ref`` alone: the re-check of timed outputs.  Returns (mismatch or
    None, errors seen)."""
    worst = Errors()
    ref_leaves, out_leaves = leaves(ref), leaves(out)
    exact_leaves = dict(leaves(exact)) if exact is not None else {}
    for path, o in out_leaves:
        if isinstance(o, _Tensor) or hasattr(o, "__torch_function__"):
            problem = plain_tensor_problem(o, device_type)
            if problem:
                return Mismatch("lazy_output", f"{path}: {problem}"), worst
    if [p for p, _ in ref_leaves] != [p for p, _ in out_leaves]:
        return Mismatch(
            "shape_mismatch", f"output structure differs: {len(out_leaves)} leaves, want {len(ref_leaves)}"
        ), worst
    for (path, r), (_, o) in zip(ref_leaves, out_leaves):
        mismatch = _compare_leaf(path, r, o, tolerances, worst, exact_leaves.get(path), exact is not None,
                                 (limits or {}).get(path))
        if mismatch:
            return mismatch, worst
    return None, worst


def _compare_leaf(path: str, r: Any, o: Any, tolerances: Tolerances, worst: Errors,
                  e: Any = None, with_exact: bool = False, limit: tuple[float, float] | None = None) -> Mismatch | None:
    if not isinstance(r, _Tensor):
        if isinstance(o, _Tensor) or type(o) is not type(r):
            return Mismatch("shape_mismatch", f"{path}: got {type(o).__name__}, want {type(r).__name__}")
        if isinstance(r, float):
            atol, rtol = tolerances.limit("float32")
            ok = (r != r and o != o) or abs(o - r) <= atol + rtol * abs(r)
        else:
            ok = o == r
        return None if ok else Mismatch("value_mismatch", f"{path}: got {o!r}, want {r!r}")
    if not isinstance(o, _Tensor):
        return Mismatch("shape_mismatch", f"{path}: got {type(o).__name__}, want Tensor")
    if tuple(o.shape) != tuple(r.shape):
        return Mismatch("shape_mismatch", f"{path}: shape {tuple(o.shape)}, want {tuple(r.shape)}")
    if o.dtype != r.dtype:
        return Mismatch("shape_mismatch", f"{path}: dtype {o.dtype}, want {r.dtype}")
    if not (_is_floating(r) or _is_complex(r)):
        if not _equal(o.detach().cpu(), r.detach().cpu()):
            n = int((o != r).sum().item())
            return Mismatch("value_mismatch", f"{path}: {n} of {r.numel()} elements differ (exact dtype {r.dtype})")
        return None
    if not _equal(_isnan(o), _isnan(r)):
        n = int((_isnan(o) != _isnan(r)).sum().item())
        return Mismatch("nan_mismatch", f"{path}: NaN positions differ at {n} elements")
    if limit is not None and not with_exact:
        inf = _inf_mismatch(path, r, o)
        if inf is not None:
            return inf
        problem = within_limits(path, r, o, limit)
        return Mismatch("value_mismatch", problem) if problem else None
    if with_exact:
        why = exact_applies(r, e)
        if not why:
            assert tolerances.exact is not None  # the float64 answers exist only under the exact rule
            return _inf_mismatch(path, r, o) or _exact_leaf(path, e, r, o, tolerances.exact, worst)
        worst.fixed[path] = why
    dtype = str(r.dtype).replace("torch.", "")
    atol, rtol = tolerances.limit(dtype)
    errors, n_bad, first = _value_errors(r, o, atol, rtol)
    worst.max_abs = max(worst.max_abs, errors.max_abs)
    worst.max_rel = max(worst.max_rel, errors.max_rel)
    seen = worst.by_dtype.setdefault(dtype, [0.0, 0.0])
    seen[0], seen[1] = max(seen[0], errors.max_abs), max(seen[1], errors.max_ref)
    if n_bad:
        return Mismatch(
            "value_mismatch",
            f"{path}: {n_bad} of {r.numel()} elements outside atol={atol:g} rtol={rtol:g} "
            f"(max abs {errors.max_abs:.3g}, max rel {errors.max_rel:.3g}); {first}",
            errors.max_abs,
            errors.max_rel,
        )
    return None


def _inf_mismatch(path: str, r: Any, o: Any) -> Mismatch | None:
    """An Inf must be the same Inf (the float64 and re-check paths compare finite values only)."""
    inf_r, inf_o = _isinf(r), _isinf(o)
    if not bool((inf_r | inf_o).any().item()):
        return None
    differ = (inf_r != inf_o) | (inf_r & (o != r))
    n = int(differ.sum().item())
    return Mismatch("nan_mismatch", f"{path}: Inf positions differ at {n} elements") if n else None


def _exact_leaf(path: str, e: Any, r: Any, o: Any, rule: ExactRule, worst: Errors) -> Mismatch | None:
    check = leaf_check(path, e, r, o)
    worst.exact.append(check)
    d = check.summary(rule)
    scale = check.exact_l2 or 1.0
    worst.max_abs = max(worst.max_abs, check.cand_inf)
    worst.max_rel = max(worst.max_rel, check.cand_l2 / scale)
    if check.ratio(rule) > 1.0:
        b2, binf = check.bounds(rule)
        return Mismatch(
            "value_mismatch",
            f"{path}: error against the float64 answer exceeds the bound: normwise {d['cand_err']:.3g} "
            f"(bound {d['bound']:.3g}; the fp32 reference's own {d['ref_err']:.3g}), worst element "
            f"{check.cand_inf:.3g} (bound {binf:.3g}; reference's own {check.ref_inf:.3g})",
            check.cand_inf,
            check.cand_l2 / scale,
        )
    return None


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def same_bits(a: Any, b: Any) -> bool:
    """Whether two tensors hold the same bits (shape, dtype and every byte): one comparison
    kernel through integer views of the same element size, no temporaries.  Stricter than value
    equality (``-0.0`` differs from ``0.0``, NaN payloads count), which is what a copy, a
    snapshot or an untouched input must satisfy."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    a, b = a.detach(), b.detach()
    if _is_complex(a):
        a, b = _view_as_real(a), _view_as_real(b)
    if a.dtype == torch.bool:
        return bool(_equal(a, b))
    kind = _SAME_SIZE_INT[a.element_size()]  # every real dtype is 1, 2, 4 or 8 bytes
    return bool(_equal(a.view(kind), b.view(kind)))


def tensors_equal(a: Any, b: Any) -> bool:
    """Bitwise equality of two trees (the input-mutation and output-stability checks: the second
    tree is a copy of the first as it was, so any difference is a write)."""
    la, lb = leaves(a, "in"), leaves(b, "in")
    if len(la) != len(lb):
        return False
    for (_, x), (_, y) in zip(la, lb):
        if isinstance(x, _Tensor):
            if not isinstance(y, _Tensor) or not same_bits(x, y):
                return False
        elif x != y and not (x != x and y != y):
            return False
    return True


def clone_tree(obj: Any) -> Any:
    """A copy of every tensor in a (nested list/tuple) output; other leaves as they are."""
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, (list, tuple)):
        return type(obj)(clone_tree(x) for x in obj)
    return obj
