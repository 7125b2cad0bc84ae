"""Runtime guards inside the worker: the judge's world must look the same after candidate code.

Checked after the candidate is imported, after it is constructed and after every call:
- identity of guarded callables (clocks, synchronisation, events, RNG seeding, comparison and
  copy functions, ``nn.Module.__call__``) — a rebinding is ``tampering``;
- no global ``__torch_function__``/``__torch_dispatch__`` mode left pushed, no trace/profile
  hook installed, ``sys.modules['torch']`` still torch — else ``tampering``;
- numeric settings (TF32, matmul precision, reduced-precision reductions) — a change is
  ``precision_downgrade`` (it would silently change the reference's math too).

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


def math_flags() -> dict[str, Any]:
    """Global numeric settings a candidate must not change."""
    return {
        "matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_tf32": torch.backends.cudnn.allow_tf32,
        "fp32_precision": torch.get_float32_matmul_precision(),
        "fp16_reduced": torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "bf16_reduced": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
    }


class RuntimeGuard:
    """Snapshot at construction (before any candidate code); ``violation()`` compares."""

    def __init__(self) -> None:
        import torch._dynamo  # noqa: F401 - importing Dynamo rebinds torch.manual_seed; snapshot after it
        self.callables = {f"{m}.{a}": _resolve(m, a) for m, a in _GUARDED}
        self.math = math_flags()
        self.torch_module = sys.modules.get("torch")

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


def settle_s() -> float:
    """How long to wait before re-reading an output to see whether something still writes it."""
    return 0.02


_sleep = time.sleep
