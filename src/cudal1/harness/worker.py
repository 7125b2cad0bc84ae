"""The worker's protocol: runs one reference/candidate pair inside a killable child process.

Contract: ``worker_entry(spec, conn, key_holder)`` is the child's only entry point; ``spec`` is the
typed :class:`~cudal1.harness.spec.WorkerSpec`.  It installs
the audit hook (:mod:`cudal1.harness.signing_hook`: the only holder of the channel key) before
any task code runs, announces each phase (``setup``, ``import``, ``construct``, ``correctness``,
``timing``) on the signed channel, sends its environment, and ends with exactly one ``result``
message, then leaves with ``os._exit`` so that no candidate ``atexit`` hook runs.  Messages go
through :meth:`Worker.send` (an audit event the hook signs only for the judge's own call
chain); no object on the worker's stack holds the key or the tolerance table.  Everything the
child prints goes to ``spec.log_path``.  The parent enforces the per-phase deadlines and turns
a missing verdict (crash, signal, ``os._exit``) into a result; this module never decides about
time limits.

This module owns the protocol (phases, messages, imports, construction, the task probe); the
measurements (correctness trials, timing, re-checks, settle checks) are the
:class:`~cudal1.harness.measure.Measurement` mixin.  After every candidate call (and after import
and construction) the thread inventory looks for work the call did not wait for
(:meth:`Worker.settle`): outside the timed region, a few microseconds when there is nothing to
find.

Modes: ``eval`` (the full protocol), ``build`` (import the candidate with no GPU visible, so
``load_inline`` fills the build cache ahead of GPU timing), ``baseline`` (the reference against a
wrapped copy of itself: ``torch.compile`` modes or CUDA-graph replay).
"""

from __future__ import annotations

import faulthandler
import fcntl
import importlib.util
import json
import os
import sys
import time
import traceback
from typing import Any

import torch

from cudal1.harness import signing_hook
from cudal1.harness.degenerate import degenerate_reason, fingerprint
from cudal1.harness.faults import is_cuda_fault, is_out_of_memory
from cudal1.harness.kernels import custom_kernels
from cudal1.harness.numerics import ExactAnswers, ExactReference
from cudal1.harness.runtime_guard import RuntimeGuard
from cudal1.harness.measure import Measurement, Verdict, clone_tree, scrub
from cudal1.harness.spec import WorkerSpec

_perf = time.perf_counter
_audit = sys.audit  # captured before candidate code runs
_dumps = json.dumps


def load_module(path: str, name: str) -> Any:
    """Import a source file as a real module (``@triton.jit`` needs the file for its source)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _oom_flag(exc: BaseException) -> list[str]:
    """``["oom"]`` when ``exc`` says the device (or host) ran out of memory."""
    return ["oom"] if is_out_of_memory(exc) else []


def classify_runtime(exc: BaseException, phase: str) -> Verdict:
    """Map an exception raised from construction on to a ``runtime_error`` verdict."""
    text = f"{type(exc).__name__}: {exc}"
    flags = _oom_flag(exc)
    if is_cuda_fault(text):
        flags.append("illegal_memory_access")
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-6:])
    return Verdict("runtime_error", f"{phase}: {text[:2000]}", *flags, traceback=tb[-4000:])


class Worker(Measurement):
    def __init__(self, spec: WorkerSpec, threads: Any = None) -> None:
        self.spec = spec
        self.cfg = spec.config
        self.threads = threads or (lambda: [])  # signing_hook's thread inventory
        self.device = torch.device("cpu")
        self.input_seed = spec.input_seed
        self.log_path = spec.log_path
        self.guard: RuntimeGuard | None = None
        self.current_phase = ""
        self.extra_flags: list[str] = []  # informational flags gathered along the protocol
        self.resume_phase = ""
        self.degenerate: str | None = None
        self.ref_mod: Any = None
        self.exact: ExactReference | None = None  # the float64 reference (exact rule), built before candidate code runs
        self.recheck_limits: dict[str, tuple[float, float]] = {}  # output path -> limits for timed re-checks
        self.answers = ExactAnswers()  # float64 answers of the correctness inputs (shared across candidates)
        self.lease_fd: int | None = None  # the GPU lease file (spec.gpu_lease), opened before any task code
        self.lease_held = "none"  # none | shared | exclusive
        self.resume_lease = "none"  # what a build outside the import phase released

    # ---- protocol -----------------------------------------------------------------------
    def run(self) -> None:
        result: dict[str, Any] = {}
        phase = "setup"
        try:
            self.phase(phase)
            self.setup()
            ref_mod = self.ref_mod = self.load_reference()
            if self.spec.mode != "build":
                phase = "reference"
                self.enter(phase, "shared")
                with torch.no_grad():
                    ref_model = self.construct_reference(ref_mod)
                    self.exact = self.exact_reference(ref_model)
                    self.probe_task(ref_mod, ref_model)
                self.guard.watch_reference(ref_mod, ref_model)
            phase = "import"
            self.enter(phase, "none")  # imports build on the CPU: the GPU's other workers may go on
            model_new = self.import_candidate()
            if self.spec.mode == "build":
                raise Verdict("ok", "built")
            phase = "construct"
            self.enter(phase, "shared")
            cand_model = self.construct_candidate(ref_mod, model_new)
            phase = "correctness"
            self.phase(phase)
            with torch.no_grad():
                estimate, correctness = self.correctness(ref_model, cand_model, self.input_seed, self.cfg.correctness_trials)
                result["correctness"] = correctness
                kernels = self.kernel_names(cand_model)
                if kernels is not None:
                    result["kernels"] = kernels
                    if not custom_kernels(kernels):
                        self.extra_flags.append("no_custom_kernel")
                phase = "timing"
                self.enter(phase, "exclusive")  # nothing else runs on this GPU while it is timed
                result.update(self.timing(ref_model, cand_model, estimate, self.cfg.recheck_fraction))
                result.update(self.verify_extraordinary(ref_model, cand_model, estimate, result))
            result["correctness"]["rechecked"] = result.pop("rechecked", 0)
            flags = ["side_stream"] if result.get("side_stream") else []
            from cudal1.harness.build import failed_builds

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
            self.resume_phase, self.resume_lease = self.current_phase, self.lease_held
            self.enter("build", "none")  # a build is CPU work: the GPU's other workers may go on
        elif not on and self.current_phase == "build" and self.resume_phase:
            resume, self.resume_phase = self.resume_phase, ""
            self.enter(resume, self.resume_lease)  # the phase starts once its lease is held again

    def enter(self, name: str, lease: str) -> None:
        """Hold the GPU lease as ``lease`` (waiting, if need be, as phase ``lane``), then start
        phase ``name``: a phase that uses the GPU never begins before its lease is held.  Giving
        the lease back (``none``) goes the other way: the GPU phase ends (``name`` is stamped)
        before the lock goes, or another worker could stamp its ``timing`` inside that phase.  Either
        way the GPU is synchronized first: kernels still queued would run into another's timing."""
        if self.lease_held != "none" and lease != self.lease_held and self.device.type == "cuda":
            torch.cuda.synchronize()  # the ending phase's queued GPU work is done before its lease goes
        if lease == "none":
            self.phase(name)
            self.lease(lease)
        else:
            self.lease(lease)
            self.phase(name)

    def lease(self, want: str) -> None:
        """Hold this GPU's lease as ``want`` (none | shared | exclusive).  Several workers may
        share one GPU (``EvalConfig.workers_per_gpu``): phases that use the GPU hold it shared,
        timing holds it exclusively, so no other worker of this judge runs anything on the GPU
        while a candidate is timed; imports and builds hold nothing.  Waiting is announced as
        phase ``lane`` (its own deadline); the caller (:meth:`enter`) then starts the next phase.
        No lease file: a no-op.  A ``flock``: released by the kernel when the process dies."""
        if self.lease_fd is None or want == self.lease_held:
            return
        op = {"none": fcntl.LOCK_UN, "shared": fcntl.LOCK_SH, "exclusive": fcntl.LOCK_EX}[want]
        if self.lease_held != "none" and want != "none":
            # Converting a held flock first drops it, even when a non-blocking attempt then fails;
            # so the current phase ends (is stamped) before the lock can go, or another worker's
            # phase could be stamped as starting before this one ended.
            self.wait_for_lease(op)
        else:
            try:
                fcntl.flock(self.lease_fd, op | fcntl.LOCK_NB)
            except BlockingIOError:
                self.wait_for_lease(op)
        self.lease_held = want

    def wait_for_lease(self, op: int) -> None:
        """Wait (as phase ``lane``) for the lease; a worker that waits holds no cached GPU memory,
        so the workers that run meanwhile have the GPU's memory to themselves as far as it can."""
        self.phase("lane")
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        fcntl.flock(self.lease_fd, op)

    def finish(self, status: str, message: str, flags: list[str], **data: Any) -> None:
        # The lease is held until the process exits, after this message: its time stamp
        # precedes the next holder's phases on any clock reading.
        self.send("result", status=status, message=message, flags=flags, t=time.time(), **data)

    def send(self, kind: str, **data: Any) -> None:
        """One message on the verdict channel: the audit hook signs it if this call came down
        the judge's own protocol chain (see signing_hook)."""
        _audit("cudal1.channel", kind, _dumps(data, default=str))

    # ---- phases -------------------------------------------------------------------------
    def setup(self) -> None:
        if self.spec.gpu_lease and self.spec.mode != "build":
            self.lease_fd = os.open(self.spec.gpu_lease, os.O_RDWR | os.O_CREAT, 0o666)
        want = self.spec.device
        if want == "cuda":
            if not torch.cuda.is_available():
                raise Verdict("runtime_error", "CUDA requested but no GPU is visible to the worker")
            torch.cuda.set_device(0)
            self.device = torch.device("cuda", 0)
        if self.cfg.math_mode == "strict":
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            torch.set_float32_matmul_precision("highest")
        from cudal1.harness import build

        if self.spec.mode == "build":  # CPU child, no GPU: let candidate code take its GPU (building) path
            build.pretend_gpu()
        build.install_memo(self.building)
        self.guard = RuntimeGuard()
        self.guard.watch_worker(self)
        from cudal1.harness.envinfo import collect_environment

        self.send("env", **collect_environment(self.device))

    def load_reference(self) -> Any:
        try:
            return load_module(self.spec.reference_path, self.spec.reference_module)
        except BaseException as exc:  # noqa: BLE001
            raise Verdict("runtime_error", f"reference failed to import: {type(exc).__name__}: {exc}", "reference_error") from None

    def import_candidate(self) -> Any:
        if self.spec.mode == "baseline":
            return None
        start = os.path.getsize(self.log_path)
        t0 = _perf()
        try:
            path, name = self.spec.candidate_path, self.spec.candidate_module
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
            torch.manual_seed(self.cfg.seed if seed is None else seed)
            return ref_mod.Model(*self.init_inputs(ref_mod)).to(self.device)
        except BaseException as exc:  # noqa: BLE001
            raise Verdict("runtime_error", f"reference failed to construct: {type(exc).__name__}: {exc}", "reference_error",
                          *_oom_flag(exc)) from None

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
                other_model = self.construct_reference(ref_mod, self.cfg.seed + 1)
                other_params = [p for p in other_model.parameters() if p.is_floating_point()]
                # Only a model whose initialisation really differs can be init-independent.
                if any(not torch.equal(a, b) for a, b in zip(params, other_params)):
                    other = fingerprint(other_model(*self.make_inputs(self.input_seed)))
                del other_model, other_params
        except Verdict:
            raise
        except BaseException as exc:  # noqa: BLE001
            raise Verdict("runtime_error", f"reference failed to run: {type(exc).__name__}: {exc}", "reference_error",
                          *_oom_flag(exc)) from None
        self.poison()
        self.degenerate = degenerate_reason(prints, other)
        if self.exact is not None:
            cache = self.spec.exact_cache
            trials = self.cfg.correctness_trials
            self.answers.prepare(self.exact, [self.input_seed + i for i in range(trials)], self.make_inputs,
                                 cache.path if cache else None, cache.digest if cache else None)
            self.poison()
        self.send("task", degenerate=self.degenerate, exact_digest=self.answers.digest, exact_source=self.answers.source)

    def construct_candidate(self, ref_mod: Any, model_new: Any) -> Any:
        torch.manual_seed(self.cfg.seed)
        if self.spec.mode == "baseline":
            from cudal1.harness.baselines import wrap_baseline

            model = ref_mod.Model(*clone_tree(self.init_inputs(ref_mod))).to(self.device)
            return wrap_baseline(self.spec.baseline_mode, model, self.device)
        cand_model = model_new(*clone_tree(self.init_inputs(ref_mod)))
        if isinstance(cand_model, torch.nn.Module):
            cand_model = cand_model.to(self.device)
        self.check_math("construct")
        self.settle("construct")
        return cand_model

    def tolerances(self) -> dict[str, tuple[float, float]]:
        """The tolerance table, fresh from the audit hook on every use: no object on the
        worker's stack holds a table that candidate code could loosen."""
        table: dict[str, tuple[float, float]] = {}
        _audit("cudal1.tolerances", table)
        if not table:
            raise RuntimeError("the audit guard is not installed: no tolerance table")
        return table

    def read_log(self, start: int) -> str:
        sys.stdout.flush()
        sys.stderr.flush()
        with open(self.log_path, "rb") as f:
            f.seek(start)
            return f.read().decode("utf-8", "replace")


def arm_stall_dump(cfg: Any, phase: str) -> None:
    """A phase that stalls leaves every thread's stack in the log (the verdict's stderr_tail)
    shortly before the parent's deadline for that phase kills it, so a timeout says where it
    hung; re-armed at each phase, so a long but moving run dumps nothing."""
    key = {"setup": "setup_timeout_s", "import": "build_timeout_s", "build": "build_timeout_s"}.get(phase, "timeout_s")
    faulthandler.dump_traceback_later(max(1.0, 0.8 * float(getattr(cfg, key))), repeat=True)


def _redirect_output(log_path: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


def worker_entry(spec: WorkerSpec, conn: Any, key_holder: list) -> None:
    """Child entry point (multiprocessing target).  Never returns normally: ``os._exit``.
    ``key_holder`` is a one-element list: the key leaves it for the audit hook's closure, so
    that no frame on the worker's stack (nor ``current_process()._args``) keeps it."""
    for name, value in spec.env.items():
        os.environ[name] = value
    if spec.cwd:
        sys.path[:] = [os.path.abspath(p) for p in sys.path]  # relative entries ('', 'src') keep their meaning
        os.chdir(spec.cwd)
    _redirect_output(spec.log_path)
    arm_stall_dump(spec.config, "setup")
    signing_hook.clear_process_args()
    fd = os.dup(conn.fileno())
    conn.close()
    threads = signing_hook.install(
        key_holder.pop(), fd, candidate_path=spec.candidate_path, bottom=sys._getframe(),
        send=Worker.send, chain=[Worker.phase, Worker.finish, Worker.setup, Worker.import_candidate, Worker.probe_task,
                                 Worker.verify_extraordinary, Worker.run, Worker.lease, Worker.wait_for_lease,
                                 Worker.enter],
        building=Worker.building, register=Worker.import_candidate, tolerances_fn=Worker.tolerances,
        profiled=Worker.kernel_names, tolerances=spec.tolerances)
    try:
        Worker(spec, threads).run()
    except BaseException as exc:  # noqa: BLE001 - the channel itself failed
        print(f"cudal1 worker: internal failure: {exc!r}", file=sys.stderr)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
