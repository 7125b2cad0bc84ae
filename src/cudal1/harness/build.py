"""Build cache keys and ahead-of-time candidate builds.

Contract: a candidate's ``load_inline`` extensions are built in ``<cache>/builds/<key>`` where
``key`` hashes the candidate source, torch and CUDA versions, the target architectures and the
Python version, so an identical candidate is never built twice (across runs too) and two
different candidates never share a directory.  ``TORCH_EXTENSIONS_DIR`` and
``TORCH_CUDA_ARCH_LIST`` are set identically for the CPU pre-build and the GPU worker, so the
GPU worker finds the pre-built library and ninja has nothing to do.

Pre-building imports the candidate in a sandboxed CPU child with no GPU visible.  Extensions
built lazily inside ``ModelNew.__init__`` and Triton kernels (compiled at first launch) are not
pre-built; they are built in the GPU worker, under its import/construct deadlines.
"""

from __future__ import annotations

import functools
import importlib.metadata
import platform
from pathlib import Path

from cudal1 import __version__
from cudal1.types import Candidate, content_hash

_BUILD_MARKERS = ("load_inline", "cpp_extension", "torch.utils.cpp_extension")


def needs_build(candidate: Candidate) -> bool:
    """Whether the source compiles C++/CUDA extensions (cheap textual check, no execution)."""
    return any(marker in candidate.source for marker in _BUILD_MARKERS)


@functools.lru_cache(maxsize=1)
def toolchain_id() -> str:
    """torch + CUDA + Python versions, read without importing torch where possible."""
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "none"
    try:
        import torch

        cuda = str(torch.version.cuda)
    except ImportError:
        cuda = "none"
    return f"torch={torch_version};cuda={cuda};py={platform.python_version()};cudal1={__version__}"


def build_dir(cache_root: Path, candidate: Candidate, arch_list: str) -> Path:
    key = content_hash("build", candidate.source, toolchain_id(), arch_list)[:24]
    return cache_root / "builds" / key


def has_built_library(path: Path) -> bool:
    return path.is_dir() and any(path.rglob("*.so"))
