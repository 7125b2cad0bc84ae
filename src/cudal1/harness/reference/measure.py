"""The clean side's measurements: correctness trials, timing in alternating blocks, re-checks, the
address-reuse probe and the stricter second pass, as a mixin of
:class:`~cudal1.harness.reference.worker.RefWorker` (which owns the protocol).

Contract: everything here runs in the reference worker, a process that never imports candidate
code.  The candidate is reached only through a :class:`~cudal1.harness.reference.link.CandidateLink`:
inputs drawn here from the secret seed go into slots, the candidate's process answers with
outputs in slots (cloned here) and, for timed calls, with its own measurements, which the parent
bounds (:mod:`cudal1.harness.figures`).  Comparisons use the configured rule (the float64 answer
by default, :mod:`cudal1.harness.numerics`).  Both sides are timed with the same timer
(:mod:`cudal1.harness.timer`) in blocks of ``timing_block`` calls, the order of the two blocks
random in every round, so drift cancels; the candidate's process is stopped while the reference's
block runs.  Statistics are the parent's: this module only measures.
"""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import time
from typing import Any

import torch

from cudal1.config import EvalConfig
from cudal1.harness import compare as cmp
from cudal1.harness import window
from cudal1.harness.figures import figures
from cudal1.harness.memory import poison_free_blocks
from cudal1.harness.numerics import ExactAnswers, ExactReference
from cudal1.harness.proctree import name_of
from cudal1.harness.reference.hostload import BlockLoad
from cudal1.harness.reference.link import CandidateLink, described
from cudal1.harness.reference.outputs import compare_described, record_rule, stale
from cudal1.harness.reference.refwindow import RefWindow, layout_only
from cudal1.harness.reference.spans import Spans
from cudal1.harness.reference.verdict import Verdict
from cudal1.harness.spec import TimingStage, WorkerSpec
from cudal1.harness.timer import GateWait, make_timer
from cudal1.harness.window import Stager
from cudal1.harness.wire import output_leaves

_perf = time.perf_counter


def recheck_count(n: int, fraction: float) -> int:
    """How many of ``n`` timed candidate calls are re-checked: ``fraction`` of them, at least 2."""
    return min(n, max(2, round(fraction * n)))


def fit_to_budget(blocks: list[list[Any]], n: int, size: int, recheck: set[int], done: dict[str, int],
                  cfg: EvalConfig, recheck_fraction: float, rng: random.Random) -> tuple[int, int, set[int]]:
    """After the first round (one block a side): the calls a side that the timing budget holds at
    that round's own wall per call (the calls, their inputs, the window's masking and snapshots,
    the re-checks, the gates' waits), where that is fewer than ``n``, planned from the calls'
    device time alone; never fewer than ``min_timing_trials`` or than the calls already timed.
    Returns (calls a side, block size, re-checked calls): the blocks left shrink so that about five
    more rounds follow where the calls allow; the re-checked calls keep those drawn below the new
    count and the new last call, topped up from the calls not yet timed to the same share (no cut
    where the calls not yet timed cannot hold the new last call and that share)."""
    per_call_ms = sum(ms / max(1, k) for _, k, ms in blocks)  # one block of each side so far
    fit = int(cfg.timing_budget_s * 1e3 / per_call_ms) if per_call_ms > 0 else n
    new = min(n, max(cfg.min_timing_trials, fit, done["ref"], done["cand"]))
    if new >= n or new - 1 < done["cand"]:  # nothing to cut, or the new last call is timed already
        return n, size, recheck
    kept = {i for i in recheck if i < new} | {new - 1}
    free = sorted(set(range(done["cand"], new)) - kept)
    want = recheck_count(new, recheck_fraction)
    if len(kept) + len(free) < want:  # a cut never re-checks a smaller share
        return n, size, recheck
    kept |= set(rng.sample(free, max(0, want - len(kept))))
    return new, max(1, min(size, (new - max(done.values())) // 5)), kept


def output_bytes(out: Any) -> int:
    return sum(x.numel() * x.element_size() for _, x in cmp.leaves(out) if isinstance(x, torch.Tensor))


class Measurement:
    """Correctness and timing for the reference worker (see the module doc).  Attributes it relies
    on are set by ``RefWorker.__init__``."""

    spec: WorkerSpec
    cfg: EvalConfig
    device: torch.device
    input_seed: int
    ref_mod: Any
    exact: ExactReference | None
    answers: ExactAnswers
    recheck_limits: dict[str, tuple[float, float]]
    extra_flags: list[str]
    fixed_layout: bool = True  # the reference's outputs had one layout in every correctness trial

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

    def first_call(self) -> contextlib.AbstractContextManager[bool]:
        """The candidate's first call's lease (the worker decides it), entered; yields whether the
        candidate's process watches the call for run-time choosers (here: unchanged, no)."""
        return contextlib.nullcontext(False)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def release_cached_memory(self) -> None:
        """The caching allocator's free blocks go back to the driver (CUDA only; untimed)."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def poison(self) -> None:
        if self.cfg.poison_freed_memory:
            poison_free_blocks(self.device)

    # ---- correctness -------------------------------------------------------------------------
    def correctness(self, ref_model: Any, link: CandidateLink, seed0: int, trials: int) -> tuple[dict, dict]:
        """Fresh inputs per trial; the reference runs here, the candidate in its own process.
        Where the phase's wall goes is ``corr["cost_ms"]`` (:class:`Spans`: inputs, the float64
        answer, the reference, the candidate's first call and the rest, the input check, the
        comparison), information only."""
        est: dict[str, list[float]] = {"ref": [], "cand": []}
        spans = Spans()
        span = spans.span
        layouts: set[tuple] = set()  # the reference's output layouts: one, unless they depend on the inputs
        corr = {
            "trials": 0, "passed": 0, "max_abs_error": 0.0, "max_rel_error": 0.0, "failing_trial": None,
            "detail": "", "by_dtype": {}, "exact_checks": {}, "fixed_outputs": {},
        }
        try:
            for i in range(trials):
                corr["trials"] = i + 1
                with span("inputs"):
                    inputs = self.make_inputs(seed0 + i)
                    self.sync()  # each span's device work ends inside it (run_model syncs first anyway)
                with span("exact"):
                    exact = self.answers.take(seed0 + i)
                    if exact is None and self.exact is not None:
                        exact = self.exact(cmp.clone_tree(inputs))
                    self.sync()
                with span("reference"):
                    ref_out, ms = self.run_model(ref_model, cmp.clone_tree(inputs))
                est["ref"].append(ms)
                layouts.add(
                    tuple((str(x.dtype), tuple(x.shape)) for x in output_leaves(ref_out) if isinstance(x, torch.Tensor))
                )
                self.fixed_layout = len(layouts) == 1
                try:
                    with span("candidate_first" if i == 0 else "candidate"), \
                            (self.first_call() if i == 0 else contextlib.nullcontext(False)) as watch:
                        cand_out, ms = link.call(inputs, ref_out, f"trial {i}", full=i < 2, watch=watch)
                except Verdict as v:
                    v.extra.setdefault("correctness", corr)
                    raise
                est["cand"].append(ms)
                with span("intact"):
                    intact = link.inputs_intact(inputs)
                if not intact:
                    raise Verdict(
                        "rejected", f"trial {i}: the input slots were written", "input_mutation", correctness=corr
                    )
                rule = self.spec.tolerances
                with span("compare"):
                    mismatch, errors = compare_described(ref_out, cand_out, rule, self.device.type, exact)
                del exact
                record_rule(corr, errors, rule, self.exact)
                for check in errors.exact:
                    assert rule.exact is not None  # checks against the float64 answer come from the exact rule
                    old = self.recheck_limits.get(check.path, (0.0, 0.0))
                    new = check.limits(rule.exact)
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
        finally:  # a failing trial's verdict carries this dict: its spans so far included
            corr["cost_ms"] = spans.as_dict()
        return est, corr

    def exact_reference(self, ref_model: Any) -> ExactReference | None:
        """The float64 twin of the reference (same initialisation), when the rule is ``exact``."""
        if self.spec.tolerances.exact is None:
            return None
        return ExactReference(ref_model, self.device, shared=self.cfg.workers_per_gpu > 1)

    # ---- timing ------------------------------------------------------------------------------
    def timing(self, ref_model: Any, link: CandidateLink, est: dict, recheck_fraction: float, seed_offset: int = 20_000,
               max_trials: int | None = None) -> dict[str, Any]:
        """Both sides timed by the same timer under the clean window, in blocks whose order is
        random in every round; the candidate's process is sealed after warm-up."""
        spans = self.spans = link.spans = Spans()
        with spans.span("calibrate"):
            timer = make_timer(self.device, self.cfg.flush_l2)
            timer.calibrate()
            stager = link.stager = Stager(self.device, getattr(timer, "kernels", None))
            page = timer.page if self.device.type == "cuda" else window.cpu_page()
            t_gen = self.time_input_generation()
        rng = random.Random(self.input_seed ^ 0x5EED ^ seed_offset)
        host: list[float] = []
        cand_host: list[float] = []
        cand_join: list[float] = []
        template: Any = None
        for w in range(self.cfg.warmup_calls):
            with spans.span("warmup"):
                inputs = self.make_inputs(self.input_seed + 10_000 + w)
                t, out = timer.time_call(ref_model, tuple(inputs), check_escape=False)
                host.append(t.host_ms)
                template = out if template is None else template
                del out
                issued, probe = link.warmup(inputs, join=w == 0)
                del inputs  # not held through the timed calls: on a task of 8 GiB tensors that is 8 GiB
                cand_host.extend(issued)
                cand_join = cand_join or probe
        gated = self.device.type == "cuda"
        refs_wait = GateWait(host, shortens=gated)
        # how long the candidate's call may take to be issued before the gate is opened without it
        # (its own warm-up, as it reported it: a longer or shorter wait gains a cheat nothing, the key
        # is handed out only as the gate opens and the events start after it)
        cand_wait = GateWait(cand_host, shortens=gated)
        with spans.span("seal"):
            sealed = link.seal()
        per_pair_s = (statistics.median(est["ref"]) + statistics.median(est["cand"])) / 1e3 + 2 * t_gen + 4e-4
        n = int(min(self.cfg.timing_trials, max(self.cfg.min_timing_trials, self.cfg.timing_budget_s / per_pair_s)))
        n = min(n, max_trials or n)
        planned = n
        recheck = set(rng.sample(range(n), recheck_count(n, recheck_fraction))) | {n - 1}
        rows: dict[str, list[list[Any]]] = {"ref": [], "cand": []}
        blocks: list[list[Any]] = []
        seed0 = self.input_seed + seed_offset
        # at least six rounds where the calls allow: the confidence interval is computed from
        # per-round ratios (stats.speedup_ci), which needs several rounds to see drift between them
        size = max(1, min(self.cfg.timing_block, n // 6))
        done = {"ref": 0, "cand": 0}
        refs = RefWindow(self, timer, stager, page, template, refs_wait)
        template = layout_only(template)  # the output slots need its layout only, not the output itself
        load = BlockLoad(per_call=self.device.type == "cpu")
        fitted = max_trials is not None  # the stricter pass keeps its count
        while done["ref"] < n or done["cand"] < n:
            for who in rng.sample(["ref", "cand"], 2):
                calls = list(range(done[who], min(n, done[who] + size)))
                if not calls:
                    continue
                t0 = _perf()
                if who == "ref":
                    self.ref_block(refs, ref_model, link, calls, seed0, rows["ref"], load)
                else:
                    with spans.span("load"):
                        load.begin(link.pid)
                    self.cand_block(ref_model, link, calls, seed0, recheck, rows["cand"], template, cand_wait, load)
                    with spans.span("load"):
                        load.end("cand", link.pid)
                blocks.append([who, len(calls), (_perf() - t0) * 1e3])
                done[who] += len(calls)
            if not fitted:  # the first round's wall per call says what the budget holds
                fitted = True
                n, size, recheck = fit_to_budget(blocks, n, size, recheck, done, self.cfg, recheck_fraction, rng)
        refs.release()
        with spans.span("probe"):
            self.no_new_processes(link)
            self.address_reuse_probe(ref_model, link, seed0 + 2 * n + 1)
        return {"timing": {"clock": timer.clock, "ref": rows["ref"], "cand": rows["cand"], "blocks": blocks,
                           "overhead_ms": timer.overhead_ms, "calibration": timer.calibration, "cand_join": cand_join,
                           "sealed": sealed, "helpers": len(link.tree.helpers()), "load": load.as_dict(),
                           "cost_ms": spans.as_dict(), "short_waits": refs_wait.shortened + cand_wait.shortened,
                           "planned_trials": planned if planned != n else 0},
                "rechecked": len(recheck)}

    def no_new_processes(self, link: CandidateLink) -> None:
        """After the timed calls: the candidate's process started nothing since it was sealed."""
        new = link.tree.new_since_freeze()
        if new:
            names = ", ".join(f"{pid} ({name_of(pid)})" for pid in sorted(new)[:5])
            raise Verdict("rejected", f"the candidate's process started {len(new)} process(es) after warm-up: {names}",
                          "new_process")

    def ref_block(self, refs: RefWindow, ref_model: Any, link: CandidateLink, calls: list[int], seed0: int,
                  rows: list[list[Any]], load: BlockLoad) -> None:
        spans = self.spans
        with spans.span("pause"):
            link.pause()
        try:
            with spans.span("load"):
                load.begin(os.getpid())
            for t in calls:
                with spans.span("inputs"):
                    inputs = self.make_inputs(seed0 + 2 * t)
                load.call_begin(os.getpid())
                with spans.span("ref_calls"):
                    rows.append(refs.time(ref_model, inputs))
                load.call_end(os.getpid())
                del inputs
            with spans.span("load"):
                load.end("ref", os.getpid())
        finally:
            with spans.span("resume"):
                link.resume()

    def cand_block(self, ref_model: Any, link: CandidateLink, calls: list[int], seed0: int, recheck: set[int],
                   rows: list[list[Any]], template: Any, wait: GateWait, load: BlockLoad) -> None:
        """The candidate's calls under the window; its digest is checked against the slots on every
        call, and a secret sample of calls is re-checked against the reference afterwards.  ``wait``:
        how long each call may take to be issued before its gate is opened without it."""
        spans = self.spans
        for t in calls:
            where = f"timed call {t}"
            with spans.span("inputs"):
                inputs = self.make_inputs(seed0 + 2 * t + 1)
                ref_out = None if self.fixed_layout else self.run_model(ref_model, cmp.clone_tree(inputs))[0]
            key = window.new_key()
            with spans.span("cand_calls"):
                timed = link.time(inputs, template if ref_out is None else ref_out, key, where, wait.wait_s())
            wait.saw(timed.blocked)
            load.add(timed.threads_ns)
            rows.append(timed.row + [timed.window_ms, timed.waited_ms])
            with spans.span("held"):
                held = link.outputs_held(timed)
            if not held:
                raise Verdict("rejected", f"{where}: the outputs it published when it ended are not the outputs in its "
                                          "slots", "timing_mismatch")
            if bool(timed.row[4]):
                continue  # its own process saw the output change after the calling stream ended: side_stream (stats)
            if t in recheck or described(timed.desc):
                with spans.span("recheck"):
                    out = link.outputs(timed.desc)
                    if not link.inputs_intact(inputs, key):
                        raise Verdict("rejected", f"{where}: the input slots were written", "input_mutation")
                    if ref_out is None:
                        ref_out = self.run_model(ref_model, cmp.clone_tree(inputs))[0]
                    self.recheck(where, ref_out, out)
                    del out
            del inputs, ref_out

    def recheck(self, where: str, ref_out: Any, out: Any) -> None:
        """A timed output must match the reference's output on that call's own fresh inputs."""
        mismatch, _ = compare_described(
            ref_out, out, self.spec.tolerances, self.device.type, limits=self.recheck_limits
        )
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
        without copying the inputs) returns the first call's output and fails the re-check.
        The caching allocator's free blocks go back to the driver first: the probe's second input
        slots are raw allocations, which cannot use them."""
        self.release_cached_memory()
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
            raise Verdict(
                "rejected",
                f"candidate time {cand_ms:.4g} ms is below half the memory floor {floor_ms:.4g} ms",
                "impossible_time",
            )
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
