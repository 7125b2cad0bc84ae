"""The exact-answer correctness rule: judge a candidate against the float64 answer, not against
one rounding of it.

Why: the fp32 reference is itself only one rounding of the true result.  A reassociated matrix
chain or a row sum in another order is a *different* rounding of the same value, and elements
near zero (cancellation) can differ by 1e-2 relative while both programs are equally right.  A
fixed elementwise tolerance then either rejects correct programs (1e-4) or accepts real damage
(1e-2 lets an output scaled by 1.0005 pass).  So the judge runs the reference a second time in
float64 on the same inputs and the same initialisation (the "exact" answer ``E``), measures the
reference's own error ``R - E`` and accepts the candidate ``C`` when ``C - E`` is within a bound
of it:

    cand_err <= max(FACTOR * ref_err, floor_rel * |E|, atol * size)

checked in two norms per output tensor, over the positions where both ``R`` and ``E`` are
finite (NaN/Inf positions are compared exactly, as before):

- **normwise (l2)**: ``||C-E||_2`` against ``||R-E||_2``.  This is the primary check: it is what
  makes cancellation harmless (an element near zero with a large *relative* error carries a tiny
  share of the norm), and it cannot flip on one unlucky draw.
- **worst element (l-inf)**: ``max|C-E|`` against ``max|R-E|``, so a few badly wrong elements
  (a tile-boundary bug) cannot hide inside a large tensor's norm.  Scaled by the largest
  ``|E|``, not by each element's own magnitude, for the same cancellation reason.

Constants (:class:`cudal1.tolerances.ExactRule`, the job's rule): ``factor = 16``: two honest roundings
of one value differ by small factors (measured: matrix chains, summation orders and fused kernels
stay within 4x), while precision damage is 30x and more (TF32 matmuls, bf16 sums, an output scaled
by 1.0005).  ``floor_rel`` (fp32 1e-5, fp16 2e-3, bf16 1.6e-2) covers programs whose reference
happens to be exact (elementwise ops) and honest accumulation orders with larger worst-case error
(a sequential sum of 16k fp32 values has relative error ~5e-6); ``atol`` is an absolute floor per
element for outputs whose exact value is (near) zero.

Where the rule cannot apply (the reference cannot run in float64, integer/complex/float64
outputs), the fixed per-dtype table judges that output and the verdict says so
(``correctness.rule``).  Not covered: a task whose reference is numerically unstable beyond
float64 itself, and candidates whose error only shows on inputs outside ``get_inputs``'s
distribution.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch

from cudal1.harness.faults import is_out_of_memory
from cudal1.tolerances import ExactRule

# Captured before candidate code runs (the same reason as in compare.py).
_Tensor = torch.Tensor
_isfinite = torch.isfinite
_is_floating = torch.is_floating_point
_f64 = torch.float64
_where = torch.where
_stack = torch.stack
_maximum = torch.maximum
_zeros = torch.zeros

_CHUNK = 1 << 24  # elements per float64 chunk: bounds temporary memory

EXACT_DTYPES = ("float32", "float16", "bfloat16")  # output dtypes the exact rule judges

@dataclass
class LeafCheck:
    """One output tensor of one trial under the exact rule (absolute norms, float64)."""

    path: str
    dtype: str
    n: int  # finite positions compared
    exact_l2: float
    ref_l2: float
    cand_l2: float
    exact_inf: float
    ref_inf: float
    cand_inf: float

    def bounds(self, rule: ExactRule) -> tuple[float, float]:
        """(l2 bound, l-inf bound) under ``rule``'s constants."""
        floor_rel, atol = rule.floor(self.dtype)
        l2 = max(rule.factor * self.ref_l2, floor_rel * self.exact_l2, atol * math.sqrt(max(self.n, 1)))
        inf = max(rule.factor * self.ref_inf, floor_rel * self.exact_inf, atol)
        return l2, inf

    def ratio(self, rule: ExactRule) -> float:
        """max(cand_l2 / bound_l2, cand_inf / bound_inf): above 1 fails."""
        b2, binf = self.bounds(rule)
        ratios = [self.cand_l2 / b2 if b2 > 0 else (math.inf if self.cand_l2 > 0 else 0.0),
                  self.cand_inf / binf if binf > 0 else (math.inf if self.cand_inf > 0 else 0.0)]
        return math.inf if any(math.isnan(r) for r in ratios) else max(ratios)  # NaN never passes

    def summary(self, rule: ExactRule) -> dict[str, Any]:
        """The correctness block's numbers: normwise relative errors and bound."""
        b2, _ = self.bounds(rule)
        scale = self.exact_l2 if self.exact_l2 > 0 else 1.0
        return {"ref_err": self.ref_l2 / scale, "cand_err": self.cand_l2 / scale, "bound": b2 / scale,
                "worst_ratio": self.ratio(rule), "output": self.path}

    def limits(self, rule: ExactRule) -> tuple[float, float]:
        """How far a correct output may be from the *fp32 reference* (no float64 needed), relative
        to |exact|: by the triangle inequality |C - R| <= |C - E| + |R - E| <= bound + ref_err.
        Used to re-check timed outputs against the reference on their own fresh inputs."""
        b2, binf = self.bounds(rule)
        return ((b2 + self.ref_l2) / self.exact_l2 if self.exact_l2 > 0 else math.inf,
                (binf + self.ref_inf) / self.exact_inf if self.exact_inf > 0 else math.inf)

    def record(self) -> list[float]:
        """Compact form the parent re-checks with its own constants."""
        return [self.n, self.exact_l2, self.ref_l2, self.cand_l2, self.exact_inf, self.ref_inf, self.cand_inf]

    @classmethod
    def from_record(cls, dtype: str, rec: list[float]) -> "LeafCheck":
        n, e2, r2, c2, einf, rinf, cinf = (float(x) for x in rec)
        return cls("", dtype, int(n), e2, r2, c2, einf, rinf, cinf)


def leaf_check(path: str, exact: Any, ref: Any, cand: Any) -> LeafCheck:
    """Norms of ``ref - exact`` and ``cand - exact`` over positions finite in ``ref`` and
    ``exact`` (chunked float64, accumulated on the device: one synchronization per leaf; inputs
    may live on different devices)."""
    dtype = str(ref.dtype).replace("torch.", "")
    e_all = exact.detach().reshape(-1)
    r_all = ref.detach().reshape(-1)
    c_all = cand.detach().reshape(-1)
    dev = r_all.device
    sums = _zeros(3, dtype=_f64, device=dev)  # exact, ref - exact, cand - exact: squared norms
    maxes = _zeros(3, dtype=_f64, device=dev)
    count = _zeros((), dtype=torch.int64, device=dev)
    for start in range(0, r_all.numel(), _CHUNK):
        e = e_all[start:start + _CHUNK].to(dev, _f64)
        r = r_all[start:start + _CHUNK].to(_f64)
        c = c_all[start:start + _CHUNK].to(_f64)
        keep = _isfinite(r) & _isfinite(e)
        count += keep.sum()
        parts = (_where(keep, e, 0.0), _where(keep, r - e, 0.0), _where(keep, c - e, 0.0))
        sums += _stack([(v * v).sum() for v in parts])
        maxes = _maximum(maxes, _stack([v.abs().max() for v in parts]))
    n, *values = [count.item()] + sums.tolist() + maxes.tolist()
    return LeafCheck(path, dtype, int(n), math.sqrt(values[0]), math.sqrt(values[1]), math.sqrt(values[2]),
                     values[3], values[4], values[5])


RECHECK_SLACK = 2.0  # a re-checked output may be this many times the correctness trials' worst limit


def deviation(ref: Any, out: Any) -> tuple[float, float, float, float]:
    """(|ref|_2, |out - ref|_2, max|ref|, max|out - ref|) over the positions where ``ref`` is
    finite (chunked float64, accumulated on the device: one synchronization)."""
    r_all, o_all = ref.detach().reshape(-1), out.detach().reshape(-1)
    sums = _zeros(2, dtype=_f64, device=r_all.device)  # |ref|, |out - ref|: squared
    maxes = _zeros(2, dtype=_f64, device=r_all.device)
    for start in range(0, r_all.numel(), _CHUNK):
        r = r_all[start:start + _CHUNK].to(_f64)
        o = o_all[start:start + _CHUNK].to(_f64)
        keep = _isfinite(r)
        parts = (_where(keep, r, 0.0), _where(keep, o - r, 0.0))
        sums += _stack([(v * v).sum() for v in parts])
        maxes = _maximum(maxes, _stack([v.abs().max() for v in parts]))
    s0, s1, m0, m1 = sums.tolist() + maxes.tolist()
    return math.sqrt(s0), math.sqrt(s1), m0, m1


def within_limits(path: str, ref: Any, out: Any, limit: tuple[float, float]) -> str:
    """'' when ``out`` is within ``RECHECK_SLACK`` times ``limit`` (see :meth:`LeafCheck.limits`)
    of the fp32 reference ``ref``, else what is wrong (finite positions of ``ref`` only; the
    NaN/Inf positions are compared before)."""
    ref_l2, l2, ref_inf, inf = deviation(ref, out)
    # An infinite limit: the exact answer was all zero in the trials (a degenerate output), so there
    # is no scale to be relative to; that norm sets no limit.
    b2 = RECHECK_SLACK * limit[0] * ref_l2 if math.isfinite(limit[0]) else math.inf
    binf = RECHECK_SLACK * limit[1] * ref_inf if math.isfinite(limit[1]) else math.inf
    if l2 <= b2 and inf <= binf:
        return ""
    return (f"{path}: differs from the reference by {l2:.3g} normwise (limit {b2:.3g}), {inf:.3g} at the worst "
            f"element (limit {binf:.3g}): more than rounding allows, going by the correctness trials")


def exact_applies(ref_leaf: Any, exact_leaf: Any) -> str:
    """'' when the exact rule can judge this output leaf, else why not."""
    if not isinstance(ref_leaf, _Tensor) or not _is_floating(ref_leaf):
        return "not a floating-point tensor"
    dtype = str(ref_leaf.dtype).replace("torch.", "")
    if dtype not in EXACT_DTYPES:
        return f"{dtype} output (no higher precision to compare with)"
    if not isinstance(exact_leaf, _Tensor) or exact_leaf.dtype != _f64:
        return "the float64 reference did not produce a float64 tensor here"
    if tuple(exact_leaf.shape) != tuple(ref_leaf.shape):
        return "the float64 reference's shape differs"
    return ""


# ---- the float64 reference ----------------------------------------------------------------

def _map_tensors(obj: Any, fn: Any) -> Any:
    """``fn`` applied to every tensor in nested lists/tuples/dicts; the rest unchanged."""
    if isinstance(obj, _Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(x, fn) for x in obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    return obj


def to_float64(obj: Any) -> Any:
    """Floating tensors (in nested lists/tuples/dicts) cast to float64; the rest unchanged."""
    return _map_tensors(obj, lambda t: t.detach().to(_f64) if _is_floating(t) else t)


def float64_model(model: Any, device: torch.device) -> Any:
    """A float64 copy of ``model`` with the *same* parameter values (fp32 -> fp64 is exact).
    Floating tensors held as plain attributes (not registered) are converted too."""
    twin = copy.deepcopy(model)
    if isinstance(twin, torch.nn.Module):
        twin = twin.to(device=device, dtype=_f64)
        for mod in twin.modules():
            for name, value in list(vars(mod).items()):
                if isinstance(value, _Tensor) and _is_floating(value) and value.dtype != _f64:
                    setattr(mod, name, value.detach().to(device=device, dtype=_f64))
    return twin


class ExactReference:
    """Runs the reference in float64 on the device, or on the CPU when the device lacks a
    float64 kernel.  ``unavailable`` says why the exact rule cannot be used ('' when it can).

    ``shared``: other workers share the GPU (and its memory).  Running out of memory then raises
    (the verdict says ``oom`` and the scheduler judges the job again with the GPU to itself)
    instead of falling back: a CPU float64 run of a large task takes tens of seconds, and a rule
    that changed with the neighbours would make the verdict theirs."""

    def __init__(self, model: Any, device: torch.device, *, shared: bool = False) -> None:
        self.device = device
        self.shared = shared
        self.unavailable = ""
        self.model: Any = None
        try:
            self.model = float64_model(model, device)
        except Exception as exc:
            if shared and is_out_of_memory(exc):
                raise
            self.unavailable = f"the reference cannot be copied to float64: {type(exc).__name__}: {exc}"[:300]

    def __call__(self, inputs: list) -> Any:
        """The float64 outputs for ``inputs`` (None when unavailable; sets ``unavailable``)."""
        if self.model is None:
            return None
        previous = torch.get_default_dtype()
        try:
            torch.set_default_dtype(_f64)
            try:
                return self.model(*self._args(inputs))
            except Exception as exc:
                if self.device.type == "cpu" or (self.shared and is_out_of_memory(exc)):
                    raise
                first = f"{type(exc).__name__}: {exc}"
                try:  # no float64 kernel on the device: the CPU has one for nearly every op
                    self.device = torch.device("cpu")
                    if isinstance(self.model, torch.nn.Module):
                        self.model = self.model.to(self.device)
                    return self.model(*self._args(inputs))
                except Exception:  # noqa: BLE001
                    raise RuntimeError(first) from None
        except Exception as exc:
            if self.shared and is_out_of_memory(exc):
                raise
            self.unavailable = f"the reference does not run in float64: {type(exc).__name__}: {exc}"[:300]
            self.model = None
            return None
        finally:
            torch.set_default_dtype(previous)

    def _args(self, inputs: list) -> list:
        return [to_float64(x.to(self.device)) if isinstance(x, _Tensor) else to_float64(x) for x in inputs]


# ---- answers shared across the candidates of a task ---------------------------------------

# Answer sets larger than this are not cached: each candidate's worker computes them on the
# device instead (measured on the H200: serialising, hashing and moving 640 MB of float64
# answers cost ~2 s per task, while a float64 forward of the same KernelBench task costs ms).
CACHE_LIMIT_BYTES = 32 << 20


def _nbytes(obj: Any) -> int:
    sizes: list[int] = []
    _map_tensors(obj, lambda t: sizes.append(t.numel() * t.element_size()))
    return sum(sizes)


class ExactAnswers:
    """The float64 answers for the correctness trials' inputs, computed once per input set and
    reused by every candidate of the task in a run.

    Trust: the answers are computed in the reference phase, before any candidate code runs, and
    the file's SHA-256 travels to the parent on the signed channel.  A later worker uses the file
    only when its bytes hash to the digest the *parent* hands it, so a candidate that rewrites
    the cache file cannot change another candidate's verdict (the worker then recomputes).
    Answers are kept on the CPU; sets over ``CACHE_LIMIT_BYTES`` are not kept (``source``
    ``per-candidate``; only the first answer, already computed, stays on the device): the other
    correctness trials run the float64 reference on the device."""

    def __init__(self) -> None:
        self.answers: dict[int, Any] = {}
        self.digest = ""  # set when this worker wrote the file
        self.source = "none"  # none | cache | computed | per-candidate

    def prepare(self, exact: ExactReference, seeds: list[int], make_inputs: Any, path: str | None,
                digest: str | None) -> None:
        import hashlib
        import io
        import os

        if path and digest and os.path.exists(path):
            with open(path, "rb") as f:
                data = f.read()
            if hashlib.sha256(data).hexdigest() == digest:
                loaded = torch.load(io.BytesIO(data), weights_only=True)
                self.answers = {int(k): v for k, v in loaded.items()}
                self.source = "cache"
                return
        for seed in seeds:
            out = exact(make_inputs(seed))
            if out is None:  # no float64 run: the exact rule does not apply
                self.answers = {}
                return
            if _nbytes(out) * len(seeds) > CACHE_LIMIT_BYTES:  # large: computed per trial, on the device
                self.answers = {seed: out}  # the one already computed stays on the device for its trial
                self.source = "per-candidate"
                return
            self.answers[seed] = _map_tensors(out, lambda t: t.detach().cpu())
        self.source = "computed"
        if not path:
            return
        buf = io.BytesIO()
        torch.save({str(k): v for k, v in self.answers.items()}, buf)
        data = buf.getvalue()
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600
        )  # answers: not the candidate's to read
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        self.digest = hashlib.sha256(data).hexdigest()

    def take(self, seed: int) -> Any:
        """The answer for ``seed``, or None.  A per-candidate answer (too large to keep) is handed
        out once and dropped: held through timing, a task with 8 GiB outputs kept 16 GiB more on
        the device and ran out of memory on an H200."""
        if self.source == "per-candidate":
            return self.answers.pop(seed, None)
        return self.answers.get(seed)
