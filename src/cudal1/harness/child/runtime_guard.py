"""Runtime guards inside the candidate's process: the judge's world there must look the same after
candidate code (a second line: the verdict itself is decided in the clean reference worker).

Checked after the candidate is imported, after it is constructed and after every call:
- identity of guarded callables (clocks, synchronisation, events, RNG seeding, comparison and
  copy functions, ``nn.Module.__call__``) — a rebinding is ``tampering``;
- no global ``__torch_function__``/``__torch_dispatch__`` mode left pushed, no trace/profile
  hook installed, ``sys.modules['torch']`` still torch — else ``tampering``;
- numeric settings (TF32, matmul precision, reduced-precision reductions) — a change is
  ``precision_downgrade`` (it would silently change the reference's math too);
- the worker object itself: no instance attribute shadowing one of its methods, its thread
  inventory and job unchanged (``tampering``); no signal handler defined by the candidate
  (a Python signal handler receives the interrupted frame without any audited call).

These checks run *after* the fact; what must be stopped before it happens (obtaining frames,
walking ``gc``, signing a message) is the audit hook's job (:mod:`cudal1.harness.child.signing_hook`).

Limits: identity checks catch rebinding, not in-place mutation of a function's ``__code__``
of pure-Python helpers we do not list, nor anything native code does.
"""

from __future__ import annotations

import importlib
import sys
import time
from typing import Any

import torch

_GUARDED: list[tuple[str, str]] = [
    ("time", "perf_counter"), ("time", "perf_counter_ns"), ("time", "time"), ("time", "monotonic"),
    ("time", "sleep"),
    ("torch.cuda", "synchronize"), ("torch.cuda", "Event"), ("torch.cuda", "current_stream"),
    # what those call: rebinding torch._C's binding would turn the judge's device-wide joins into no-ops
    ("torch._C", "_cuda_synchronize"), ("torch._C", "_cuda_getCurrentStream"), ("torch._C", "_cuda_getDefaultStream"),
    ("torch._C", "_cuda_setStream"),
    ("torch.cuda.Event", "record"), ("torch.cuda.Event", "elapsed_time"), ("torch.cuda.Event", "synchronize"),
    ("torch", "allclose"), ("torch", "equal"), ("torch", "isnan"), ("torch", "isinf"), ("torch", "abs"),
    ("torch", "where"), ("torch", "manual_seed"), ("torch.cuda", "manual_seed_all"), ("torch", "randn"),
    ("torch", "rand"), ("torch", "randint"), ("torch", "empty"), ("torch", "clone"),
    ("torch.Tensor", "clone"), ("torch.Tensor", "copy_"), ("torch.Tensor", "__eq__"), ("torch.Tensor", "to"),
    ("torch.Tensor", "fill_"), ("torch.Tensor", "sum"), ("torch.Tensor", "max"), ("torch.Tensor", "item"),
    ("torch.nn.Module", "__call__"), ("random", "seed"),
]


def _resolve(module: str, attr: str) -> Any:
    parts = module.split(".")
    obj: Any = importlib.import_module(parts[0])
    for p in parts[1:]:
        obj = getattr(obj, p)
    return obj.__dict__.get(attr, getattr(obj, attr, None)) if isinstance(obj, type) else getattr(obj, attr, None)


_MATH_FLAGS: dict[str, Any] = {
    "matmul_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
    "cudnn_tf32": lambda: torch.backends.cudnn.allow_tf32,
    "fp32_precision": lambda: torch.get_float32_matmul_precision(),
    "fp16_reduced": lambda: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
    "bf16_reduced": lambda: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
    # torch >= 2.9's per-backend API (absent attributes read as None on older versions)
    "fp32_precision_global": lambda: getattr(torch.backends, "fp32_precision", None),
    "matmul_fp32_precision": lambda: getattr(torch.backends.cuda.matmul, "fp32_precision", None),
    "cudnn_fp32_precision": lambda: getattr(torch.backends.cudnn, "fp32_precision", None),
}


def math_flags() -> dict[str, Any]:
    """Global numeric settings a candidate must not change.  A setting that cannot be read (torch
    >= 2.9 refuses to read the legacy TF32 flags once the new ``fp32_precision`` API was used) is
    recorded as ``"unreadable: …"``, which differs from any snapshot and so is reported too."""
    out: dict[str, Any] = {}
    for name, read in _MATH_FLAGS.items():
        try:
            out[name] = read()
        except Exception as exc:  # noqa: BLE001 - an unreadable flag is itself a changed flag
            out[name] = f"unreadable: {type(exc).__name__}"
    return out


# The judge's own methods and the functions it calls from other modules: rebinding them from
# candidate code is tampering too.  (Module-level functions of the judge's comparison modules are
# covered namespace-wide, see _NAMESPACES.)
_JUDGE: list[tuple[str, str]] = [
    ("cudal1.harness.timer.CudaTimer", "time_call"), ("cudal1.harness.timer.CpuTimer", "time_call"),
    ("cudal1.harness.timer.CudaTimer", "spin"), ("cudal1.harness.window.Page", "open"),
    ("cudal1.harness.window.Page", "publish"), ("cudal1.harness.window.GpuKernels", "mask"),
    ("cudal1.harness.window.GpuKernels", "digest"), ("cudal1.harness.window.GpuKernels", "publish"),
    ("cudal1.harness.child.runtime_guard.RuntimeGuard", "violation"),
] + [
    ("cudal1.harness.child.worker.CandidateProcess", n) for n in (
        "call", "time_one", "warmup", "reuse", "state", "profile", "kernel_names", "kernel_profile", "after_call",
        "settle", "check", "inputs", "outputs", "run_model", "sync", "send", "finish", "reply", "serve", "seal",
        "_issued", "_await_key", "_published", "_unmasked")
]
# Namespaces whose every callable is snapshotted (a rebinding of, say, torch.diag would change what
# the candidate's process computes or checks without touching the names listed above).  The judge's
# own modules that run beside the candidate are among them, so a helper added there is guarded
# without a list.
_NAMESPACES = ("torch", "torch.nn.functional", "torch.linalg", "torch.fft", "torch.special", "math", "time",
               "cudal1.harness.compare", "cudal1.harness.wire", "cudal1.harness.slots", "cudal1.harness.timer",
               "cudal1.harness.window")

_tripped: list[str] = []


def _install_tripwires() -> None:
    """Wrap ``gc``'s object-graph walkers: candidate code has no business calling them, and a
    computed name (``getattr(gc, "get_" + "objects")``) reaches the wrapper just the same."""
    import gc

    for name in ("get_objects", "get_referrers", "get_referents"):
        original = getattr(gc, name)
        if getattr(original, "_cudal1_tripwire", False):
            continue

        def wire(*args: Any, _orig: Any = original, _name: str = name, **kwargs: Any) -> Any:
            _tripped.append(f"gc.{_name}")
            return _orig(*args, **kwargs)

        wire._cudal1_tripwire = True  # type: ignore[attr-defined]
        setattr(gc, name, wire)


def _namespace_snapshot() -> dict[tuple[str, str], Any]:
    snap: dict[tuple[str, str], Any] = {}
    for module_name in _NAMESPACES:
        module = importlib.import_module(module_name)
        for key, value in vars(module).items():
            if callable(value) and not isinstance(value, type(sys)):
                snap[(module_name, key)] = value
    for cls in (torch.Tensor, torch._C.TensorBase, torch.nn.Module):
        for key, value in vars(cls).items():
            snap[(cls.__qualname__, key)] = value
    return snap


class RuntimeGuard:
    """Snapshot at construction (before any candidate code); ``violation()`` compares."""

    def __init__(self) -> None:
        import torch._dynamo  # noqa: F401 - importing Dynamo rebinds torch.manual_seed; snapshot after it

        import cudal1.harness.compare  # noqa: F401 - the judge's modules are guarded too

        try:  # torch.compile patches nn.Module.__init__ on first use; let it happen before the snapshot
            from torch._dynamo.mutation_guard import install_generation_tagging_init

            install_generation_tagging_init()
        except (ImportError, AttributeError):
            pass
        _install_tripwires()
        self.callables = {f"{m}.{a}": _resolve(m, a) for m, a in _GUARDED + _JUDGE}
        self.namespaces = _namespace_snapshot()
        self.math = math_flags()
        self.torch_module = sys.modules.get("torch")
        self.reference: list[tuple[str, Any, str, Any]] = []
        self.worker: Any = None
        self.signals = _signal_handlers()

    def watch_worker(self, worker: Any) -> None:
        """Guard the worker object: its methods must not be shadowed on the instance, its
        thread inventory and job must stay as they are (a frame-walking candidate could
        otherwise switch a check off or change the config the protocol reads)."""
        self.worker = worker
        self.worker_threads = worker.threads
        self.worker_job = worker.spec.fingerprint()
        self.worker_methods = {k for cls in type(worker).__mro__[:-1] for k, v in vars(cls).items() if callable(v)}

    def watch_reference(self, ref_module: Any, ref_model: Any) -> None:
        """Guard the reference too: its module's ``Model``/``get_inputs`` and the model's
        ``forward`` (patching them would make the reference slow or its outputs wrong)."""
        for name in ("Model", "get_inputs", "get_init_inputs"):
            self.reference.append((f"reference.{name}", ref_module, name, getattr(ref_module, name, None)))
        self.reference.append(
            ("reference Model.forward", type(ref_model), "forward", type(ref_model).__dict__.get("forward"))
        )
        self.reference_model = ref_model

    def violation(self) -> tuple[str, str] | None:
        """(flag, message) for the first thing that changed, or None."""
        for name, original in self.callables.items():
            module, attr = name.rsplit(".", 1)
            try:
                now = _resolve(module, attr)
            except Exception:  # noqa: BLE001 - a deleted module attribute is a change too
                now = None
            if now is not original:
                return "tampering", f"{name} was replaced"
        if _tripped:
            return "tampering", f"called {_tripped[0]} (walking the judge's objects)"
        for key, original in self.namespaces.items():
            owner = key[0]
            current = self._namespace_value(owner, key[1])
            if current is not original:
                return "tampering", f"{owner}.{key[1]} was replaced"
        for label, owner, attr, original in self.reference:
            current = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr, None)
            if current is not original:
                return "tampering", f"{label} was replaced"
        if self.reference and "forward" in vars(self.reference_model):
            return "tampering", "the reference model's forward was shadowed"
        if self.worker is not None:
            shadowed = self.worker_methods.intersection(vars(self.worker))
            if shadowed:
                return "tampering", f"the worker's {sorted(shadowed)[0]} was shadowed on the instance"
            if self.worker.threads is not self.worker_threads:
                return "tampering", "the worker's thread inventory was replaced"
            if self.worker.spec.fingerprint() != self.worker_job:
                return "tampering", "the process's job (its spec) was modified"
        found = _candidate_signal_handler(self.signals)
        if found:
            return "tampering", found
        if sys.modules.get("torch") is not self.torch_module:
            return "tampering", "sys.modules['torch'] was replaced"
        if torch._C._len_torch_function_stack() or torch._C._len_torch_dispatch_stack():
            return "tampering", "a global torch function/dispatch mode was left active"
        if sys.gettrace() is not None or sys.getprofile() is not None:
            return "tampering", "a trace/profile hook was installed"
        now = math_flags()
        changed = {k: (self.math[k], v) for k, v in now.items() if self.math.get(k) != v}
        if changed:
            what = ", ".join(f"{k}: {a} -> {b}" for k, (a, b) in changed.items())
            return "precision_downgrade", f"global numeric settings changed: {what}"
        return None


    @staticmethod
    def _namespace_value(owner: str, key: str) -> Any:
        classes = {"Tensor": torch.Tensor, "TensorBase": torch._C.TensorBase, "Module": torch.nn.Module}
        if owner in classes:
            return vars(classes[owner]).get(key)
        return vars(sys.modules[owner]).get(key)


def _signal_handlers() -> dict[int, Any]:
    import signal

    out = {}
    for sig in range(1, getattr(signal, "NSIG", 65)):
        try:
            out[sig] = signal.getsignal(sig)
        except (ValueError, OSError):
            continue
    return out


def _candidate_signal_handler(before: dict[int, Any]) -> str:
    """A Python signal handler installed since start-up whose code is not the judge's, torch's
    or the standard library's own (signal handlers receive the interrupted frame)."""
    import signal

    for sig, old in before.items():
        try:
            now = signal.getsignal(sig)
        except (ValueError, OSError):
            continue
        if now is old or not callable(now):
            continue
        module = getattr(now, "__module__", None) or ""
        if not module.startswith(("torch", "triton", "multiprocessing", "concurrent", "asyncio", "cudal1.harness")):
            return f"a Python signal handler was installed for signal {sig} ({module or type(now).__name__})"
    return ""


def settle_s() -> float:
    """How long to wait before re-reading an output to see whether something still writes it."""
    return 0.02


_sleep = time.sleep
