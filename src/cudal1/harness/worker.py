"""The worker: runs one reference/candidate pair inside a killable child process.

Contract: ``worker_entry(job, conn, key_holder)`` is the child's only entry point.  It installs
the audit hook (:mod:`cudal1.harness.audit_guard`: the only holder of the channel key) before
any task code runs, announces each phase (``setup``, ``import``, ``construct``, ``correctness``,
``timing``) on the signed channel, sends its environment, and ends with exactly one ``result``
message, then leaves with ``os._exit`` so that no candidate ``atexit`` hook runs.  Messages go
through :meth:`Worker.send` (an audit event the hook signs only for the judge's own call
chain); no object on the worker's stack holds the key or the tolerance table.  Everything the
child prints goes to ``job['log_path']``.  The parent enforces the per-phase deadlines and turns
a missing verdict (crash, signal, ``os._exit``) into a result; this module never decides about
time limits.

After every candidate call (and after import and construction) the thread inventory looks for
work the call did not wait for (:meth:`Worker.settle`): outside the timed region, a few
microseconds when there is nothing to find.

Modes: ``eval`` (the full protocol), ``build`` (import the candidate with no GPU visible, so
``load_inline`` fills the build cache ahead of GPU timing), ``baseline`` (the reference against a
wrapped copy of itself: ``torch.compile`` modes or CUDA-graph replay).
"""

from __future__ import annotations

import faulthandler
import importlib.util
import json
import os
import random
import statistics
import sys
import time
import traceback
from typing import Any

import torch

from cudal1.harness import audit_guard
from cudal1.harness import compare as cmp
from cudal1.harness.degenerate import degenerate_reason, fingerprint
from cudal1.harness.kernels import custom_kernels
from cudal1.harness.memory import L2Flusher, poison_free_blocks
from cudal1.harness.runtime_guard import RuntimeGuard, _sleep, settle_s
from cudal1.harness.stats import charge
from cudal1.harness.timer import make_timer

_perf = time.perf_counter
_THREAD_GRACE_S = 0.1  # a thread seen right after a call gets this long to finish (its writes are watched)
_audit = sys.audit  # captured before candidate code runs
_dumps = json.dumps


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


def load_module(path: str, name: str) -> Any:
    """Import a source file as a real module (``@triton.jit`` needs the file for its source)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# Sticky CUDA faults: after one of these the worker's CUDA context is unusable.
_CUDA_FAULTS = ("illegal memory access", "illegal instruction", "misaligned address", "invalid address space",
                "unspecified launch failure", "cudaErrorLaunchFailure", "device-side assert triggered")
# ("device-side assert triggered", not "device-side assert": torch appends "Compile with
# `TORCH_USE_CUDA_DSA` to enable device-side assertions" to *every* CUDA error message.)


def classify_runtime(exc: BaseException, phase: str) -> Verdict:
    """Map an exception raised from construction on to a ``runtime_error`` verdict."""
    text = f"{type(exc).__name__}: {exc}"
    flags = []
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in text:
        flags.append("oom")
    if any(sign in text for sign in _CUDA_FAULTS):
        flags.append("illegal_memory_access")
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-6:])
    return Verdict("runtime_error", f"{phase}: {text[:2000]}", *flags, traceback=tb[-4000:])


class Worker:
    def __init__(self, job: dict[str, Any], threads: Any = None) -> None:
        self.job = job
        self.cfg = job["config"]
        self.threads = threads or (lambda: [])  # audit_guard's thread inventory
        self.device = torch.device("cpu")
        self.input_seed = int(job["input_seed"])
        self.log_path = job["log_path"]
        self.guard: RuntimeGuard | None = None
        self.current_phase = ""
        self.extra_flags: list[str] = []  # informational flags gathered along the protocol
        self.resume_phase = ""
        self.degenerate: str | None = None
        self.ref_mod: Any = None

    # ---- protocol -----------------------------------------------------------------------
    def run(self) -> None:
        result: dict[str, Any] = {}
        phase = "setup"
        try:
            self.phase(phase)
            self.setup()
            ref_mod = self.ref_mod = self.load_reference()
            if self.job["mode"] != "build":
                phase = "reference"
                self.phase(phase)
                with torch.no_grad():
                    ref_model = self.construct_reference(ref_mod)
                    self.probe_task(ref_mod, ref_model)
                self.guard.watch_reference(ref_mod, ref_model)
            phase = "import"
            self.phase(phase)
            model_new = self.import_candidate()
            if self.job["mode"] == "build":
                raise Verdict("ok", "built")
            phase = "construct"
            self.phase(phase)
            cand_model = self.construct_candidate(ref_mod, model_new)
            phase = "correctness"
            self.phase(phase)
            with torch.no_grad():
                estimate, correctness = self.correctness(ref_model, cand_model, self.input_seed, int(self.cfg["correctness_trials"]))
                result["correctness"] = correctness
                kernels = self.kernel_names(cand_model)
                if kernels is not None:
                    result["kernels"] = kernels
                    if not custom_kernels(kernels):
                        self.extra_flags.append("no_custom_kernel")
                phase = "timing"
                self.phase(phase)
                result.update(self.timing(ref_model, cand_model, estimate, float(self.cfg["recheck_fraction"])))
                result.update(self.verify_extraordinary(ref_model, cand_model, estimate, result))
            result["correctness"]["rechecked"] = result.pop("rechecked", 0)
            flags = ["side_stream"] if result.get("side_stream") else []
            from cudal1.harness.build_memo import failed_builds

            if failed_builds:  # it built nothing, yet ran: PyTorch fallback behind try/except
                self.extra_flags.append("pytorch_fallback")
            status = "rejected" if flags else "ok"
            message = "side-stream work escaped the calling stream" if flags else ""
            self.finish(status, message, flags + self.extra_flags, phase="done", **result)
        except Verdict as v:
            self.finish(v.status, v.message, v.flags, phase=phase, **{**result, **v.extra})
        except BaseException as exc:  # noqa: BLE001 - every failure becomes a verdict
            v = classify_runtime(exc, phase)
            self.finish(v.status, v.message, v.flags, phase=phase, **{**result, **v.extra})

    def phase(self, name: str) -> None:
        self.current_phase = name
        arm_stall_dump(self.cfg, name)
        self.send("phase", name=name, t=time.time())

    def building(self, on: bool) -> None:
        """Extension builds outside the import phase get the build deadline, then the phase
        they interrupted starts a fresh deadline."""
        if on and self.current_phase not in ("import", "build"):
            self.resume_phase = self.current_phase
            self.phase("build")
        elif not on and self.current_phase == "build" and self.resume_phase:
            self.phase(self.resume_phase)
            self.resume_phase = ""

    def finish(self, status: str, message: str, flags: list[str], **data: Any) -> None:
        self.send("result", status=status, message=message, flags=flags, **data)

    def send(self, kind: str, **data: Any) -> None:
        """One message on the verdict channel: the audit hook signs it if this call came down
        the judge's own protocol chain (see audit_guard)."""
        _audit("cudal1.channel", kind, _dumps(data, default=str))

    # ---- phases -------------------------------------------------------------------------
    def setup(self) -> None:
        want = self.job["device"]
        if want == "cuda":
            if not torch.cuda.is_available():
                raise Verdict("runtime_error", "CUDA requested but no GPU is visible to the worker")
            torch.cuda.set_device(0)
            self.device = torch.device("cuda", 0)
        if self.cfg.get("math_mode", "strict") == "strict":
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            torch.set_float32_matmul_precision("highest")
        from cudal1.harness import build_memo

        build_memo.install(self.building)
        self.guard = RuntimeGuard()
        self.guard.watch_worker(self)
        from cudal1.harness.envinfo import collect_environment

        self.send("env", **collect_environment(self.device))

    def load_reference(self) -> Any:
        try:
            return load_module(self.job["reference_path"], self.job["reference_module"])
        except BaseException as exc:  # noqa: BLE001
            raise Verdict("runtime_error", f"reference failed to import: {type(exc).__name__}: {exc}", "reference_error") from None

    def import_candidate(self) -> Any:
        if self.job["mode"] == "baseline":
            return None
        start = os.path.getsize(self.log_path)
        t0 = _perf()
        try:
            path, name = self.job["candidate_path"], self.job["candidate_module"]
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot import {path}")
            module = importlib.util.module_from_spec(spec)
            _audit("cudal1.candidate", module.__dict__)  # the audit guard attributes this module's frames
            sys.modules[name] = module
            spec.loader.exec_module(module)
            model_new = getattr(module, "ModelNew", None)
            if model_new is None or not isinstance(model_new, type):
                raise ImportError("the candidate defines no class ModelNew")
        except BaseException as exc:  # noqa: BLE001 - import/build failures are compile errors
            log = self.read_log(start)
            detail = f"{type(exc).__name__}: {exc}"
            is_build = "Error building extension" in detail or "CalledProcessError" in detail
            raise Verdict("compile_error", detail[:4000], compile_log=(log + "\n" + detail)[-20000:],
                          build_error=is_build, build_s=_perf() - t0) from None
        self.send("built", build_s=_perf() - t0, compile_log=self.read_log(start)[-20000:])
        self.check_math("import")
        self.settle("import")
        return model_new

    def init_inputs(self, ref_mod: Any) -> list:
        init = list(ref_mod.get_init_inputs())
        return [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in init]

    def construct_reference(self, ref_mod: Any, seed: int | None = None) -> Any:
        try:
            torch.manual_seed(int(self.cfg["seed"]) if seed is None else seed)
            return ref_mod.Model(*self.init_inputs(ref_mod)).to(self.device)
        except BaseException as exc:  # noqa: BLE001
            raise Verdict("runtime_error", f"reference failed to construct: {type(exc).__name__}: {exc}", "reference_error") from None

    def probe_task(self, ref_mod: Any, ref_model: Any) -> None:
        """Degenerate-task check on the reference alone, before any candidate code runs."""
        try:
            prints = []
            for i in range(3):
                out = ref_model(*self.make_inputs(self.input_seed + i))
                prints.append(fingerprint(out))
                scrub(out)
                del out
            other = None
            params = [p for p in ref_model.parameters() if p.is_floating_point()]
            if params:
                other_model = self.construct_reference(ref_mod, int(self.cfg["seed"]) + 1)
                other_params = [p for p in other_model.parameters() if p.is_floating_point()]
                # Only a model whose initialisation really differs can be init-independent.
                if any(not torch.equal(a, b) for a, b in zip(params, other_params)):
                    other = fingerprint(other_model(*self.make_inputs(self.input_seed)))
                del other_model, other_params
        except Verdict:
            raise
        except BaseException as exc:  # noqa: BLE001
            raise Verdict("runtime_error", f"reference failed to run: {type(exc).__name__}: {exc}", "reference_error") from None
        self.poison()
        self.degenerate = degenerate_reason(prints, other)
        self.send("task", degenerate=self.degenerate)

    def construct_candidate(self, ref_mod: Any, model_new: Any) -> Any:
        torch.manual_seed(int(self.cfg["seed"]))
        if self.job["mode"] == "baseline":
            from cudal1.harness.baselines import wrap_baseline

            model = ref_mod.Model(*clone_tree(self.init_inputs(ref_mod))).to(self.device)
            return wrap_baseline(self.job["baseline_mode"], model, self.device)
        cand_model = model_new(*clone_tree(self.init_inputs(ref_mod)))
        if isinstance(cand_model, torch.nn.Module):
            cand_model = cand_model.to(self.device)
        self.check_math("construct")
        self.settle("construct")
        return cand_model

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
                "by_dtype": {}}
        models = {"ref": ref_model, "cand": cand_model}
        for i in range(trials):
            corr["trials"] = i + 1
            inputs = self.make_inputs(seed0 + i)
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
            mismatch, errors = cmp.compare(outs["ref"], outs["cand"], self.tolerances(), self.device.type)
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

    def kernel_names(self, cand_model: Any) -> list[str] | None:
        """CUDA kernels launched by one profiled candidate forward (None off CUDA or when the
        profiler is unavailable)."""
        if self.device.type != "cuda" or self.job["mode"] == "baseline":
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

    def tolerances(self) -> dict[str, tuple[float, float]]:
        """The tolerance table, fresh from the audit hook on every use: no object on the
        worker's stack holds a table that candidate code could loosen."""
        table: dict[str, tuple[float, float]] = {}
        _audit("cudal1.tolerances", table)
        if not table:
            raise RuntimeError("the audit guard is not installed: no tolerance table")
        return table

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
        if not impossible and ref_ms / max(cand_ms, 1e-9) <= float(self.cfg.get("strict_speedup", 10.0)):
            return {"floor_ms": floor_ms}
        self.phase("verify")
        _, corr = self.correctness(ref_model, cand_model, self.input_seed + 50_000, max(20, int(self.cfg["correctness_trials"])))
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
        flush = L2Flusher(self.device)
        rng = random.Random(self.input_seed ^ 0x5EED)
        models = {"ref": ref_model, "cand": cand_model}
        t_gen = self.time_input_generation()
        for w in range(int(self.cfg["warmup_calls"])):
            for who in ("ref", "cand"):
                out, _ = self.run_model(models[who], self.make_inputs(self.input_seed + 10_000 + w))
                if who == "cand":
                    self.settle(f"warm-up call {w}", out)
                del out
        per_pair_s = (statistics.median(est["ref"]) + statistics.median(est["cand"])) / 1e3 + 2 * t_gen + 2e-4
        n = int(min(self.cfg["timing_trials"], max(self.cfg["min_timing_trials"], self.cfg["timing_budget_s"] / per_pair_s)))
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
        mismatch, _ = cmp.compare(ref_out, out, self.tolerances(), self.device.type)
        if mismatch is not None:
            flag = "lazy_output" if mismatch.flag == "lazy_output" else "cached_result"
            raise Verdict("rejected", f"{where} (re-check): {mismatch.detail}", flag)

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
        if self.cfg.get("poison_freed_memory", True):
            poison_free_blocks(self.device)

    def read_log(self, start: int) -> str:
        sys.stdout.flush()
        sys.stderr.flush()
        with open(self.log_path, "rb") as f:
            f.seek(start)
            return f.read().decode("utf-8", "replace")


def scrub(obj: Any) -> None:
    """Overwrite a reference output in place before it is freed (NaN for floats)."""
    for _, leaf in cmp.leaves(obj):
        if isinstance(leaf, torch.Tensor) and leaf.numel():
            try:
                leaf.fill_(float("nan") if leaf.is_floating_point() else 0)
            except RuntimeError:
                pass


def arm_stall_dump(cfg: dict[str, Any], phase: str) -> None:
    """A phase that stalls leaves every thread's stack in the log (the verdict's stderr_tail)
    shortly before the parent's deadline for that phase kills it, so a timeout says where it
    hung; re-armed at each phase, so a long but moving run dumps nothing."""
    key = {"setup": "setup_timeout_s", "import": "build_timeout_s", "build": "build_timeout_s"}.get(phase, "timeout_s")
    faulthandler.dump_traceback_later(max(1.0, 0.8 * float(cfg.get(key, 120.0))), repeat=True)


def _redirect_output(log_path: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


def worker_entry(job: dict[str, Any], conn: Any, key_holder: list) -> None:
    """Child entry point (multiprocessing target).  Never returns normally: ``os._exit``.
    ``key_holder`` is a one-element list: the key leaves it for the audit hook's closure, so
    that no frame on the worker's stack (nor ``current_process()._args``) keeps it."""
    for name, value in job.get("env", {}).items():
        os.environ[name] = value
    _redirect_output(job["log_path"])
    arm_stall_dump(job["config"], "setup")
    audit_guard.clear_process_args()
    fd = os.dup(conn.fileno())
    conn.close()
    threads = audit_guard.install(
        key_holder.pop(), fd, candidate_path=job.get("candidate_path"), bottom=sys._getframe(),
        send=Worker.send, chain=[Worker.phase, Worker.finish, Worker.setup, Worker.import_candidate, Worker.probe_task,
                                 Worker.verify_extraordinary, Worker.run],
        building=Worker.building, register=Worker.import_candidate, tolerances_fn=Worker.tolerances,
        profiled=Worker.kernel_names, tolerances=job["tolerances"])
    try:
        Worker(job, threads).run()
    except BaseException as exc:  # noqa: BLE001 - the channel itself failed
        print(f"cudal1 worker: internal failure: {exc!r}", file=sys.stderr)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
