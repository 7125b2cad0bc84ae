"""cudal1: trustworthy GPU-kernel evaluation and contrastive-RL kernel optimization.

The judge lives in :mod:`cudal1.harness` (front door: :func:`cudal1.harness.evaluate`);
tasks in :mod:`cudal1.tasks`; the SQLite run store in :mod:`cudal1.store`.
"""

__version__ = "0.1.0"
