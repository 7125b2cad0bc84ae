"""Marks compiling inside a call (torch.compile's graphs, Triton's kernels), so the reference
worker can stamp it as phase ``compile``: it runs under the build deadline (``build_timeout_s``)
instead of a call's (``timeout_s``), and its seconds show apart from the call's in
``EvalResult.phase_s``.

Contract: :func:`install` wraps ``torch._inductor.compile_fx.compile_fx``, the function Inductor's
backend imports and calls for every graph Dynamo hands it (``torch.compile``'s default backend
and its modes), and, with ``triton=True``, ``triton.compiler.compile``, which every
``@triton.jit`` kernel's first launch (and Inductor's runtime autotuning) compiles through.  One
span covers all compiling in the process, on any thread: ``notify(True, off_lease)`` goes out
when the first compile starts and ``notify(False, off_lease)`` when the last one ends, however it
ends (compiles nested in a compile, such as ``compile_fx`` calling itself or Triton compiling
for Inductor, are inside the span).  A Triton compile on the main thread opens a span only once
it has run :data:`TRITON_GRACE_S` (a kernel found in Triton's cache returns in milliseconds, and
each span costs the lease a round trip); Triton compiles on other threads are left alone.
Compiling through another backend, or code that replaces the functions again, goes unmarked and
runs under the call's deadline as before.  Installing twice is a no-op.

``off_lease`` says the span may run without the GPU's lease (``EvalConfig.compile_off_lease``;
the reference worker decides): true for a Triton compile, and for a graph unless Inductor's
config asks for autotuning (``max_autotune*``, coordinate descent) and the autotuning compile is
not released (``install``'s ``release_autotuning``, ``EvalConfig.autotune_off_lease``, and only
where this torch has every step of :data:`AUTOTUNING_NEEDS`).  The GPU work Inductor does inside
a graph's compile off the lease is bracketed by ``gpu(True)`` and ``gpu(False)`` (the reference
worker takes the interrupted phase's lease back for it: exclusive for a baseline, so an
autotuning baseline's choices are still timed alone): :data:`GPU_STEPS` names it (its
benchmarker's timings, matmul padding's choice, example inputs and kernel selection, the
fused kernels max-autotune times on random inputs to choose its epilogues, constant folding,
freezing, the passes before autograd, which see the module's real parameters) and
:data:`GPU_FIRST_STEPS` what runs once per process (the pattern matcher's first set-up, which
traces its patterns on the device: 48 small copies in the first compile of a convolution with
batch norm, H200, 2026-12-03).  A Triton compile on the main thread inside a GPU step (a fused
kernel's first call) gives the step's lease back once it has run :data:`TRITON_GRACE_S`, and
the step takes it again before it runs on.  Inside a graph's compile that keeps its lease
(autotuning, not released), the
steps that only wait for compiling elsewhere (:data:`CPU_STEPS`: the graph's kernels compiled by
Inductor's worker processes, an autotuned operation's choices compiled on threads) are
bracketed by ``cpu(True)`` and ``cpu(False)``: the reference worker gives the lease back for
them (phase ``compile_cpu``) and the compile's timings run with it again.  With ``alone``, a
Triton autotuner's timing of each choice, and (under ``torch_compile``) an Inductor kernel's
timings of its configs at its first launch (:data:`AUTOTUNE_STEPS`; a launch that times nothing
opens no bracket), outside a span, are
bracketed by ``alone(True)`` and ``alone(False)``: the reference worker holds the lease exclusive
for it, so a candidate's own choices are made on a GPU that nothing else of the judge uses, as a
baseline's are (the first call of each choice compiles inside, off the lease).  A Triton compile
issues no GPU work (the kernel is loaded at its first launch, after the span).  Known limit: GPU work that another
thread of the process issues while a span or a CPU step runs off the lease is not bracketed; the
compiling thread's own queued work is drained before the lease goes.
The callbacks block until the reference worker acknowledges (``cudal1.harness.child.worker``).
"""

from __future__ import annotations

import functools
import importlib
import threading
from typing import Any, Callable

_MARK = "_cudal1_marks_compiling"

# Where Inductor runs kernels of its own while it compiles: (module, attribute path).  Each is
# wrapped where this torch has it; :func:`install` returns which were found.
GPU_STEPS = (
    ("torch._inductor.runtime.benchmarking", "Benchmarker.benchmark_gpu"),
    ("torch._inductor.runtime.benchmarking", "TritonBenchmarker.benchmark_gpu"),
    ("torch._inductor.runtime.benchmarking", "InductorBenchmarker.benchmark_gpu"),
    ("torch._inductor.fx_passes.pad_mm", "should_pad"),
    ("torch._inductor.select_algorithm", "AlgorithmSelectorCache.benchmark_example_value"),
    ("torch._inductor.select_algorithm", "AlgorithmSelectorCache.generate_example_value"),
    ("torch._inductor.select_algorithm", "AlgorithmSelectorCache.benchmark_in_current_process"),
    ("torch._inductor.constant_folding", "constant_fold"),
    ("torch._inductor.freezing", "freeze"),
    ("torch._inductor.fx_passes.joint_graph", "constant_fold_uniform_value"),
    ("torch._inductor.compile_fx", "_recursive_pre_grad_passes"),  # on the real module (conv-bn fusion)
    # max-autotune's epilogue choice: a fused kernel's random inputs, its first call and its timing
    ("torch._inductor.codegen.triton", "TritonScheduling.benchmark_codegened_module"),
    ("torch._inductor.codegen.triton", "TritonScheduling.benchmark_combo_kernel"),
    ("torch._dynamo.testing", "rand_strided"),  # any other random example input made while compiling
)
# What an autotuning compile times on the GPU: without one of these groups (another torch), it keeps
# its lease even where ``release_autotuning`` asks otherwise.
AUTOTUNING_NEEDS = (
    ("torch._inductor.runtime.benchmarking:Benchmarker.benchmark_gpu",
     "torch._inductor.runtime.benchmarking:TritonBenchmarker.benchmark_gpu",
     "torch._inductor.runtime.benchmarking:InductorBenchmarker.benchmark_gpu"),
    ("torch._inductor.select_algorithm:AlgorithmSelectorCache.benchmark_in_current_process",),
    ("torch._inductor.select_algorithm:AlgorithmSelectorCache.benchmark_example_value",),
    ("torch._inductor.codegen.triton:TritonScheduling.benchmark_codegened_module",),
)
# Steps that do GPU work on their first call with given arguments only (cached set-ups): bracketed
# until one call with those arguments has returned, then run as they are.
GPU_FIRST_STEPS = (
    ("torch._inductor.fx_passes.joint_graph", "lazy_init"),  # the pattern matcher's patterns, traced on the device
    ("torch._inductor.fx_passes.post_grad", "lazy_init"),
)
# Where a compile that keeps its lease (an autotuning one) only waits for compiling on other threads
# and processes: (module, attribute path, whether the attribute makes the step instead of being it).
# Bracketed by ``cpu(True)`` and ``cpu(False)``: the reference worker gives the lease back for them.
CPU_STEPS = (
    ("torch._inductor.async_compile", "AsyncCompile.wait", False),  # the graph's kernels, compiled in workers
    ("torch._inductor.select_algorithm", "AlgorithmSelectorCache.make_precompile_fn", True),  # its wait: the
    # autotuning choices, compiled on threads before they are timed
)
# Where a choice is made by timing at run time: a Triton autotuner timing one of its configs, and
# Inductor's compiled kernels timing theirs at their first launch (several configs at once; one config
# at a time, as coordinate descent and a combo kernel's sequential tuning do).  Not Inductor's tuning
# entry points themselves: a kernel that never tunes (a Triton template under max-autotune's
# coordinate descent) calls ``coordinate_descent_tuning`` on every launch and it returns at once
# (torch 2.11), and a bracket's end drains the GPU, so each such launch waited for the device inside
# a timed call (two max-autotune baselines read 0.22x and 2.0x where 1.49x and 3.06x were right, every
# timed call blocked, H200, 2026-12-05).  With ``alone``, bracketed by ``alone(True)`` and
# ``alone(False)`` on the main thread outside a span (the reference worker holds the lease exclusive
# meanwhile, so the choice is made with nothing else of the judge on the GPU); inside a compile the
# compile's own brackets apply; brackets nest (``benchmark_all_configs`` holds one over its timings).
AUTOTUNE_STEPS = (
    ("triton.runtime.autotuner", "Autotuner._bench"),
    ("torch._inductor.runtime.triton_heuristics", "CachingAutotuner.benchmark_all_configs"),
    ("torch._inductor.runtime.triton_heuristics", "CachingAutotuner.bench"),
)
TRITON_COMPILES = (("triton.compiler", "compile"), ("triton.compiler.compiler", "compile"), ("triton", "compile"))
TRITON_GRACE_S = 0.1  # a Triton compile still running after this opens a span off the lease (<= 0: at once)

# Inductor settings under which a compile times kernels throughout (its lease stays held).
_AUTOTUNING = ("max_autotune", "max_autotune_gemm", "max_autotune_pointwise", "coordinate_descent_tuning")
RELEASE_AUTOTUNING = False  # an autotuning compile goes off the lease too (set by :func:`install`)

# One event (and its acknowledgement) on the judge's line at a time, from any thread.
LINE = threading.RLock()


def autotunes(config_patches: Any = None) -> bool:
    """Whether a compile with these patches (and Inductor's current config) autotunes."""
    from torch._inductor import config

    patches = config_patches if isinstance(config_patches, dict) else {}
    return any(bool(patches.get(name, getattr(config, name, False))) for name in _AUTOTUNING)


def autotuning_covered(found: list[str]) -> bool:
    """Whether the steps ``found`` (as :func:`install` returns them) bracket every GPU step of an
    autotuning compile that :data:`AUTOTUNING_NEEDS` names."""
    return all(any(step in found for step in group) for group in AUTOTUNING_NEEDS)


def _marked(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, marked as cudal1's wrapper (installing again leaves it alone)."""
    setattr(fn, _MARK, True)
    return fn


class _Bracket:
    """A counted bracket on the judge's line: ``mark(True)`` as the first of its steps starts (on
    any thread), ``mark(False)`` as the last one ends, however it ends; no ``mark``: no bracket."""

    def __init__(self, mark: Callable[[bool], None] | None) -> None:
        self.mark = mark
        self.active = 0
        self.paused = False  # inside the bracket, its lease given back for a compile (:meth:`pause`)

    def run(self, applies: bool, inner: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.mark is None or not applies:
            return inner(*args, **kwargs)
        with LINE:
            if self.active == 0:
                self.mark(True)  # returns once the lease is as the step needs it
            elif self.paused:  # another thread's step needs the lease that a compile gave back
                self.paused = False
                self.mark(True)
            self.active += 1
        try:
            return inner(*args, **kwargs)
        finally:
            with LINE:
                self.active -= 1
                if self.active == 0:
                    if self.paused:
                        self.paused = False
                    else:
                        self.mark(False)

    def pause(self) -> None:
        """Give the bracket's lease back while it is open (a compile inside it issues no GPU work)."""
        with LINE:
            if self.mark is not None and self.active and not self.paused:
                self.paused = True
                self.mark(False)

    def resume(self) -> None:
        """Take the lease back after :meth:`pause`, if the bracket is still open and paused."""
        with LINE:
            if self.mark is not None and self.active and self.paused:
                self.paused = False
                self.mark(True)


class _Steps:
    """The steps' brackets: GPU steps (``gpu``) only inside a span that runs off the lease, CPU
    steps (``cpu``) only inside a span that keeps it, autotuning steps (``alone``) only outside a
    span, on the main thread."""

    def __init__(self, gpu: Callable[[bool], None], cpu: Callable[[bool], None] | None = None,
                 alone: Callable[[bool], None] | None = None) -> None:
        self.gpu, self.cpu, self.alone = _Bracket(gpu), _Bracket(cpu), _Bracket(alone)
        self.off_lease = False  # the current span runs without the lease
        self.held = False  # the current span keeps its lease

    def wrap(self, inner: Callable[..., Any], first_only: bool = False) -> Callable[..., Any]:
        """``inner`` as a GPU step; with ``first_only``, until a call with the same arguments has returned."""
        done: set[str] = set()

        @functools.wraps(inner)
        def step(*args: Any, **kwargs: Any) -> Any:
            key = repr((args, sorted(kwargs.items()))) if first_only else ""
            result = self.gpu.run(self.off_lease and key not in done, inner, *args, **kwargs)
            if first_only:
                done.add(key)
            return result

        return _marked(step)

    def wrap_alone(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        """``inner`` as an autotuning step."""

        @functools.wraps(inner)
        def step(*args: Any, **kwargs: Any) -> Any:
            applies = not (self.off_lease or self.held) and threading.current_thread() is threading.main_thread()
            return self.alone.run(applies, inner, *args, **kwargs)

        return _marked(step)

    def wrap_cpu(self, inner: Callable[..., Any], makes_step: bool = False) -> Callable[..., Any]:
        """``inner`` as a CPU step, or with ``makes_step``, ``inner`` returning its result as one."""
        if not makes_step:
            return _marked(functools.wraps(inner)(
                lambda *args, **kwargs: self.cpu.run(self.held, inner, *args, **kwargs)))

        @functools.wraps(inner)
        def factory(*args: Any, **kwargs: Any) -> Any:
            made = inner(*args, **kwargs)
            if not callable(made):
                return made
            step = self.wrap_cpu(made)
            for name in getattr(made, "__dataclass_fields__", {}):  # a callable object's own data (torch's
                value = getattr(made, name, None)  # PrecompileFunction: the key its cache is cleaned by)
                if not callable(value):
                    setattr(step, name, value)
            return step

        return _marked(factory)


class _Span:
    """All compiling in the process, on any thread: counted, marked once (see the module docstring)."""

    def __init__(self, notify: Callable[[bool, bool], None], steps: _Steps) -> None:
        self.notify, self.steps = notify, steps
        self.active = 0  # compiles running
        self.marked = False  # ``on`` was sent for the current span
        self.off_lease = False
        self.serial = 0  # numbers spans, so a late grace timer leaves a later span alone

    def begin(self, off_lease: bool, mark: bool = True) -> int | None:
        """One compile starts; returns the span's number when it opened the span, else None."""
        with LINE:
            self.active += 1
            if self.active > 1:
                return None
            self.serial += 1
            self.off_lease = off_lease
            if mark:
                self._mark()
            return self.serial

    def mark_late(self, serial: int) -> None:
        """The grace timer: mark the span if it is still the one that started it."""
        with LINE:
            if self.active and self.serial == serial:
                self._mark()

    def _mark(self) -> None:
        if not self.marked:
            self.marked = True
            self.steps.off_lease, self.steps.held = self.off_lease, not self.off_lease
            self.notify(True, self.off_lease)

    def end(self) -> None:
        with LINE:
            self.active -= 1
            if self.active == 0 and self.marked:
                self.marked = False
                self.steps.off_lease = self.steps.held = False
                self.notify(False, self.off_lease)


def _attribute(module_name: str, path: str) -> tuple[Any, str, Any] | None:
    """(owner, name, raw attribute) of ``module:path``, or None where this install lacks it."""
    try:
        owner: Any = importlib.import_module(module_name)
    except Exception:  # noqa: BLE001 - another torch or Triton: it does not exist there
        return None
    *owners, name = path.split(".")
    for part in owners:
        owner = getattr(owner, part, None)
        if owner is None:
            return None
    raw = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    return None if raw is None else (owner, name, raw)


def _wrap_step(module_name: str, path: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    """Replace ``module:path`` (a function, static or class method) by ``wrap`` of it; False where
    this install lacks it or it is wrapped already."""
    found = _attribute(module_name, path)
    if found is None:
        return False
    owner, name, raw = found
    if getattr(raw, _MARK, False) or getattr(getattr(raw, "__func__", None), _MARK, False):
        return False
    if isinstance(raw, staticmethod):
        setattr(owner, name, staticmethod(wrap(raw.__func__)))
    elif isinstance(raw, classmethod):
        setattr(owner, name, classmethod(wrap(raw.__func__)))
    elif callable(raw):
        setattr(owner, name, wrap(raw))
    else:
        return False
    return True


def install(notify: Callable[[bool, bool], None], gpu: Callable[[bool], None] | None = None,
            *, torch_compile: bool = True, triton: bool = False, cpu: Callable[[bool], None] | None = None,
            alone: Callable[[bool], None] | None = None, release_autotuning: bool = False) -> list[str] | None:
    """Wrap Inductor's ``compile_fx`` (imported here if it is not yet) and, with ``gpu``, its GPU
    steps, with ``cpu`` its CPU steps; with ``triton``, Triton's compile (where Triton imports)
    and, with ``alone``, its autotuner's timings.  What one call wraps shares one span.  With
    ``release_autotuning`` (and ``gpu``), an autotuning compile runs off the lease as well, where
    every group of :data:`AUTOTUNING_NEEDS` was wrapped (:data:`RELEASE_AUTOTUNING` says whether).
    Returns the steps wrapped (``module:attribute``), or None when nothing was left to wrap."""
    global RELEASE_AUTOTUNING
    span = _Span(notify, _Steps(gpu or (lambda on: None), cpu, alone))
    found = _install_compile_fx(span, gpu is not None) if torch_compile else None
    if found is not None:
        RELEASE_AUTOTUNING = release_autotuning and gpu is not None and autotuning_covered(found)
    if triton:
        compiles = _install_triton(span)
        tuners = [f"{m}:{p}" for m, p in AUTOTUNE_STEPS if alone is not None
                  and (torch_compile or not m.startswith("torch._inductor"))  # Inductor's: under torch.compile
                  and _wrap_step(m, p, span.steps.wrap_alone)]
        if compiles or tuners:
            found = (found or []) + tuners
    return found


def _install_compile_fx(span: _Span, with_steps: bool) -> list[str] | None:
    import torch._inductor.compile_fx as compile_fx_module

    inner = compile_fx_module.compile_fx
    if getattr(inner, _MARK, False):
        return None
    steps = span.steps
    first = functools.partial(steps.wrap, first_only=True)
    found = [f"{m}:{p}" for m, p in GPU_STEPS if with_steps and _wrap_step(m, p, steps.wrap)]
    found += [f"{m}:{p}" for m, p in GPU_FIRST_STEPS if with_steps and _wrap_step(m, p, first)]
    found += [f"{m}:{p}" for m, p, makes in CPU_STEPS if steps.cpu.mark is not None
              and _wrap_step(m, p, functools.partial(steps.wrap_cpu, makes_step=makes))]

    @functools.wraps(inner)
    def compile_fx(*args: Any, **kwargs: Any) -> Any:
        off_lease = with_steps and (RELEASE_AUTOTUNING or not autotunes(kwargs.get("config_patches")))
        span.begin(off_lease)
        try:
            return inner(*args, **kwargs)
        finally:
            span.end()

    compile_fx_module.compile_fx = _marked(compile_fx)
    return found


def _install_triton(span: _Span) -> list[str]:
    """Wrap each of :data:`TRITON_COMPILES` this Triton has (one function under several names: one
    wrapper); returns them."""
    wrappers: dict[int, Callable[..., Any]] = {}

    def wrap(inner: Callable[..., Any]) -> Callable[..., Any]:
        if id(inner) not in wrappers:
            wrappers[id(inner)] = _triton_compile(span, inner)
        return wrappers[id(inner)]

    return [f"{m}:{p}" for m, p in TRITON_COMPILES if _wrap_step(m, p, wrap)]


def _triton_compile(span: _Span, inner: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(inner)
    def compile(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return inner(*args, **kwargs)
        serial = span.begin(True, mark=TRITON_GRACE_S <= 0)
        gpu = span.steps.gpu
        in_step = serial is None and span.steps.off_lease and gpu.active > 0  # a fused kernel's first call
        late = span.mark_late if serial is not None else gpu.pause if in_step else None
        timer = None
        if late is not None and TRITON_GRACE_S > 0:
            timer = threading.Timer(TRITON_GRACE_S, late, (serial,) if serial is not None else ())
            timer.daemon = True
            timer.start()
        elif in_step:
            gpu.pause()
        try:
            return inner(*args, **kwargs)
        finally:
            if timer is not None:
                timer.cancel()
                timer.join()  # a pause already under way ends before the resume below
            if in_step:
                gpu.resume()
            span.end()

    return _marked(compile)
