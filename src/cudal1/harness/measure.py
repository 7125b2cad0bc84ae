"""The measurement half of the worker: correctness trials, timing, re-checks and the settle
checks, as a mixin of :class:`~cudal1.harness.worker.Worker` (which owns the protocol: phases,
messages, imports and construction).

Contract: every method runs inside the worker child, after :meth:`Worker.setup`; they read the
typed spec (``self.spec``, ``self.cfg``) and raise :class:`Verdict` to end the protocol early.
Correctness compares each trial's outputs with the reference's under the configured rule (the
float64 answer by default, :mod:`cudal1.harness.numerics`); timing interleaves reference and
candidate calls in random order on fresh inputs and re-checks a sample of the timed outputs.
Statistics are the parent's job (:mod:`cudal1.harness.assemble`): this module only measures.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from typing import Any

import torch

from cudal1.harness import compare as cmp
from cudal1.harness.memory import L2Flusher, poison_free_blocks
from cudal1.harness.numerics import ExactAnswers, ExactReference, LeafCheck, deviation
from cudal1.harness.runtime_guard import _sleep, settle_s
from cudal1.harness.stats import charge
from cudal1.harness.timer import make_timer

_perf = time.perf_counter
_THREAD_GRACE_S = 0.1  # a thread seen right after a call gets this long to finish (its writes are watched)
_audit = sys.audit  # captured before candidate code runs


class Verdict(Exception):
    """Ends the protocol early with a status (a ``Status`` value) and flags."""

    def __init__(self, status: str, message: str, *flags: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.flags, self.extra = status, message, list(flags), extra


def clone_tree(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, (list, tuple)):
        return type(obj)(clone_tree(x) for x in obj)
    return obj


class Measurement:
    """Correctness and timing for :class:`~cudal1.harness.worker.Worker` (see the module doc).
    Attributes it relies on are set by ``Worker.__init__``."""

    spec: Any
    cfg: Any
    device: torch.device
    input_seed: int
    ref_mod: Any
    exact: ExactReference | None
    answers: ExactAnswers
    recheck_limits: dict[str, tuple[float, float]]
    extra_flags: list[str]

    def make_inputs(self, seed: int) -> list:
        """Fresh inputs from the task's ``get_inputs`` under ``seed``, created on the device."""
        torch.manual_seed(seed)
        random.seed(seed)
        with torch.device(self.device):
            inputs = list(self.ref_mod.get_inputs())
        return [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in inputs]

    def run_model(self, model: Any, args: list) -> tuple[Any, float]:
        self.sync()
        t0 = _perf()
        out = model(*args)
        self.sync()
        return out, (_perf() - t0) * 1e3

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def correctness(self, ref_model: Any, cand_model: Any, seed0: int, trials: int) -> tuple[dict, dict]:
        """Fresh inputs per trial; the candidate runs first on even trials, second on odd ones."""
        est: dict[str, list[float]] = {"ref": [], "cand": []}
        corr = {"trials": 0, "passed": 0, "max_abs_error": 0.0, "max_rel_error": 0.0, "failing_trial": None, "detail": "",
                "by_dtype": {}, "exact_checks": {}, "fixed_outputs": {}}
        models = {"ref": ref_model, "cand": cand_model}
        for i in range(trials):
            corr["trials"] = i + 1
            inputs = self.make_inputs(seed0 + i)
            exact = self.answers.answers.get(seed0 + i)
            if exact is None and self.exact is not None:
                exact = self.exact(clone_tree(inputs))
            outs: dict[str, Any] = {}
            for who in (("cand", "ref") if i % 2 == 0 else ("ref", "cand")):
                args = clone_tree(inputs)
                outs[who], ms = self.run_model(models[who], args)
                est[who].append(ms)
                if who == "cand":
                    busy = self.threads()  # first thing after the call: a late writer may be quick
                    problem = cmp.output_problem(outs[who], self.device.type)
                    early = clone_tree(outs[who]) if busy and not problem else None  # before the slower checks
                    self.check_math(f"correctness trial {i}")
                    if not cmp.tensors_equal(args, inputs):
                        raise Verdict("rejected", f"trial {i}: the candidate modified its inputs", "input_mutation", correctness=corr)
                    if problem:
                        raise Verdict("rejected", f"trial {i}: {problem}", "lazy_output", correctness=corr)
                    self.settle(f"trial {i}", outs[who], full=i < 2, busy=busy, snapshot=early, correctness=corr)
                    del early
                del args
                self.poison()
            table = self.tolerances()
            mismatch, errors = cmp.compare(outs["ref"], outs["cand"], table, self.device.type, exact=exact)
            del exact
            record_rule(corr, errors, table, self.exact)
            for check in errors.exact:
                old = self.recheck_limits.get(check.path, (0.0, 0.0))
                new = check.limits(table)
                self.recheck_limits[check.path] = (max(old[0], new[0]), max(old[1], new[1]))
            corr["max_abs_error"] = max(corr["max_abs_error"], errors.max_abs)
            corr["max_rel_error"] = max(corr["max_rel_error"], errors.max_rel)
            for dtype, (max_abs, max_ref) in errors.by_dtype.items():
                seen = corr["by_dtype"].setdefault(dtype, [0.0, 0.0])
                seen[0], seen[1] = max(seen[0], max_abs), max(seen[1], max_ref)
            if mismatch is not None:
                corr.update(failing_trial=i, detail=mismatch.detail)
                status = "rejected" if mismatch.flag == "lazy_output" else "incorrect"
                raise Verdict(status, f"trial {i}: {mismatch.detail}", mismatch.flag, correctness=corr)
            corr["passed"] = i + 1
            scrub(outs["ref"])
            del outs, inputs
            self.poison()
        return est, corr

    def exact_reference(self, ref_model: Any) -> ExactReference | None:
        """The float64 twin of the reference (same initialisation), when the correctness rule is
        ``exact``; built before any candidate code runs."""
        if "@exact" not in self.tolerances():
            return None
        return ExactReference(ref_model, self.device, shared=self.cfg.workers_per_gpu > 1)

    def kernel_names(self, cand_model: Any) -> list[str] | None:
        """CUDA kernels launched by one profiled candidate forward (None off CUDA or when the
        profiler is unavailable)."""
        if self.device.type != "cuda" or self.spec.mode == "baseline":
            return None
        from torch.profiler import ProfilerActivity, profile

        inputs = self.make_inputs(self.input_seed + 80_000)
        try:
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                out = cand_model(*inputs)
                self.sync()
                busy = self.threads()
            events = prof.events()
        except Exception:  # noqa: BLE001 - informational only
            return None
        self.settle("profiled call", out, busy=busy)
        cuda = torch.autograd.DeviceType.CUDA
        return sorted({e.name for e in events if getattr(e, "device_type", None) == cuda})[:200]

    def settle(self, where: str, out: Any = None, full: bool = False, busy: list | None = None, snapshot: Any = None,
               **extra: Any) -> None:
        """Nothing may still be working for the call after it returned: no thread running
        candidate code (or a C callable handed to a thread/pool, or a pending Timer) and, for
        ``full`` settle checks (the first two correctness trials) or when such a thread is
        seen, an output that stays the same for ``settle_s()`` (a background thread or an
        unjoined stream still writing it).  Honest code pays one inventory (microseconds);
        only a suspicious thread costs a wait, up to ``_THREAD_GRACE_S`` for it to finish (a
        generous grace does not weaken the check: the output is snapshotted first, so a thread
        that writes it during the grace is caught by the comparison).  ``busy``/``snapshot``: an
        inventory and a copy of the output taken right after the call returned (before slower
        checks)."""
        if busy is None:
            busy = self.threads()
        if not busy and not full:
            return
        if snapshot is None and out is not None:
            snapshot = clone_tree(out)
        deadline = _perf() + max(settle_s(), _THREAD_GRACE_S)
        if full:
            _sleep(settle_s())
            busy = self.threads()
        while busy and _perf() < deadline:
            _sleep(0.0005)
            busy = self.threads()
        self.sync()
        if snapshot is not None and not cmp.tensors_equal(out, snapshot):
            raise Verdict("rejected", f"{where}: the output changed after forward returned", "side_stream", **extra)
        if busy:
            what = "; ".join(desc for _, desc in busy[:3])
            raise Verdict("rejected", f"{where}: a thread was still working for the candidate "
                                      f"{max(settle_s(), _THREAD_GRACE_S) * 1e3:.0f} ms after it returned ({what})",
                                      "side_stream", **extra)

    def verify_extraordinary(self, ref_model: Any, cand_model: Any, est: dict, timed: dict) -> dict[str, Any]:
        """Speedups above ``strict_speedup`` or times below the memory floor get a stricter
        second pass (more correctness trials, every timed output re-checked); its samples
        replace the first pass's.  A time that stays below half the floor is rejected."""
        ref_ms = statistics.median(timed["ref_samples"])
        cand_ms = statistics.median(timed["cand_samples"])
        floor_ms = self.memory_floor_ms(ref_model)
        impossible = floor_ms is not None and cand_ms < 0.5 * floor_ms
        if not impossible and ref_ms / max(cand_ms, 1e-9) <= self.cfg.strict_speedup:
            return {"floor_ms": floor_ms}
        self.phase("verify")
        _, corr = self.correctness(ref_model, cand_model, self.input_seed + 50_000, max(20, self.cfg.correctness_trials))
        self.phase("verify_timing")
        strict = self.timing(ref_model, cand_model, est, 1.0, seed_offset=60_000, max_trials=30)
        cand_ms = statistics.median(strict["cand_samples"])
        if floor_ms is not None and cand_ms < 0.5 * floor_ms:
            raise Verdict("rejected", f"candidate time {cand_ms:.4g} ms is below half the memory floor {floor_ms:.4g} ms", "impossible_time")
        self.extra_flags.append("strict_verified")
        strict["floor_ms"] = floor_ms
        strict["rechecked"] = timed.get("rechecked", 0) + strict.get("rechecked", 0) + corr["passed"]
        return strict

    def memory_floor_ms(self, ref_model: Any) -> float | None:
        """Time to read every input and write every output once at measured copy bandwidth."""
        if self.device.type != "cuda":
            return None
        inputs = self.make_inputs(self.input_seed + 70_000)
        out = ref_model(*clone_tree(inputs))
        nbytes = sum(x.numel() * x.element_size() for _, x in cmp.leaves((inputs, out)) if isinstance(x, torch.Tensor))
        buf = torch.empty(256 * 2**20, dtype=torch.uint8, device=self.device)
        dst = torch.empty_like(buf)
        dst.copy_(buf)
        self.sync()
        t0 = _perf()
        for _ in range(5):
            dst.copy_(buf)
        self.sync()
        bandwidth = 5 * 2 * buf.numel() / (_perf() - t0)  # bytes/s, read + write
        del buf, dst
        return nbytes / bandwidth * 1e3

    def timing(self, ref_model: Any, cand_model: Any, est: dict, recheck_fraction: float, seed_offset: int = 20_000,
               max_trials: int | None = None) -> dict[str, Any]:
        """Interleaved, randomized-order timing on fresh inputs with sampled re-checks."""
        timer = make_timer(self.device)
        timer.calibrate()
        flush = L2Flusher(self.device) if self.cfg.flush_l2 else (lambda: None)
        rng = random.Random(self.input_seed ^ 0x5EED)
        models = {"ref": ref_model, "cand": cand_model}
        t_gen = self.time_input_generation()
        for w in range(self.cfg.warmup_calls):
            for who in ("ref", "cand"):
                out, _ = self.run_model(models[who], self.make_inputs(self.input_seed + 10_000 + w))
                if who == "cand":
                    self.settle(f"warm-up call {w}", out)
                del out
        per_pair_s = (statistics.median(est["ref"]) + statistics.median(est["cand"])) / 1e3 + 2 * t_gen + 2e-4
        n = int(min(self.cfg.timing_trials, max(self.cfg.min_timing_trials, self.cfg.timing_budget_s / per_pair_s)))
        n = min(n, max_trials or n)
        n_re = max(2, round(recheck_fraction * n))
        recheck = set(rng.sample(range(n), min(n, n_re))) | {n - 1}
        raw: dict[str, list[float]] = {"ref_stream": [], "ref_device": [], "cand_stream": [], "cand_device": []}
        seed0 = self.input_seed + seed_offset
        for t in range(n):
            for who in rng.sample(["ref", "cand"], 2):
                inputs = self.make_inputs(seed0 + 2 * t + (who == "cand"))
                keep = who == "cand" and t in recheck
                pristine = clone_tree(inputs) if keep else None
                flush()
                stream_ms, device_ms, out = timer.time_call(models[who], tuple(inputs))
                if who == "cand":
                    self.settle(f"timed call {t}", out)  # after the clocks stopped
                raw[f"{who}_stream"].append(stream_ms)
                raw[f"{who}_device"].append(device_ms)
                if keep:
                    self.recheck(t, ref_model, out, inputs, pristine)
                del out, inputs, pristine
            self.check_math(f"timed call {t}")
        self.address_reuse_probe(ref_model, cand_model, seed0 + 2 * n + 1)
        charged = charge(raw["ref_stream"], raw["ref_device"], raw["cand_stream"], raw["cand_device"], timer.calibration)
        return {"ref_samples": charged.ref_ms, "cand_samples": charged.cand_ms, "clock": timer.clock,
                "side_stream": charged.side_stream, "rechecked": len(recheck), "raw": raw,
                "calibration": timer.calibration}

    def recheck(self, t: int, ref_model: Any, out: Any, used_inputs: list, pristine: list) -> None:
        """A timed output must match the reference on that call's own fresh inputs."""
        where = "address-reuse probe" if t < 0 else f"timed call {t}"
        if not cmp.tensors_equal(used_inputs, pristine):
            raise Verdict("rejected", f"{where}: the candidate modified its inputs", "input_mutation")
        ref_out, _ = self.run_model(ref_model, clone_tree(pristine))
        mismatch, _ = cmp.compare(ref_out, out, self.tolerances(), self.device.type, limits=self.recheck_limits)
        if mismatch is None:
            return
        if mismatch.flag == "lazy_output":
            raise Verdict("rejected", f"{where} (re-check): {mismatch.detail}", "lazy_output")
        if stale(ref_out, out):  # not the answer for these inputs at all: a cached or stale output
            raise Verdict("rejected", f"{where} (re-check): {mismatch.detail}", "cached_result")
        # Right answer, wrong numerics: a numerics verdict, never evidence of caching.
        raise Verdict("incorrect", f"{where} (re-check): {mismatch.detail}", mismatch.flag)

    def address_reuse_probe(self, ref_model: Any, cand_model: Any, seed: int) -> None:
        """Untimed: call the candidate twice on the *same* input tensors with new values written
        into them in between.  A result cache keyed on input addresses (or CUDA graphs replayed
        without copying the inputs) returns the first call's output and is caught on every run,
        not only when the allocator happens to hand out a repeated address."""
        inputs = self.make_inputs(seed)
        out, _ = self.run_model(cand_model, inputs)
        self.settle("address-reuse probe", out)
        del out
        fresh = self.make_inputs(seed + 1)
        try:
            with torch.no_grad():
                for dst, src in zip(inputs, fresh):
                    if isinstance(dst, torch.Tensor):
                        dst.copy_(src)
        except RuntimeError:
            return  # inputs that cannot be written in place (e.g. expanded views): no probe
        del fresh
        pristine = clone_tree(inputs)
        out, _ = self.run_model(cand_model, inputs)
        self.settle("address-reuse probe", out)
        self.recheck(-1, ref_model, out, inputs, pristine)

    def time_input_generation(self) -> float:
        t0 = _perf()
        self.make_inputs(self.input_seed + 30_000)
        self.sync()
        return _perf() - t0

    # ---- guards -------------------------------------------------------------------------
    def check_math(self, where: str) -> None:
        """Run the runtime guards (see runtime_guard); a violation ends the protocol."""
        found = self.guard.violation() if self.guard else None
        if found:
            raise Verdict("rejected", f"after {where}: {found[1]}", found[0])

    def poison(self) -> None:
        if self.cfg.poison_freed_memory:
            poison_free_blocks(self.device)


_STALE_REL = 0.25  # normwise difference from the reference that no rounding produces


def stale(ref_out: Any, out: Any) -> bool:
    """Whether a re-checked output is not the answer for its inputs at all (normwise relative
    difference above ``_STALE_REL`` on some floating output, or any other mismatch), as opposed to
    a rounding-sized difference."""
    for (_, r), (_, o) in zip(cmp.leaves(ref_out), cmp.leaves(out)):
        if not isinstance(r, torch.Tensor) or not isinstance(o, torch.Tensor) or r.shape != o.shape or r.dtype != o.dtype:
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


def record_rule(corr: dict[str, Any], errors: Any, table: dict[str, tuple[float, float]], exact: Any) -> None:
    """Fold one trial's errors into the correctness block: which rule judged, the tightest
    exact-rule check per dtype (the parent re-checks it with its own constants) and the
    numbers people read (``ref_err``, ``cand_err``, ``bound``: normwise, relative to |exact|)."""
    for check in errors.exact:
        seen = corr["exact_checks"].get(check.dtype)
        if seen is None or check.ratio(table) > LeafCheck.from_record(check.dtype, seen).ratio(table):
            corr["exact_checks"][check.dtype] = check.record()
        if check.ratio(table) >= corr.get("worst_ratio", -1.0):
            corr.update(check.summary(table))
    corr["fixed_outputs"].update(errors.fixed)
    if "@exact" in table and corr["exact_checks"]:
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
