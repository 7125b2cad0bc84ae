"""The clean reference worker: everything the verdict rests on, in a process that never imports
candidate code.

Contract: ``reference_entry(spec, conn, key_holder, link)`` is the process's only entry point
(:class:`~cudal1.harness.spec.WorkerSpec`).  It imports the task and builds the reference, draws
every input from the secret seed, computes the reference's outputs and the float64 answers,
compares, and times the reference; the candidate's process (:mod:`cudal1.harness.child.worker`)
is driven over ``link`` and sees only the init inputs, the weights' seed and per-call inputs
(copies in slots).  Each phase (``setup``, ``reference``, ``import``, ``construct``,
``correctness``, ``timing``; ``build`` while the candidate compiles an extension outside its
import; ``lane`` while it waits for the GPU's lease) is announced on a signed channel to the
parent, which enforces the deadlines; the job ends with one ``result`` message, then
``os._exit``.  The worker holds the GPU's lease for the whole job (:mod:`cudal1.harness.lease`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any, Iterator

import torch

from cudal1.harness import window
from cudal1.harness.channel import Sender
from cudal1.harness.faults import is_out_of_memory, runtime_error_parts
from cudal1.harness.kernels import custom_kernels
from cudal1.harness.lease import Lease
from cudal1.harness.numerics import ExactAnswers, ExactReference
from cudal1.harness.process_start import arm_stall_dump, load_module, redirect_output, set_math_mode
from cudal1.harness.proctree import CandidateTree
from cudal1.harness.reference.degenerate import degenerate_reason, fingerprint
from cudal1.harness.reference.link import CandidateGone, CandidateLink
from cudal1.harness.reference.measure import Measurement
from cudal1.harness.reference.outputs import scrub
from cudal1.harness.reference.spans import Spans
from cudal1.harness.reference.verdict import Verdict
from cudal1.harness.slots import SlotPool
from cudal1.harness.spec import PhaseLimits, WorkerSpec, binds_cpu_threads, calls_torch_compile


def _oom_flag(exc: BaseException) -> list[str]:
    return ["oom"] if is_out_of_memory(exc) else []


def classify_runtime(exc: BaseException, phase: str) -> Verdict:
    """An exception of the reference worker's own protocol as a ``runtime_error``."""
    message, flags, tb = runtime_error_parts(exc, phase)
    return Verdict("runtime_error", message, *flags, traceback=tb)


class RefWorker(Measurement):
    def __init__(self, spec: WorkerSpec, sender: Sender, link_conn: Any, page_fd: int | None = None) -> None:
        self.spec = spec
        self.page = window.attach(page_fd) if page_fd is not None else window.cpu_page()  # the candidate's window
        self.cfg = spec.config
        self.limits = PhaseLimits.of(spec.config)
        self.sender = sender
        self.link_conn = link_conn
        self.device = torch.device("cpu")
        self.input_seed = spec.input_seed
        self.current_phase = ""
        self.extra_flags: list[str] = []
        self.degenerate: str | None = None
        self.ref_mod: Any = None
        self.exact: ExactReference | None = None
        self.recheck_limits: dict[str, tuple[float, float]] = {}
        self.answers = ExactAnswers()
        self.reference_spans = Spans()  # where the reference phase's wall goes (information only; run() starts it anew
        # as the phase starts, so its total leaves the set-up out)
        self.lease: Lease | None = None
        self.link: CandidateLink | None = None
        self.resume_phase = ""
        self.resume_lease = "none"
        self.compile_resume = ""  # the phase a torch.compile compile interrupted (on_event)
        self.compile_lease = "none"  # that phase's lease
        self.compile_released = False  # the compile runs without it (EvalConfig.compile_off_lease)
        self.compile_step_lease = "none"  # the lease its GPU steps take: the phase's, exclusive in the first call
        self.in_first_call = False  # inside the candidate's first call (first_call)
        self.exclusive_s = 0.0  # the lease held exclusive before timing (enter)
        self.exclusive_since: float | None = None  # that hold's start (None: not held so)
        self.timing_began = False
        self.autotune_lease = ""  # the lease a Triton autotuner's timings interrupted (on_autotune)

    # ---- protocol ---------------------------------------------------------------------------
    def run(self) -> None:
        result: dict[str, Any] = {}
        phase = "setup"
        try:
            self.phase(phase)
            self.setup()
            ref_mod = self.ref_mod = self.load_reference()
            phase = "reference"
            self.enter(phase, "shared")
            self.reference_spans = Spans()  # the set-up before the phase holds no lease
            span = self.reference_spans.span
            with torch.no_grad():
                with span("construct"):
                    ref_model = self.construct_reference(ref_mod)
                    self.sync()
                with span("exact_model"):
                    self.exact = self.exact_reference(ref_model)
                    self.sync()
                self.probe_task(ref_mod, ref_model)
            result["reference_cost"] = self.reference_spans.as_dict()
            phase = "import"
            self.enter(phase, "none")  # the candidate imports (and builds) on the CPU
            link = self.link = CandidateLink(self.link_conn, SlotPool(self.device, self.spec.slot_dir), self.device,
                                             self.spec.candidate_pid, self.on_event, page=self.page,
                                             tree=CandidateTree(self.spec.candidate_pid, sibling_root=os.getppid()))
            imported = link.read()
            result.update(build_s=imported.get("build_s"), compile_log=str(imported.get("compile_log") or "")[-20000:])
            phase = "construct"
            self.enter(phase, self.construct_lease())
            with torch.no_grad():
                link.construct(self.init_inputs(ref_mod), self.cfg.seed, watch=self.watches_choosers())
            phase = "correctness"
            self.phase(phase)
            with torch.no_grad():
                est, correctness = self.correctness(ref_model, link, self.input_seed, self.cfg.correctness_trials)
                result["correctness"] = correctness
                t_kernels = time.perf_counter()
                kernels = self.kernel_names(link)
                if "cost_ms" in correctness:  # the profiled call naming the kernels: the phase's too
                    correctness["cost_ms"]["kernel_names_ms"] = round((time.perf_counter() - t_kernels) * 1e3, 3)
                if kernels is not None:
                    result["kernels"] = kernels
                    if not custom_kernels(kernels):
                        self.extra_flags.append("no_custom_kernel")
                phase = "timing"
                self.enter(phase, "exclusive")  # nothing else of this judge runs on the GPU now
                timed = self.timing(ref_model, link, est, self.cfg.recheck_fraction)
                timed = self.verify_extraordinary(ref_model, link, est, timed)
                self.check_device_state(link)
                if self.cfg.profile != "off":  # after timing, off the verdict's path (it never raises)
                    from cudal1.harness.reference.profiling import profile_both

                    result["profile"] = profile_both(self, ref_model, link)
            result["timing"] = timed["timing"]
            result["correctness"]["rechecked"] = timed.get("rechecked", 0)
            self.finish("ok", "", self.extra_flags, phase="done", **result)
        except Verdict as v:
            self.finish(v.status, v.message, v.flags, phase=phase, **{**result, **v.extra})
        except CandidateGone as gone:
            self.finish("runtime_error", str(gone), [], phase=phase, candidate_gone=True, **result)
        except BaseException as exc:  # noqa: BLE001 - every failure becomes a verdict
            v = classify_runtime(exc, phase)
            self.finish(v.status, v.message, v.flags, phase=phase, **{**result, **v.extra})
        finally:
            if self.link is not None:
                self.link.resume()
                self.link.close()

    def construct_lease(self) -> str:
        """The lease ``construct`` and ``correctness`` hold: *exclusive* on a GPU for a baseline
        under a torch.compile mode, else *shared*.  Its first call compiles, and torch.compile
        times kernels there to choose among them (max-autotune's kernel choice, matmul padding):
        beside other workers' GPU phases those choices moved baseline figures by 6-21% (H200,
        2026-12-03).  A baseline is what every candidate is compared with, so its choices are made
        on a GPU that nothing else of the judge uses.  A candidate that compiles keeps the shared
        lease (its choices are its own; the exclusive one would hold the GPU through seconds of
        CPU-bound compiling).  With ``EvalConfig.baseline_lease: choosers`` (and compiling off the
        lease) a baseline holds the shared lease as a candidate does, and its first call goes
        exclusive only while a choice is made by timing (:meth:`first_call`)."""
        if self.spec.device == "cuda" and self.spec.mode == "baseline" and calls_torch_compile(self.spec):
            return "shared" if self.cfg.baseline_lease == "choosers" and self.compiles_off_lease() else "exclusive"
        return "shared"

    def phase(self, name: str) -> None:
        self.current_phase = name
        arm_stall_dump(self.limits, name)
        self.sender.send("phase", name=name, t=time.time())

    def enter(self, name: str, lease: str) -> None:
        """Hold the lease as ``lease`` for phase ``name``; the seconds it is held exclusive before
        ``timing`` add up in ``exclusive_s`` (a figure: what this job kept every other one off the GPU
        for while it was not being timed)."""
        assert self.lease is not None
        self.exclusive_s, self.exclusive_since = self.exclusive_held_s(), None
        self.lease.enter(name, lease)
        self.timing_began = self.timing_began or name == "timing"
        if self.lease.held == "exclusive" and not self.timing_began:
            self.exclusive_since = time.perf_counter()

    def exclusive_held_s(self) -> float:
        """``exclusive_s`` with the hold still open counted up to now."""
        since = self.exclusive_since
        return self.exclusive_s + (time.perf_counter() - since if since is not None else 0.0)

    def on_event(self, event: str, data: dict[str, Any]) -> None:
        """The candidate compiles an extension outside its import: that runs under the build
        deadline without the GPU's lease; the interrupted phase resumes once its lease is back.
        torch.compile compiles a graph in ``construct`` or ``correctness`` (its first calls):
        phase ``compile``, under the build deadline with the phase's lease kept (its autotuning
        times kernels), or, with ``EvalConfig.compile_off_lease`` on a GPU and a compile that
        does not autotune, phase ``compile_cpu`` without the lease, which Inductor's own GPU steps
        take back as phase ``compile`` (``compile_gpu``); an autotuning compile gives it back for
        its steps that only wait for compiling elsewhere (``compile_cpu_step``); elsewhere (a
        recompile while timed is the call's own time) nothing changes.  Those events are answered
        once the lease is as they need it: the candidate's process waits for that before it runs
        on."""
        if event in ("compiling", "compile_gpu", "compile_cpu_step", "autotune"):
            on = bool(data.get("on"))
            if event == "compiling":
                self.on_compiling(on, bool(data.get("off_lease")))
            elif event == "compile_gpu":
                if self.compile_released:  # Inductor's GPU steps take the lease back
                    self.compile_holds_lease(on)
            elif event == "compile_cpu_step":
                if not self.compile_released and self.compiles_off_lease() and self.compile_lease != "none":
                    self.compile_holds_lease(not on)  # an autotuning compile waits for compiling elsewhere
            else:
                self.on_autotune(on)
            if self.link is not None:
                self.link.ack()
            return
        if event != "building":
            return
        if data.get("on") and self.current_phase not in ("import", "build"):
            self.resume_phase = self.current_phase
            self.resume_lease = self.lease.held if self.lease else "none"
            self.enter("build", "none")
        elif not data.get("on") and self.current_phase == "build" and self.resume_phase:
            resume, self.resume_phase = self.resume_phase, ""
            self.enter(resume, self.resume_lease)

    def on_compiling(self, on: bool, off_lease: bool) -> None:
        if on and self.current_phase in ("construct", "correctness"):
            self.compile_resume = self.current_phase
            self.compile_lease = self.lease.held if self.lease else "none"
            # a compile inside the first call times its choices (matmul padding's, autotuning's) alone
            alone = self.in_first_call and self.compiles_off_lease() and self.compile_lease == "shared"
            self.compile_step_lease = "exclusive" if alone else self.compile_lease
            self.compile_released = off_lease and self.compiles_off_lease() and self.compile_lease != "none"
            if self.compile_released:
                self.enter("compile_cpu", "none")
            elif self.compile_step_lease != self.compile_lease:
                self.enter("compile", self.compile_step_lease)
            else:
                self.phase("compile")
        elif not on and self.current_phase in ("compile", "compile_cpu") and self.compile_resume:
            resume, self.compile_resume, self.compile_released = self.compile_resume, "", False
            self.enter(resume, self.compile_lease)

    def compiles_off_lease(self) -> bool:
        """Whether compiling may give the GPU's lease back here (``EvalConfig.compile_off_lease`` on a GPU)."""
        return self.cfg.compile_off_lease and self.spec.device == "cuda"

    def compile_holds_lease(self, held: bool) -> None:
        """Inside a compile, between ``compile`` (the interrupted phase's lease) and ``compile_cpu``
        (none): Inductor's GPU steps in a compile off the lease, and the waits of one that keeps it."""
        if held and self.current_phase == "compile_cpu" and self.compile_resume:
            self.enter("compile", self.compile_step_lease)
        elif not held and self.current_phase == "compile":
            self.enter("compile_cpu", "none")

    def watches_choosers(self) -> bool:
        """Whether the candidate's process brackets a request of the current phase ``alone`` where a
        run-time chooser is on in it (:mod:`cudal1.harness.child.choosers`): with
        ``EvalConfig.first_call_lease: choosers`` and ``compile_off_lease`` on a GPU, in a phase that
        holds the lease shared (construct, the first call)."""
        held = self.lease.held if self.lease is not None else "none"
        return self.cfg.first_call_lease == "choosers" and self.compiles_off_lease() and held == "shared"

    @contextlib.contextmanager
    def first_call(self) -> Iterator[bool]:
        """The candidate's first call in ``correctness``, where a program makes its choices by timing
        if it makes any; yields whether the candidate's process watches it for run-time choosers.
        With ``compile_off_lease`` on a GPU those choices are made with nothing else of the judge on
        the GPU, as a baseline's are (a cuDNN-autotuned candidate re-timed at three workers read
        0.849x against 1.000x at two, H200, 2026-12-04): under ``EvalConfig.first_call_lease:
        exclusive`` the whole call holds the lease exclusive; under ``choosers`` it holds the phase's
        and goes exclusive only for them: a run-time chooser on in the candidate's process (watched
        there), an autotuner's timings (``autotune`` events), the GPU steps of a compile inside the
        call.  Compiling inside it still goes off the lease.  Then the phase's own lease again."""
        lease = self.lease.held if self.lease is not None else "none"
        alone = self.compiles_off_lease() and self.current_phase == "correctness" and lease == "shared"
        whole = alone and self.cfg.first_call_lease == "exclusive"
        watch = alone and not whole  # choosers: its process watches it
        if whole:
            self.enter("correctness", "exclusive")
        self.in_first_call = alone
        try:
            yield watch
        finally:
            self.in_first_call = False
            if whole and self.current_phase == "correctness":
                self.enter("correctness", lease)

    def on_autotune(self, on: bool) -> None:
        """A Triton autotuner of the candidate times one of its choices in ``construct`` or
        ``correctness``: with ``EvalConfig.compile_off_lease`` on a GPU (where compiling beside it
        lets other workers time in between), the phase holds the lease exclusive meanwhile, so
        the choice is made with nothing else of the judge on the GPU; then its own lease again."""
        if not self.compiles_off_lease() or self.lease is None:
            return
        if self.current_phase not in ("construct", "correctness"):
            return
        if on and not self.autotune_lease:
            self.autotune_lease = self.lease.held
            if self.autotune_lease != "exclusive":
                self.enter(self.current_phase, "exclusive")
        elif not on and self.autotune_lease:
            lease, self.autotune_lease = self.autotune_lease, ""
            if lease != "exclusive":
                self.enter(self.current_phase, lease)

    def finish(self, status: str, message: str, flags: list[str], **data: Any) -> None:
        # The lease is held until the process exits, after this message.
        if self.link is not None:
            data["slots"] = self.link.transport()
        data["exclusive_s"] = round(self.exclusive_held_s(), 4)
        self.sender.send("result", status=status, message=message, flags=flags, t=time.time(), **data)


    # ---- phases -----------------------------------------------------------------------------
    def setup(self) -> None:
        if self.spec.device == "cuda":
            if not torch.cuda.is_available():
                raise Verdict("runtime_error", "CUDA requested but no GPU is visible to the worker")
            torch.cuda.set_device(0)
            self.device = torch.device("cuda", 0)
        set_math_mode(self.cfg.math_mode)
        if self.spec.device == "cpu" and binds_cpu_threads(self.cfg):
            from cudal1.harness.process_start import bind_threads_for_cpu_timing

            bind_threads_for_cpu_timing()
        self.l2_start = self.persisting_l2()  # before the candidate exists
        self.lease = Lease(self.spec.gpu_lease, self.phase, self.sync, self.release_cached_memory,
                           choices_first=self.cfg.lease_order == "choices-first")
        from cudal1.harness.envinfo import collect_environment

        self.sender.send("env", **collect_environment(self.device))

    def load_reference(self) -> Any:
        try:
            return load_module(self.spec.reference_path, self.spec.reference_module)
        except BaseException as exc:  # noqa: BLE001
            raise Verdict(
                "runtime_error", f"reference failed to import: {type(exc).__name__}: {exc}", "reference_error"
            ) from None

    def init_inputs(self, ref_mod: Any) -> list:
        init = list(ref_mod.get_init_inputs())
        return [x.to(self.device) if isinstance(x, torch.Tensor) else x for x in init]

    def construct_reference(self, ref_mod: Any, seed: int | None = None) -> Any:
        try:
            torch.manual_seed(self.cfg.seed if seed is None else seed)
            return ref_mod.Model(*self.init_inputs(ref_mod)).to(self.device)
        except BaseException as exc:  # noqa: BLE001
            raise Verdict(
                "runtime_error",
                f"reference failed to construct: {type(exc).__name__}: {exc}",
                "reference_error",
                *_oom_flag(exc),
            ) from None

    def probe_task(self, ref_mod: Any, ref_model: Any) -> None:
        """Degenerate-task check and the float64 answers, on the reference alone.  The check is an
        earlier worker's where the parent hands it on (``spec.known_probe``: the same task on the
        same inputs in this batch)."""
        known = self.spec.known_probe
        self.degenerate = known.degenerate if known is not None else self.degenerate_check(ref_mod, ref_model)
        if self.exact is not None:
            cache = self.spec.exact_cache
            trials = self.cfg.correctness_trials
            with self.reference_spans.span("answers"):
                self.answers.prepare(self.exact, [self.input_seed + i for i in range(trials)], self.make_inputs,
                                     cache.path if cache else None, cache.digest if cache else None)
                self.sync()
        self.sender.send("task", degenerate=self.degenerate, exact_digest=self.answers.digest,
                         exact_source=self.answers.source)

    def degenerate_check(self, ref_mod: Any, ref_model: Any) -> str | None:
        """Why the reference's outputs are degenerate on this batch's inputs (None when they are
        not): three inputs, and other weights (:mod:`cudal1.harness.reference.degenerate`)."""
        with self.reference_spans.span("probe"):
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
                    if any(not torch.equal(a, b) for a, b in zip(params, other_params)):
                        other = fingerprint(other_model(*self.make_inputs(self.input_seed)))
                    del other_model, other_params
            except Verdict:
                raise
            except BaseException as exc:  # noqa: BLE001
                raise Verdict("runtime_error", f"reference failed to run: {type(exc).__name__}: {exc}",
                              "reference_error", *_oom_flag(exc)) from None
            self.sync()
        return degenerate_reason(prints, other)

    def kernel_names(self, link: CandidateLink) -> list[str] | None:
        """CUDA kernels of one profiled candidate call (informational; None off CUDA)."""
        if self.device.type != "cuda" or self.spec.mode == "baseline":
            return None
        reply = link.request("profile", inputs=link.stage(self.make_inputs(self.input_seed + 80_000)), targets=[])
        names = reply.get("kernels")
        if not isinstance(names, list):
            return None
        return sorted({str(n)[:300] for n in names})[:200]

    def check_device_state(self, link: CandidateLink) -> None:
        """After timing: no persisting-L2 set-aside or access-policy window (an L2 flush cannot
        evict persisting lines), and whether the candidate fell back to PyTorch."""
        state = link.request("state")
        if state.get("fallback") is True:
            self.extra_flags.append("pytorch_fallback")
        mine = self.persisting_l2()
        limit, start, window = state.get("persisting_l2"), state.get("persisting_l2_start"), state.get("window")
        theirs_changed = isinstance(limit, int) and isinstance(start, int) and limit != start
        if mine != self.l2_start or theirs_changed or (isinstance(window, int) and window > 0):
            raise Verdict("rejected", f"the candidate changed the persisting-L2 limit ({start} -> {limit} bytes in its "
                                      f"process, {self.l2_start} -> {mine} here) or set an access-policy window "
                                      f"({window or 0} bytes)", "persisting_l2")

    def persisting_l2(self) -> int:
        """The device's persisting-L2 limit as this process sees it (0 off CUDA)."""
        from cudal1.harness import cuda_api

        return cuda_api.persisting_l2(self.device.type == "cuda")


def reference_entry(spec: WorkerSpec, conn: Any, key_holder: list, link_conn: Any, page_fd: int | None = None) -> None:
    """Child entry point (multiprocessing target).  Never returns normally: ``os._exit``."""
    for name, value in spec.env.items():
        os.environ[name] = value
    if spec.cwd:
        sys.path[:] = [os.path.abspath(p) for p in sys.path]
        os.chdir(spec.cwd)
    redirect_output(spec.log_path)
    arm_stall_dump(PhaseLimits.of(spec.config), "setup")
    try:
        RefWorker(spec, Sender(conn, key_holder.pop()), link_conn, page_fd).run()
    except BaseException as exc:  # noqa: BLE001 - the channel itself failed
        print(f"cudal1 reference worker: internal failure: {exc!r}", file=sys.stderr)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


__all__ = ["RefWorker", "reference_entry"]
