"""Failed-build memo for extensions built by candidate code (runs inside the worker).

An identical candidate must never be built twice — failed builds included: a candidate whose
``load_inline`` fails inside ``try/except`` (then falls back to PyTorch) would otherwise pay the
full nvcc time again on every evaluation.  :func:`install` wraps
``torch.utils.cpp_extension.load_inline`` and ``load`` so that a failure is remembered in the
build directory (which is already keyed by the candidate's source and toolchain) and replayed
as the same exception text on the next call with the same extension name.  It also records
that a build failed, so the verdict can carry ``pytorch_fallback`` when the candidate went on
without its kernel.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Callable

_MARKER = ".cudal1_build_failed"
failed_builds: list[str] = []


def _marker(name: str) -> Path | None:
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(root) / name / _MARKER if root and name else None


def _memoize(fn: Callable[..., Any], building: Callable[[bool], None]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        name = str(kwargs.get("name", args[0] if args else ""))
        marker = _marker(name)
        if kwargs.get("build_directory") is None and marker is not None and marker.is_file():
            failed_builds.append(name)
            raise RuntimeError(f"Error building extension '{name}' (cached failure): " + marker.read_text()[-8000:])
        building(True)  # a build inside ModelNew.__init__ runs under the build deadline
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            failed_builds.append(name)
            if kwargs.get("build_directory") is None and marker is not None and "Error building extension" in str(exc):
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.write_text(str(exc)[-20000:])
            raise
        finally:
            building(False)

    return wrapper


def install(building: Callable[[bool], None] = lambda on: None) -> None:
    """Wrap the extension loaders; ``building(True/False)`` is told when a build starts/ends."""
    from torch.utils import cpp_extension

    for attr in ("load_inline", "load"):
        original = getattr(cpp_extension, attr)
        if not getattr(original, "_cudal1_memo", False):
            wrapped = _memoize(original, building)
            wrapped._cudal1_memo = True  # type: ignore[attr-defined]
            setattr(cpp_extension, attr, wrapped)
