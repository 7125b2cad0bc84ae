"""Marks torch.compile's compiling inside a call, so the reference worker can stamp it as phase
``compile``: it runs under the build deadline (``build_timeout_s``) instead of a call's
(``timeout_s``), and its seconds show apart from the call's in ``EvalResult.phase_s``.

Contract: :func:`install` wraps ``torch._inductor.compile_fx.compile_fx``, the function Inductor's
backend imports and calls for every graph Dynamo hands it (``torch.compile``'s default backend
and its modes), so that ``notify(True, off_lease)`` goes out before the outermost call on a thread
and ``notify(False, off_lease)`` after it, however it ends (it calls itself for some graphs: only
the outermost call is marked).  Compiling through another backend, or code that replaces the
function again, goes unmarked and runs under the call's deadline as before.  Installing twice is
a no-op.

``off_lease`` says the compile may run without the GPU's lease (``EvalConfig.compile_off_lease``;
the reference worker decides): true unless Inductor's config asks for autotuning, whose kernel
choices are timed on the GPU throughout the compile (``max_autotune*``, coordinate descent).  The
GPU work Inductor does inside a compile that is not autotuning is bracketed by ``gpu(True)`` and
``gpu(False)`` (the reference worker takes the interrupted phase's lease back for it):
:data:`GPU_STEPS` names it (its benchmarker's timings, matmul padding's choice, example inputs and
kernel selection, constant folding, freezing, the passes before autograd, which see the module's
real parameters).  Known limit (H200, 2026-12-03, ``tests/gpu/test_compile_lease_gpu.py``): a
process's first compile of a convolution with batch norm issued one copy outside these steps, not
attributed yet; that is why ``compile_off_lease`` is off by default.
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
)

# Inductor settings under which a compile times kernels throughout (its lease stays held).
_AUTOTUNING = ("max_autotune", "max_autotune_gemm", "max_autotune_pointwise", "coordinate_descent_tuning")
RELEASE_AUTOTUNING = False  # true: an autotuning compile goes off the lease too (its steps bracketed; a GPU test)


def autotunes(config_patches: Any = None) -> bool:
    """Whether a compile with these patches (and Inductor's current config) autotunes."""
    from torch._inductor import config

    patches = config_patches if isinstance(config_patches, dict) else {}
    return any(bool(patches.get(name, getattr(config, name, False))) for name in _AUTOTUNING)


class _Steps:
    """The GPU steps' bracket: the first step on any thread calls ``gpu(True)``, the last to end
    ``gpu(False)``; only inside a compile that runs off the lease."""

    def __init__(self, gpu: Callable[[bool], None]) -> None:
        self.gpu = gpu
        self.lock = threading.Lock()
        self.active = 0
        self.off_lease = False  # the current outermost compile runs without the lease

    def wrap(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(inner)
        def step(*args: Any, **kwargs: Any) -> Any:
            if not self.off_lease:
                return inner(*args, **kwargs)
            with self.lock:
                if self.active == 0:
                    self.gpu(True)  # counted only once the lease is back
                self.active += 1
            try:
                return inner(*args, **kwargs)
            finally:
                with self.lock:
                    self.active -= 1
                    if self.active == 0:
                        self.gpu(False)

        setattr(step, _MARK, True)
        return step


def _wrap_step(steps: _Steps, module_name: str, path: str) -> bool:
    try:
        owner: Any = importlib.import_module(module_name)
    except Exception:  # noqa: BLE001 - another torch: the step does not exist there
        return False
    *owners, name = path.split(".")
    for part in owners:
        owner = getattr(owner, part, None)
        if owner is None:
            return False
    raw = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    if raw is None or getattr(raw, _MARK, False):
        return False
    if isinstance(raw, staticmethod):
        setattr(owner, name, staticmethod(steps.wrap(raw.__func__)))
    elif isinstance(raw, classmethod):
        setattr(owner, name, classmethod(steps.wrap(raw.__func__)))
    elif callable(raw):
        setattr(owner, name, steps.wrap(raw))
    else:
        return False
    return True


def install(notify: Callable[[bool, bool], None], gpu: Callable[[bool], None] | None = None) -> list[str] | None:
    """Wrap Inductor's ``compile_fx`` (imported here if it is not yet) and, with ``gpu``, its GPU
    steps.  Returns the GPU steps wrapped (``module:attribute``), or None when already installed."""
    import torch._inductor.compile_fx as compile_fx_module

    inner = compile_fx_module.compile_fx
    if getattr(inner, _MARK, False):
        return None
    depth = threading.local()
    steps = _Steps(gpu or (lambda on: None))
    found = [f"{m}:{p}" for m, p in GPU_STEPS if gpu is not None and _wrap_step(steps, m, p)]

    @functools.wraps(inner)
    def compile_fx(*args: Any, **kwargs: Any) -> Any:
        level = getattr(depth, "n", 0)
        depth.n = level + 1
        off_lease = False
        if level == 0:
            off_lease = gpu is not None and (RELEASE_AUTOTUNING or not autotunes(kwargs.get("config_patches")))
            notify(True, off_lease)
            steps.off_lease = off_lease
        try:
            return inner(*args, **kwargs)
        finally:
            depth.n = level
            if level == 0:
                steps.off_lease = False
                notify(False, off_lease)

    setattr(compile_fx, _MARK, True)
    compile_fx_module.compile_fx = compile_fx
    return found
