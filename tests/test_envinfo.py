"""GPU inventory honours CUDA_VISIBLE_DEVICES (so a run can be pinned to some GPUs)."""

from __future__ import annotations

import subprocess

import pytest

from cudal1.harness import envinfo

FAKE = "0, NVIDIA H200, 580.1, 9.0, GPU-aaa\n1, NVIDIA H200, 580.1, 9.0, GPU-bbb\n"


@pytest.mark.parametrize("visible, expected", [(None, [0, 1]), ("1", [1]), ("GPU-bbb", [1]), ("1,0", [0, 1]),
                                               ("", []), ("-1", []), ("0,-1,1", [0])])
def test_gpu_inventory_respects_cuda_visible_devices(monkeypatch, visible, expected):
    monkeypatch.setattr(envinfo.shutil, "which", lambda _: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(envinfo.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=FAKE))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert [g.index for g in envinfo.gpu_inventory()] == expected
