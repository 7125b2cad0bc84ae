"""The one CUDA-graph replay wrapper, used by the ``cudagraph`` baseline and the builtin policy's
``cudagraph`` pass.

Contract: ``CudaGraphReplay(fn)`` is a callable that captures ``fn(*args)`` in a CUDA graph the
first time it sees an argument signature (tensor shapes and dtypes, other values as they are)
and replays the graph afterwards: inputs are copied into static buffers on every call, so the
same work runs on new values.  A new signature recaptures.  Calls without CUDA tensor arguments
(or with any CPU tensor) run ``fn`` eagerly.  With ``clone_outputs`` (the default) each call
returns copies, so a caller never sees a returned tensor change on the next call; without it the
graph's static outputs are returned (the aliasing contract of ``torch.cuda.graphs``, which the
baseline keeps so its timing is replay alone).

Not covered: ``fn`` must be capturable (no host synchronisation, no data-dependent control flow,
no CPU tensors created inside); outputs other than a tensor or a tuple/list of tensors and other
values are returned as captured.

The builtin policy's candidates import nothing from cudal1, so they carry this class's source
(:func:`cudal1.compile_modes.cuda_graph_source` reads it from this file without importing torch):
keep the class self-contained, referring only to ``torch``.
"""

from __future__ import annotations

import torch


class CudaGraphReplay:
    """``fn`` captured in a CUDA graph once per argument signature and replayed (cudal1)."""

    def __init__(self, fn, clone_outputs=True):
        self.fn = fn
        self.clone_outputs = clone_outputs
        self.graph = None
        self.key = None
        self.static_in = []
        self.static_out = None

    def _capture(self, args):
        self.static_in = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture stream (lazy init, autotuning)
            for _ in range(3):
                self.fn(*self.static_in)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_out = self.fn(*self.static_in)

    def __call__(self, *args):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if not tensors or not all(t.is_cuda for t in tensors):
            return self.fn(*args)
        key = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
        if self.graph is None or key != self.key:
            self._capture(args)
            self.key = key
        for dst, src in zip(self.static_in, args):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)
        self.graph.replay()
        out = self.static_out
        if not self.clone_outputs:
            return out
        if isinstance(out, torch.Tensor):
            return out.clone()
        if isinstance(out, (tuple, list)):
            return type(out)(o.clone() if isinstance(o, torch.Tensor) else o for o in out)
        return out
