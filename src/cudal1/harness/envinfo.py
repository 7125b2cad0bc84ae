"""Environment capture: what a number was measured on (GPU, driver, CUDA, torch, versions).

``collect_environment`` runs in the worker (it may initialise CUDA); ``gpu_inventory`` runs in
the parent and asks ``nvidia-smi`` only, so the parent never creates a CUDA context.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import socket
import subprocess
from dataclasses import dataclass
from typing import Any


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def collect_environment(device: Any) -> dict[str, Any]:
    import torch

    from cudal1 import __version__

    env: dict[str, Any] = {
        "device": device.type,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": _version("triton"),
        "python": platform.python_version(),
        "cudal1": __version__,
        "hostname": socket.gethostname(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["gpu_name"] = props.name
        env["gpu_capability"] = f"{props.major}.{props.minor}"
    else:
        env["gpu_name"] = None
    return env


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    driver: str
    capability: str  # "9.0"


def gpu_inventory() -> list[Gpu]:
    """Local NVIDIA GPUs through ``nvidia-smi`` ([] when there is none or it fails), restricted to
    ``$CUDA_VISIBLE_DEVICES`` when it is set (indices or ``GPU-…`` UUIDs, as CUDA reads it).
    Indices are nvidia-smi's (PCI order); lanes pass them on as ``CUDA_VISIBLE_DEVICES``."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,name,driver_version,compute_cap,uuid", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus, uuids = [], {}
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 5 and parts[0].isdigit():
            gpus.append(Gpu(int(parts[0]), parts[1], parts[2], parts[3]))
            uuids[int(parts[0])] = parts[4]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
        keep = []
        for w in wanted:
            if w.lstrip("-").isdigit() and int(w) < 0:
                break  # CUDA stops at the first invalid entry
            keep += [g for g in gpus if str(g.index) == w or uuids.get(g.index, "").startswith(w)]
        gpus = [g for g in gpus if g in keep]
    return gpus
