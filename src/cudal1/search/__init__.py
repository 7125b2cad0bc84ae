"""The contrastive optimizer (apps layer): :func:`optimize` over tasks with any policy."""

from cudal1.search.config import SearchConfig
from cudal1.search.loop import optimize, reference_candidate

__all__ = ["SearchConfig", "optimize", "reference_candidate"]
