"""Marks torch.compile's compiling inside a call, so the reference worker can stamp it as phase
``compile``: it runs under the build deadline (``build_timeout_s``) instead of a call's
(``timeout_s``), and its seconds show apart from the call's in ``EvalResult.phase_s``.

Contract: :func:`install` wraps ``torch._inductor.compile_fx.compile_fx``, the function Inductor's
backend imports and calls for every graph Dynamo hands it (``torch.compile``'s default backend
and its modes), so that ``notify(True)`` goes out before the outermost call on a thread and
``notify(False)`` after it, however it ends (it calls itself for some graphs: only the outermost
call is marked).  The lease stays the phase's own (docs/harness.md, "Several workers per GPU"):
Inductor's autotuning times kernels while it compiles.  Compiling through another backend, or
code that replaces the function again, goes unmarked and runs under the call's deadline as
before.  Installing twice is a no-op.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

_MARK = "_cudal1_marks_compiling"


def install(notify: Callable[[bool], None]) -> bool:
    """Wrap Inductor's ``compile_fx`` (imported here if it is not yet); False when already wrapped."""
    import torch._inductor.compile_fx as compile_fx_module

    inner = compile_fx_module.compile_fx
    if getattr(inner, _MARK, False):
        return False
    depth = threading.local()

    @functools.wraps(inner)
    def compile_fx(*args: Any, **kwargs: Any) -> Any:
        level = getattr(depth, "n", 0)
        depth.n = level + 1
        if level == 0:
            notify(True)
        try:
            return inner(*args, **kwargs)
        finally:
            depth.n = level
            if level == 0:
                notify(False)

    setattr(compile_fx, _MARK, True)
    compile_fx_module.compile_fx = compile_fx
    return True
