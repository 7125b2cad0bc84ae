"""The candidate's process: imports (and builds) the candidate, constructs it, and runs the calls
the clean reference worker asks for.  Nothing it reports is trusted.

Contract: ``candidate_entry(spec, conn, key_holder, link)`` is the process's only entry point.
It redirects output to ``spec.log_path``, confines the process (:mod:`.confine`: an unprivileged
uid, no ptrace, own HOME/TMPDIR, writes only to its build directory, no network, as far as the OS
allows), installs the audit hook (:mod:`cudal1.harness.child.signing_hook`: frames, ``gc``, the
parent channel's signer), then imports the candidate.  In ``build`` mode that is all: one signed
``result`` goes to the parent.  Otherwise it serves the reference worker on ``link`` (requests
and replies are JSON; tensors live in the reference worker's slots): ``construct`` here, the
calls in :mod:`.calls`, and ``exit``.  Every reply either carries what was asked or a ``verdict`` that can
only make the candidate's own verdict worse (the reference worker never takes ``ok`` from it).
The candidate gets private copies of its inputs, never the slots; its outputs are copied into
the reference's output slots after the call (and after the timer stopped).  The in-process
checks (thread inventory, runtime guard, lazy outputs, input mutation, outputs that change
after return) stay here as the second line that names a cheat.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib.util
import json
import os
import sys
import time
from typing import Any

import torch

from cudal1.harness import compare as cmp
from cudal1.harness.child import signing_hook
from cudal1.harness.child.calls import MAX_REQUEST_BYTES, CallHandlers
from cudal1.harness.child.refusal import Refusal, runtime_refusal
from cudal1.harness.child.runtime_guard import RuntimeGuard, _sleep, settle_s
from cudal1.harness.process_start import arm_stall_dump, load_module, redirect_output, set_math_mode
from cudal1.harness.proctree import become_subreaper
from cudal1.harness.slots import SlotMap
from cudal1.harness.spec import CandidateSpec, calls_torch_compile, names_triton
from cudal1.harness.timer import make_timer
from cudal1.harness.wire import decode_inputs, encode_outputs

_perf = time.perf_counter
_audit = sys.audit  # captured before candidate code runs
_dumps = json.dumps
_THREAD_GRACE_S = 0.1  # a thread seen right after a call gets this long to finish (its writes are watched)
BUILD_NICENESS = 10  # a pre-build's niceness (it and its compilers yield to the processes being timed)


class CandidateProcess(CallHandlers):
    def __init__(
        self, spec: CandidateSpec, link: Any, threads: Any = None, confinement: dict[str, Any] | None = None,
        log_fd: int | None = None, page_fd: int | None = None,
    ) -> None:
        self.spec = spec
        self.page_fd = page_fd  # the clean window's shared page (cudal1.harness.window)
        self.page: Any = None
        self.timed_calls = 0
        self.last_key: tuple[int, ...] = (0, 0, 0, 0)  # CPU: the key of the last timed call
        self.log_fd = log_fd  # the log, opened for reading before the process lost the right to
        self.confinement = confinement or {}
        self.settings = spec.settings
        self.link = link
        self.threads = threads or (lambda: [])
        self.device = torch.device("cpu")
        self.guard: RuntimeGuard | None = None
        self.model: Any = None
        self.slots: SlotMap | None = None
        self.timer: Any = None
        self.log_path = spec.log_path
        self.in_build = False
        self.alone_depth = 0  # open brackets asking for the exclusive lease (autotuners', the choosers' watch)
        self.choosers: Any = None  # the run-time choosers' watch (:mod:`.choosers`), on a GPU

    # ---- protocol ---------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self.setup()
            model_new = self.import_candidate()
        except Refusal as r:
            if self.spec.mode == "build":
                self.finish(r.status, r.message, r.flags, **r.extra)
            else:
                self.reply(r.as_reply())
            return
        if self.spec.mode == "build":
            self.finish("ok", "built", [])
            return
        self.serve(model_new)

    def serve(self, model_new: Any) -> None:
        handlers = {"construct": self.construct, "call": self.call, "warmup": self.warmup, "time": self.time_one,
                    "reuse": self.reuse, "profile": self.profile, "kernel_profile": self.kernel_profile,
                    "state": self.state, "seal": self.seal}
        while True:
            faulthandler.cancel_dump_traceback_later()  # idle between requests is not a stall
            try:
                request = json.loads(self.link.recv_bytes(MAX_REQUEST_BYTES))
            except (EOFError, OSError):
                return
            op = request.get("op")
            arm_stall_dump(self.settings.limits, str(op))  # a request that hangs leaves its stacks in the log
            if op == "exit":
                return
            try:
                try:
                    self.slots.update(request.get("slots") or [])  # type: ignore[union-attr]
                except Exception as exc:  # noqa: BLE001 - e.g. an IPC handle of another uid: the clean side re-stages
                    self.reply({"slot_error": f"{type(exc).__name__}: {exc}"[:500]})
                    continue
                with self.watched(request):
                    reply = handlers[op](request, model_new)
            except Refusal as r:
                reply = r.as_reply()
            except BaseException as exc:  # noqa: BLE001 - every failure becomes a reply
                reply = runtime_refusal(exc, str(request.get("where") or op)).as_reply()
            self.reply(reply)

    def reply(self, data: dict[str, Any]) -> None:
        self.link.send_bytes(_dumps(data, default=str).encode())

    def notify(self, event: str, **data: Any) -> None:
        self.reply({"event": event, **data})

    def send(self, kind: str, **data: Any) -> None:
        """A message to the parent on the signed channel (the audit hook signs it only on the
        judge's own call chain)."""
        _audit("cudal1.channel", kind, _dumps(data, default=str))

    def finish(self, status: str, message: str, flags: list[str], **data: Any) -> None:
        """Build mode's one result, to the parent."""
        self.send("result", **{"phase": "import", **data, "status": status, "message": message, "flags": flags,
                               "t": time.time()})

    def building(self, on: bool) -> None:
        """A ``load_inline`` build started (or ended) outside the import: the reference worker
        gives it the build deadline."""
        self.in_build = on
        if self.spec.mode != "build":
            arm_stall_dump(self.settings.limits, "build" if on else "construct")
            self.notify("building", on=on)

    def compiling(self, on: bool, off_lease: bool = False) -> None:
        """torch.compile started (or ended) compiling a graph (:mod:`.compiling`): the reference
        worker gives it the build deadline and, for a compile that may run ``off_lease``, gives
        the GPU's lease back until it ends.  Work this process queued is drained first; the
        compiled graph runs only once the worker has answered (its lease is back)."""
        arm_stall_dump(self.settings.limits, "compile" if on else "construct")
        self.lease_event("compiling", on, drain=on and off_lease, off_lease=off_lease)

    def compile_gpu(self, on: bool) -> None:
        """Inductor runs kernels of its own inside a compile off the lease (:data:`.compiling.GPU_STEPS`):
        they start once the worker holds the lease again, which it gives back after they drained."""
        self.lease_event("compile_gpu", on, drain=not on)

    def compile_cpu(self, on: bool) -> None:
        """A compile that keeps its lease only waits for compiling elsewhere (:data:`.compiling.CPU_STEPS`):
        the reference worker gives the lease back (with ``EvalConfig.compile_off_lease``) once this
        process's work has drained, and takes it again before the compile runs on."""
        self.lease_event("compile_cpu_step", on, drain=on)

    def autotune_alone(self, on: bool) -> None:
        """A choice made by timing (a Triton or Inductor autotuner's, :data:`.compiling.AUTOTUNE_STEPS`;
        a watched request with a run-time chooser on, :mod:`.choosers`) starts once the reference
        worker holds the lease exclusive, which it shares again after the timings drained.  The
        brackets nest: only the outermost one's ends go out."""
        from cudal1.harness.child.compiling import LINE

        with LINE:
            self.alone_depth += 1 if on else -1
            if self.alone_depth == (1 if on else 0):
                self.lease_event("autotune", on, drain=not on)

    def watched(self, request: dict[str, Any]) -> Any:
        """The request's bracket for run-time choosers: the reference worker marks the requests it
        wants watched (``watch``: the candidate's construction and first call, under
        ``EvalConfig.first_call_lease: choosers``)."""
        if self.choosers is None or not request.get("watch"):
            return contextlib.nullcontext()
        return self.choosers.request(True)

    def lease_event(self, event: str, on: bool, drain: bool, **data: Any) -> None:
        """Tell the reference worker ``event`` (with this process's GPU work drained first where
        ``drain``: the lease is about to be given back or narrowed) and wait for its answer, which
        comes once it acted on the lease."""
        if drain and self.device.type == "cuda":
            torch.cuda.synchronize()
        self.notify(event, on=on, **data)
        request = json.loads(self.link.recv_bytes(MAX_REQUEST_BYTES))
        if not isinstance(request, dict) or request.get("op") != "ack":
            raise RuntimeError("the judge's line is out of step: an acknowledgement was expected")

    # ---- phases -----------------------------------------------------------------------------
    def setup(self) -> None:
        if self.spec.device == "cuda" and self.spec.mode != "build":
            if not torch.cuda.is_available():
                raise Refusal("runtime_error", "CUDA requested but no GPU is visible to the candidate's process")
            torch.cuda.set_device(0)
            self.device = torch.device("cuda", 0)
        set_math_mode(self.settings.math_mode)
        if self.spec.device == "cpu" and self.spec.mode != "build" and self.settings.bind_cpu_threads:
            from cudal1.harness.process_start import bind_threads_for_cpu_timing

            self.confinement["cpu_binding"] = bind_threads_for_cpu_timing()
        from cudal1.harness import build

        if self.spec.mode == "build":  # CPU child, no GPU: let candidate code take its GPU (building) path
            build.pretend_gpu()
        build.install_memo(self.building)
        self.slots = SlotMap(self.device)
        if self.spec.mode != "build":
            self.timer = make_timer(self.device, self.settings.flush_l2)
            if self.page_fd is not None:
                from cudal1.harness import window

                self.page = window.attach(self.page_fd)
                if self.device.type == "cuda":
                    try:
                        window.map_for_gpu(self.page)
                    except Exception as exc:  # noqa: BLE001 - the judge's own step: say what failed
                        raise Refusal(
                            "runtime_error", f"the timing window's page cannot be mapped for the GPU: {exc}"
                        ) from None
        if self.device.type == "cuda":
            from cudal1.harness.child.choosers import Watch

            self.choosers = Watch(self.autotune_alone)
            self.choosers.install()  # before the candidate's code: its setters are the wrapped ones
        self.l2_start = self.persisting_l2()  # the device's own setting (nonzero by default on some GPUs)
        self.guard = RuntimeGuard()
        self.guard.watch_worker(self)
        from cudal1.harness.envinfo import collect_environment

        self.send("env", **collect_environment(self.device), isolation=self.confinement)

    def import_candidate(self) -> Any:
        arm_stall_dump(self.settings.limits, "import")
        start = self.log_size()
        t0 = _perf()
        try:
            model_new = None
            if self.spec.mode in ("baseline", "build"):  # the wrapped reference; the pre-build tail constructs with it
                load_module(self.spec.reference_path, self.spec.reference_module)
            compiles = calls_torch_compile(self.spec)
            if compiles:
                import torch._inductor.compile_fx  # noqa: F401 - seconds: here no GPU lease is held, in construct one is
            cuda = self.device.type == "cuda"
            off_lease = cuda and self.settings.compile_off_lease
            # Off the lease, Triton's compiles are marked too: a candidate's kernels', and Inductor's
            # autotuning at run time (under torch.compile).
            triton = (off_lease and (compiles or names_triton(self.spec))
                      and importlib.util.find_spec("triton") is not None)
            if self.spec.mode != "build" and (compiles or triton):
                from cudal1.harness.child import compiling

                compiling.install(self.compiling, self.compile_gpu if cuda else None, torch_compile=compiles,
                                  triton=triton, cpu=self.compile_cpu if off_lease else None,
                                  alone=self.autotune_alone if off_lease else None,
                                  release_autotuning=off_lease and self.settings.autotune_off_lease)
            if self.spec.mode != "baseline":
                path, name = self.spec.candidate_path, self.spec.candidate_module
                spec = importlib.util.spec_from_file_location(name, path)
                if spec is None or spec.loader is None:
                    raise ImportError(f"cannot import {path}")
                module = importlib.util.module_from_spec(spec)
                _audit("cudal1.candidate", module.__dict__)  # the audit guard attributes this module's frames
                sys.modules[name] = module  # type: ignore[index]
                spec.loader.exec_module(module)
                model_new = getattr(module, "ModelNew", None)
                if model_new is None or not isinstance(model_new, type):
                    raise ImportError("the candidate defines no class ModelNew")
        except Refusal:
            raise
        except BaseException as exc:  # noqa: BLE001 - import/build failures are compile errors
            log = self.user_paths(self.read_log(start))
            detail = self.user_paths(f"{type(exc).__name__}: {exc}")
            is_build = "Error building extension" in detail or "CalledProcessError" in detail
            raise Refusal("compile_error", detail[:4000], compile_log=(log + "\n" + detail)[-20000:],
                          build_error=is_build, build_s=_perf() - t0) from None
        build_s, log = _perf() - t0, self.read_log(start)[-20000:]
        self.send("built", build_s=build_s, compile_log=log)
        self.check("import")
        self.settle("import")
        if self.spec.mode != "build":
            self.reply({"imported": True, "build_s": build_s, "compile_log": log})
        return model_new

    def construct(self, request: dict[str, Any], model_new: Any) -> dict[str, Any]:
        init = decode_inputs(request["init"], self.slots, self.private)  # type: ignore[arg-type]
        torch.manual_seed(int(request["seed"]))
        try:
            if self.spec.mode == "baseline":
                from cudal1.harness.baselines import wrap_baseline

                ref_mod = sys.modules[self.spec.reference_module]
                model = ref_mod.Model(*init).to(self.device)
                self.model = wrap_baseline(self.spec.baseline_mode, model, self.device)
            else:
                model = model_new(*init)
                if isinstance(model, torch.nn.Module):
                    model = model.to(self.device)
                self.model = model
        except BaseException as exc:  # noqa: BLE001
            raise runtime_refusal(exc, "construct") from None
        self.check("construct")
        self.settle("construct")
        from cudal1.harness.build import failed_builds

        return {"ok": True, "fallback": bool(failed_builds)}

    # ---- calls ------------------------------------------------------------------------------
    def inputs(self, request: dict[str, Any], key: str = "inputs") -> tuple[list, Any]:
        """(private copies the candidate gets, the slot views they came from)."""
        desc = request[key]
        views = decode_inputs(desc, self.slots, self.on_device)  # type: ignore[arg-type]
        private = decode_inputs(desc, self.slots, self.private)  # type: ignore[arg-type]
        return list(private), views

    def private(self, view: torch.Tensor) -> torch.Tensor:
        """The candidate's own copy of a slot, on its device."""
        return view.to(self.device, copy=True)

    def on_device(self, view: torch.Tensor) -> torch.Tensor:
        """A slot as a tensor on the candidate's device (itself for device slots, a copy for host ones)."""
        return view if view.device == self.device else view.to(self.device)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def run_model(self, args: list) -> tuple[Any, float]:
        self.sync()
        t0 = _perf()
        out = self.model(*args)
        self.sync()
        return out, (_perf() - t0) * 1e3

    def after_call(self, where: str, args: list, views: Any, out: Any, busy: list, full: bool = False,
                   guard: bool = True) -> None:
        """The second line: lazy outputs, guards, input mutation, work that outlives the call.
        ``guard=False`` skips the runtime guard's walk (milliseconds) and the input-mutation check:
        timed calls run them only on the calls whose outputs go back for a re-check (the last
        timed call among them), where the reference worker checks its input slots too."""
        problem = cmp.output_problem(out, self.device.type)
        early = cmp.clone_tree(out) if busy and not problem else None
        if guard:
            self.check(where)
            if not cmp.tensors_equal(args, list(views)):
                raise Refusal("rejected", f"{where}: the candidate modified its inputs", "input_mutation")
        if problem:
            raise Refusal("rejected", f"{where}: {problem}", "lazy_output")
        self.settle(where, out, full=full, busy=busy, snapshot=early)

    def outputs(self, out: Any, request: dict[str, Any]) -> dict[str, Any]:
        desc = encode_outputs(out, request.get("targets") or [], self.slots, self.device.type)  # type: ignore[arg-type]
        self.sync()
        return desc

    # ---- second-line checks -----------------------------------------------------------------
    def check(self, where: str) -> None:
        found = self.guard.violation() if self.guard else None
        if found:
            raise Refusal("rejected", f"after {where}: {found[1]}", found[0])

    def settle(self, where: str, out: Any = None, full: bool = False, busy: list | None = None,
               snapshot: Any = None) -> None:
        """Nothing may still be working for the call after it returned: no thread running
        candidate code (or a C callable handed to a thread or pool, or a pending Timer), and,
        for ``full`` checks or when such a thread is seen, an output that stays the same for
        ``settle_s()``.  Honest code pays one inventory; only a suspicious thread costs a wait."""
        if busy is None:
            busy = self.threads()
        if not busy and not full:
            return
        if snapshot is None and out is not None:
            snapshot = cmp.clone_tree(out)
        deadline = _perf() + max(settle_s(), _THREAD_GRACE_S)
        if full:
            _sleep(settle_s())
            busy = self.threads()
        while busy and _perf() < deadline:
            _sleep(0.0005)
            busy = self.threads()
        self.sync()
        if snapshot is not None and not cmp.tensors_equal(out, snapshot):
            raise Refusal("rejected", f"{where}: the output changed after forward returned", "side_stream")
        if busy:
            what = "; ".join(desc for _, desc in busy[:3])
            raise Refusal("rejected", f"{where}: a thread was still working for the candidate "
                                      f"{max(settle_s(), _THREAD_GRACE_S) * 1e3:.0f} ms after it returned ({what})",
                          "side_stream")

    def user_paths(self, text: str) -> str:
        """``text`` naming the candidate's file as the user knows it, not the staged copy."""
        staged, shown = self.spec.candidate_path, self.spec.display_name
        return text.replace(staged, shown) if staged and shown else text

    def log_size(self) -> int:
        return os.fstat(self.log_fd).st_size if self.log_fd is not None else os.path.getsize(self.log_path)

    def read_log(self, start: int) -> str:
        sys.stdout.flush()
        sys.stderr.flush()
        if self.log_fd is None:
            with open(self.log_path, "rb") as f:
                f.seek(start)
                return f.read().decode("utf-8", "replace")
        chunks = []
        while True:
            chunk = os.pread(self.log_fd, 1 << 20, start)
            if not chunk:
                return b"".join(chunks).decode("utf-8", "replace")
            chunks.append(chunk)
            start += len(chunk)


def _confine(spec: CandidateSpec) -> dict[str, Any]:
    """Apply the spec's confinement (an empty policy: none); the report goes to the parent."""
    if not spec.confine:
        return {}
    try:
        from cudal1.harness.child.confine import ConfinePolicy, confine
    except ImportError:
        return {"confinement": "unavailable"}
    try:
        return confine(ConfinePolicy(**spec.confine)).as_dict()
    except Exception as exc:  # noqa: BLE001 - misuse or a half-applied policy: say so, never run unconfined silently
        print(f"cudal1: confinement failed: {exc!r}", file=sys.stderr)
        os._exit(3)


def candidate_entry(spec: CandidateSpec, conn: Any, key_holder: list, link: Any, page_fd: int | None = None) -> None:
    """Child entry point (multiprocessing target).  Never returns normally: ``os._exit``.
    A pre-build (``build`` mode) is background work: it and its compilers run at
    ``BUILD_NICENESS``, so the two processes of a job being timed on the same host get the CPU
    first (their host wake-ups after each timed call are part of what the parent compares)."""
    if spec.mode == "build":
        try:
            os.nice(BUILD_NICENESS)
        except OSError:
            pass
    for name, value in spec.env.items():
        os.environ[name] = value
    if spec.cwd:
        sys.path[:] = [os.path.abspath(p) for p in sys.path]  # relative entries keep their meaning
        os.chdir(spec.cwd)
    redirect_output(spec.log_path)
    log_fd = os.open(spec.log_path, os.O_RDONLY)  # an unprivileged uid may not open the parent's file
    signing_hook.clear_process_args()
    subreaper = become_subreaper()  # before candidate code: whatever it starts stays in this tree
    confinement = _confine(spec)  # before any other thread exists (the stall dump starts one)
    confinement["subreaper"] = "applied" if subreaper else "refused"
    arm_stall_dump(spec.settings.limits, "setup")
    fd = os.dup(conn.fileno())
    conn.close()
    threads = signing_hook.install(
        key_holder.pop(), fd, candidate_path=spec.candidate_path, bottom=sys._getframe(), send=CandidateProcess.send,
        chain=[CandidateProcess.finish, CandidateProcess.setup, CandidateProcess.import_candidate, CandidateProcess.run,
               CandidateProcess.serve],
        register=CandidateProcess.import_candidate)
    try:
        CandidateProcess(spec, link, threads, confinement, log_fd, page_fd).run()
    except BaseException as exc:  # noqa: BLE001 - the channel itself failed
        print(f"cudal1 candidate process: internal failure: {exc!r}", file=sys.stderr)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
