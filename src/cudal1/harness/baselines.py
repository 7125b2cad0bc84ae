"""Baseline wrappers: the reference itself under ``torch.compile`` modes or CUDA-graph replay.

Each mode is timed with the same timer and protocol as candidates (the worker's ``baseline``
mode), so a baseline speedup is directly comparable with a candidate speedup.  Registry:
``MODES``; an unknown mode is an error.
"""

from __future__ import annotations

from typing import Any

import torch

MODES: dict[str, str] = {
    "eager": "the reference as written",
    "compile": "torch.compile, mode default",
    "compile-ro": "torch.compile, mode reduce-overhead (CUDA graphs)",
    "max-autotune": "torch.compile, mode max-autotune",
    "cudagraph": "the reference's forward captured once in a CUDA graph and replayed",
}
_COMPILE_MODES = {"compile": "default", "compile-ro": "reduce-overhead", "max-autotune": "max-autotune"}


def check_modes(modes: list[str], device: str) -> list[str]:
    """Validate mode names (fail loudly); drop ``cudagraph`` on CPU."""
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown baseline mode(s): {', '.join(unknown)}; known: {', '.join(MODES)}")
    return [m for m in modes if not (m == "cudagraph" and device == "cpu")]


class CudaGraphReplay(torch.nn.Module):
    """Replays one captured forward; inputs are copied into static buffers on every call.

    The returned tensors are the graph's static outputs (overwritten by the next call), the
    usual aliasing contract of CUDA-graph replay.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_in: list[Any] = []
        self.static_out: Any = None

    def _capture(self, args: tuple) -> None:
        self.static_in = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                self.model(*self.static_in)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_out = self.model(*self.static_in)

    def forward(self, *args: Any) -> Any:
        if self.graph is None:
            self._capture(args)
        for dst, src in zip(self.static_in, args):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)
        self.graph.replay()
        return self.static_out


def wrap_baseline(mode: str, model: torch.nn.Module, device: torch.device) -> Any:
    if mode == "eager":
        return model
    if mode in _COMPILE_MODES:
        return torch.compile(model, mode=_COMPILE_MODES[mode])
    if mode == "cudagraph":
        if device.type != "cuda":
            raise ValueError("cudagraph baseline needs CUDA")
        return CudaGraphReplay(model)
    raise ValueError(f"unknown baseline mode {mode!r}")
