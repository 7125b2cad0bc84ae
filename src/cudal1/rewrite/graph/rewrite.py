"""The unit of the graph compiler: :class:`Rewrite`, a named rewrite of a traced task graph.

Contract of ``run``: it takes the task's :class:`torch.fx.GraphModule` (shapes and dtypes in
``node.meta["tensor_meta"]``, recorded on the meta device), rewrites it in place and returns one
human-readable note per rewrite; ``[]`` means the pass declined.  The registry of passes is
:data:`cudal1.rewrite.registry.REWRITES`; this module holds only the type so that every pass
module (``passes``, ``triton_fusion``) can build its entries without importing the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch.fx as fx


@dataclass(frozen=True)
class Rewrite:
    name: str  # registry key, as given to --passes and rewrite_task (e.g. "fold-linear")
    description: str  # one line for listings and candidate headers
    run: Callable[["fx.GraphModule"], list[str]]  # rewrites in place; one note per rewrite, [] = declined
