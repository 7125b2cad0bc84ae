"""Host-side launch costs behind the ``triton-fusion`` cost model (``cudal1.rewrite.triton_kernels.cost``).

Prints one JSON line: the host time of one tiny eager elementwise op (``eager_op_us``) and of a
forward whose only work is one tiny generated Triton launch (``fused_forward_us``), next to the
constants the cost model assumes (``EAGER_LAUNCH_S``, ``TRITON_LAUNCH_S``).  The constants were
set from these figures on the H200 (docs/benchmarks.md); re-run after a torch/Triton upgrade.

Needs a CUDA GPU and Triton.  The fused module is generated in this process from a task written
here (trusted code), with the cost model forced to fuse the two-op chain.

    python benchmarks/triton_launch_overhead.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x) * 3.0


def get_inputs():
    return [torch.randn(8, 8)]


def get_init_inputs():
    return []
'''


def fused_model(tmp: Path):
    """``ModelNew`` of TASK with its sigmoid-multiply chain in one generated Triton kernel."""
    from cudal1.rewrite.graph.emit import emit_class
    from cudal1.rewrite.graph.trace import propagate_shapes, trace_task
    from cudal1.rewrite.triton_kernels import fusion as triton_fusion

    triton_fusion.worth_fusing = lambda region, ops: len(region.nodes) >= 2  # a tiny chain: force it
    traced = trace_task(TASK)
    notes = triton_fusion.run(traced.gm)
    if not notes:
        raise SystemExit("triton-fusion fused nothing (is Triton installed?)")
    traced.gm.recompile()
    propagate_shapes(traced.gm, traced.inputs)
    cls = emit_class(traced.gm, traced.module.__dict__, notes, [triton_fusion.NAME])
    path = tmp / "tf_overhead.py"
    path.write_text(TASK + "\n\n_torch_Tensor_ = torch.Tensor  # annotations fx writes\n\n" + cls)
    spec = importlib.util.spec_from_file_location("tf_overhead", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["tf_overhead"] = module
    spec.loader.exec_module(module)
    return module.ModelNew().cuda()


def host_time(fn, calls: int) -> float:
    """Seconds of host time per call, after 50 warm-up calls, with the device drained."""
    import torch

    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per figure")
    args = parser.parse_args()
    import torch

    from cudal1.rewrite.triton_kernels import cost as triton_cost

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    with tempfile.TemporaryDirectory() as tmp:
        new = fused_model(Path(tmp))
        x = torch.randn(8, 8, device="cuda")
        eager_op = host_time(lambda: torch.sigmoid(x), args.calls)
        launch = host_time(lambda: new(x), args.calls)
    print(json.dumps({"eager_op_us": eager_op * 1e6, "fused_forward_us": launch * 1e6,
                      "assumed_eager_us": triton_cost.EAGER_LAUNCH_S * 1e6,
                      "assumed_triton_us": triton_cost.TRITON_LAUNCH_S * 1e6,
                      "device": torch.cuda.get_device_name(), "torch": torch.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
