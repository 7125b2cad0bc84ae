"""Which GPU kernels a candidate launched: custom (its own CUDA/Triton) or library ones.

Informational (flag ``no_custom_kernel``): the published system accepted PyTorch-level
rewrites, and users should see which is which.  Kernel names come from one profiled forward in
the worker (CUDA only).  Library kernels are recognised by name: ATen/c10/CUB/Thrust
namespaces, cuBLAS/cuBLASLt/CUTLASS/cuDNN/nvjet names, memcpy/memset, and Triton kernels that
Inductor generated (``triton_poi_``, ``triton_red_``, ``triton_per_``, ``triton_tem_``).
Everything else counts as custom.  A heuristic: a user kernel named like a library one is
misread as library (which can only add a false ``no_custom_kernel``, never hide a cheat).
"""

from __future__ import annotations

import re

_LIBRARY = re.compile(
    r"at::|c10::|cub::|thrust::|cutlass|cublas|cudnn|xmma|^nvjet|^ampere_|^sm\d+_|^volta_|^turing_"
    r"|^Memcpy|^Memset|^triton_(poi|red|per|tem|for)_|^gemv|^gemmk|^gemmSN|^splitKreduce|^dot_kernel"
    r"|^void gemv|^void gemmk|^void splitKreduce|^cudaGraph|^std::",
    re.IGNORECASE,
)


def custom_kernels(names: list[str]) -> list[str]:
    """The names that do not look like library kernels."""
    return [n for n in names if not _LIBRARY.search(n)]
