"""The clean side's measurements: correctness trials, timing in alternating blocks, re-checks, the
address-reuse probe and the stricter second pass, as a mixin of
:class:`~cudal1.harness.refworker.RefWorker` (which owns the protocol).

Contract: everything here runs in the reference worker, a process that never imports candidate
code.  The candidate is reached only through a :class:`~cudal1.harness.link.CandidateLink`:
inputs drawn here from the secret seed go into slots, the candidate's process answers with
outputs in slots (cloned here) and, for timed calls, with its own measurements, which the parent
bounds (:mod:`cudal1.harness.stats`).  Comparisons use the configured rule (the float64 answer
by default, :mod:`cudal1.harness.numerics`).  Both sides are timed with the same timer
(:mod:`cudal1.harness.timer`) in blocks of ``timing_block`` calls, the order of the two blocks
random in every round, so drift cancels; the candidate's process is stopped while the reference's
block runs.  Statistics are the parent's: this module only measures.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

import torch

from cudal1.harness import compare as cmp
from cudal1.harness.link import CandidateLink
from cudal1.harness.memory import poison_free_blocks
from cudal1.harness.numerics import ExactAnswers, ExactReference, LeafCheck, deviation
from cudal1.harness.spec import TimingStage
from cudal1.harness.stats import figures
from cudal1.harness.timer import make_timer
from cudal1.harness.verdict import Verdict

_perf = time.perf_counter


def output_bytes(out: Any) -> int:
    return sum(x.numel() * x.element_size() for _, x in cmp.leaves(out) if isinstance(x, torch.Tensor))


class Measurement:
    """Correctness and timing for the reference worker (see the module doc).  Attributes it relies
    on are set by ``RefWorker.__init__``."""

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
        """Fresh inputs from the task's ``get_inputs`` under ``seed``, created on the device.
        Seeds the CPU generator and, on CUDA, the device's own (what ``torch.manual_seed`` seeds
        that ``get_inputs`` can draw from): ``torch.manual_seed`` also queues a lazy seeding, with
        a formatted stack, for every backend not initialised (XPU, MTIA), about a millisecond
        per call."""
        torch.random.default_generator.manual_seed(seed)
        if self.device.type == "cuda":
            torch.cuda.default_generators[self.device.index or 0].manual_seed(seed)
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

    def poison(self) -> None:
        if self.cfg.poison_freed_memory:
            poison_free_blocks(self.device)

    # ---- correctness -------------------------------------------------------------------------
    def correctness(self, ref_model: Any, link: CandidateLink, seed0: int, trials: int) -> tuple[dict, dict]:
        """Fresh inputs per trial; the reference runs here, the candidate in its own process."""
        est: dict[str, list[float]] = {"ref": [], "cand": []}
        corr = {"trials": 0, "passed": 0, "max_abs_error": 0.0, "max_rel_error": 0.0, "failing_trial": None, "detail": "",
                "by_dtype": {}, "exact_checks": {}, "fixed_outputs": {}}
        for i in range(trials):
            corr["trials"] = i + 1
            inputs = self.make_inputs(seed0 + i)
            exact = self.answers.answers.get(seed0 + i)
            if exact is None and self.exact is not None:
                exact = self.exact(cmp.clone_tree(inputs))
            ref_out, ms = self.run_model(ref_model, cmp.clone_tree(inputs))
            est["ref"].append(ms)
            try:
                cand_out, ms = link.call(inputs, ref_out, f"trial {i}", full=i < 2)
            except Verdict as v:
                v.extra.setdefault("correctness", corr)
                raise
            est["cand"].append(ms)
            if not link.inputs_intact(inputs):
                raise Verdict("rejected", f"trial {i}: the input slots were written", "input_mutation", correctness=corr)
            table = self.tolerances()
            mismatch, errors = compare_described(ref_out, cand_out, table, self.device.type, exact)
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
            del ref_out, cand_out, inputs
        return est, corr

    def exact_reference(self, ref_model: Any) -> ExactReference | None:
        """The float64 twin of the reference (same initialisation), when the rule is ``exact``."""
        if "@exact" not in self.tolerances():
            return None
        return ExactReference(ref_model, self.device, shared=self.cfg.workers_per_gpu > 1)

    # ---- timing ------------------------------------------------------------------------------
    def timing(self, ref_model: Any, link: CandidateLink, est: dict, recheck_fraction: float, seed_offset: int = 20_000,
               max_trials: int | None = None) -> dict[str, Any]:
        """Both sides timed by the same timer, in blocks whose order is random in every round."""
        timer = make_timer(self.device, self.cfg.flush_l2)
        timer.calibrate()
        rng = random.Random(self.input_seed ^ 0x5EED ^ seed_offset)
        t_gen = self.time_input_generation()
        host: list[float] = []
        cand_join: list[float] = []
        for w in range(self.cfg.warmup_calls):
            inputs = self.make_inputs(self.input_seed + 10_000 + w)
            t, out = timer.time_call(ref_model, tuple(inputs), check_escape=False)
            host.append(t.host_ms)
            del out
            _, probe = link.warmup(inputs, join=w == 0)
            cand_join = cand_join or probe
        timer.set_watchdog(host)
        per_pair_s = (statistics.median(est["ref"]) + statistics.median(est["cand"])) / 1e3 + 2 * t_gen + 4e-4
        n = int(min(self.cfg.timing_trials, max(self.cfg.min_timing_trials, self.cfg.timing_budget_s / per_pair_s)))
        n = min(n, max_trials or n)
        recheck = set(rng.sample(range(n), min(n, max(2, round(recheck_fraction * n))))) | {n - 1}
        rows: dict[str, list[list[Any]]] = {"ref": [], "cand": []}
        blocks: list[list[Any]] = []
        seed0 = self.input_seed + seed_offset
        size = max(1, self.cfg.timing_block)
        done = {"ref": 0, "cand": 0}
        while done["ref"] < n or done["cand"] < n:
            for who in rng.sample(["ref", "cand"], 2):
                calls = list(range(done[who], min(n, done[who] + size)))
                if not calls:
                    continue
                t0 = _perf()
                if who == "ref":
                    self.ref_block(timer, ref_model, link, calls, seed0, rows["ref"])
                else:
                    self.cand_block(ref_model, link, calls, seed0, recheck, rows["cand"])
                blocks.append([who, len(calls), (_perf() - t0) * 1e3])
                done[who] += len(calls)
        self.address_reuse_probe(ref_model, link, seed0 + 2 * n + 1)
        return {"timing": {"clock": timer.clock, "ref": rows["ref"], "cand": rows["cand"], "blocks": blocks,
                           "overhead_ms": timer.overhead_ms, "calibration": timer.calibration, "cand_join": cand_join},
                "rechecked": len(recheck)}

    def ref_block(self, timer: Any, ref_model: Any, link: CandidateLink, calls: list[int], seed0: int,
                  rows: list[list[Any]]) -> None:
        link.pause()
        try:
            for t in calls:
                inputs = self.make_inputs(seed0 + 2 * t)
                ct, out = timer.time_call(ref_model, tuple(inputs), check_escape=False)
                rows.append([ct.gpu_ms, ct.device_ms, ct.host_ms, ct.blocked, ct.escaped])
                del out, inputs
        finally:
            link.resume()

    def cand_block(self, ref_model: Any, link: CandidateLink, calls: list[int], seed0: int, recheck: set[int],
                   rows: list[list[Any]]) -> None:
        for t in calls:
            inputs = self.make_inputs(seed0 + 2 * t + 1)
            keep = t in recheck
            pristine = cmp.clone_tree(inputs) if keep else None
            ref_out = self.run_model(ref_model, cmp.clone_tree(inputs))[0] if keep else None
            row, out, wall_ms = link.time(inputs, ref_out, keep, f"timed call {t}")
            rows.append(row + [wall_ms])
            if keep:
                if not link.inputs_intact(pristine):
                    raise Verdict("rejected", f"timed call {t}: the input slots were written", "input_mutation")
                self.recheck(f"timed call {t}", ref_out, out)
            del out, inputs, pristine, ref_out

    def recheck(self, where: str, ref_out: Any, out: Any) -> None:
        """A timed output must match the reference's output on that call's own fresh inputs."""
        mismatch, _ = compare_described(ref_out, out, self.tolerances(), self.device.type, limits=self.recheck_limits)
        if mismatch is None:
            return
        if mismatch.flag == "lazy_output":
            raise Verdict("rejected", f"{where} (re-check): {mismatch.detail}", "lazy_output")
        if stale(ref_out, out):  # not the answer for these inputs at all: a cached or stale output
            raise Verdict("rejected", f"{where} (re-check): {mismatch.detail}", "cached_result")
        raise Verdict("incorrect", f"{where} (re-check): {mismatch.detail}", mismatch.flag)

    def address_reuse_probe(self, ref_model: Any, link: CandidateLink, seed: int) -> None:
        """Untimed: the candidate is called twice on the *same* input tensors with new values
        written into them in between; a result cache keyed on addresses (or CUDA graphs replayed
        without copying the inputs) returns the first call's output and fails the re-check."""
        first, second = self.make_inputs(seed), self.make_inputs(seed + 1)
        ref_out, _ = self.run_model(ref_model, cmp.clone_tree(second))
        out = link.reuse(first, second, ref_out)
        if out is not None:
            self.recheck("address-reuse probe", ref_out, out)

    def time_input_generation(self) -> float:
        t0 = _perf()
        self.make_inputs(self.input_seed + 30_000)
        self.sync()
        return _perf() - t0

    # ---- the stricter pass -------------------------------------------------------------------
    def verify_extraordinary(self, ref_model: Any, link: CandidateLink, est: dict, timed: dict) -> dict[str, Any]:
        """Speedups above ``strict_speedup`` or times below the memory floor get a stricter
        second pass (more correctness trials, every timed output re-checked); its samples
        replace the first pass's.  A time that stays below half the floor is rejected."""
        stage = timed["timing"]
        found = figures(TimingStage(**stage))
        ref_ms, cand_ms = statistics.median(found.gpu["ref"]), statistics.median(found.gpu["cand"])
        floor_ms = self.memory_floor_ms(ref_model)
        physics_ms = self.physics_floor_ms(ref_model)
        impossible = floor_ms is not None and cand_ms < 0.5 * floor_ms
        if found.side_stream or (not impossible and ref_ms / max(cand_ms, 1e-9) <= self.cfg.strict_speedup):
            stage.update(floor_ms=floor_ms, physics_ms=physics_ms)  # escaped work: the parent's side_stream verdict
            return timed
        self.phase("verify")
        _, corr = self.correctness(ref_model, link, self.input_seed + 50_000, max(20, self.cfg.correctness_trials))
        self.phase("verify_timing")
        strict = self.timing(ref_model, link, est, 1.0, seed_offset=60_000, max_trials=30)
        cand_ms = statistics.median(figures(TimingStage(**strict["timing"])).gpu["cand"])
        if floor_ms is not None and cand_ms < 0.5 * floor_ms:
            raise Verdict("rejected", f"candidate time {cand_ms:.4g} ms is below half the memory floor {floor_ms:.4g} ms",
                          "impossible_time")
        self.extra_flags.append("strict_verified")
        strict["timing"].update(floor_ms=floor_ms, physics_ms=physics_ms)
        strict["rechecked"] = timed.get("rechecked", 0) + strict.get("rechecked", 0) + corr["passed"]
        return strict

    def memory_floor_ms(self, ref_model: Any) -> float | None:
        """Time to read every input and write every output once at measured copy bandwidth."""
        if self.device.type != "cuda":
            return None
        inputs = self.make_inputs(self.input_seed + 70_000)
        out = ref_model(*cmp.clone_tree(inputs))
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

    def physics_floor_ms(self, ref_model: Any) -> float | None:
        """Writing the outputs once at the device's peak memory bandwidth: no call can be faster."""
        if self.device.type != "cuda":
            return None
        from cudal1.harness import cuda_api

        peak = cuda_api.peak_bandwidth(self.device.index or 0)
        if not peak:
            return None
        out = ref_model(*self.make_inputs(self.input_seed + 70_001))
        return output_bytes(out) / peak * 1e3


def compare_described(ref_out: Any, out: Any, table: dict[str, tuple[float, float]], device_type: str,
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
    return cmp.compare(ref_out, out, table, device_type, exact=exact, limits=limits)


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
