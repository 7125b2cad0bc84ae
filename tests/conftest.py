"""Shared pytest wiring: the ``gpu`` marker auto-skip, a per-session cache dir, path fixtures.

Markers (``gpu``, ``slow``) are registered in ``pyproject.toml``; nothing else global lives here.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    # caches (builds, graph rewrites) go to a per-session directory, never the user's ~/.cache
    os.environ.setdefault("CUDAL1_CACHE_DIR", tempfile.mkdtemp(prefix="cudal1-test-cache-"))


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items or _cuda_available():  # torch is imported only when a gpu test exists
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is false)")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_dir(repo_root: Path) -> Path:
    path = repo_root.parent / "shared"
    if not path.is_dir():
        pytest.skip(f"shared directory {path} is absent")
    return path
