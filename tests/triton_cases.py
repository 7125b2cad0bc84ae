"""Shared cases of the generated-Triton tests (CPU interpreter and GPU): a task-source builder,
every elementwise spelling the ``triton-fusion`` pass must fuse, :func:`compare_interpreted`,
which runs a candidate against its reference in a fresh interpreter process, and
:func:`load_source`, which imports a written source.  A helper module, not a test module: test
modules import it (``from triton_cases import ...``) so that none imports another."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

TASK_TAIL = """

def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return [{init}]
"""


def task(forward: str, init: str = "", inputs: str = "torch.randn(4, 8, 6, 5)", init_inputs: str = "",
         signature: str = "x") -> str:
    head = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\nclass Model(nn.Module):\n"
    head += "    def __init__(self):\n        super().__init__()\n" + textwrap.indent(textwrap.dedent(init), " " * 8)
    head += f"\n    def forward(self, {signature}):\n" + textwrap.indent(textwrap.dedent(forward), " " * 8)
    return head + TASK_TAIL.format(inputs=inputs, init=init_inputs)


# Each activation spelling, in a chain (after a multiply, followed by an add, so that even a lone
# activation is part of a chain), on inputs wide enough to reach every branch (softplus's
# threshold, clamps).  Module spellings are built in __init__ as ``self.act``.
ACTIVATIONS = {
    "relu": "torch.relu(x)", "relu_method": "x.relu()", "relu_module": "nn.ReLU()",
    "relu6": "F.relu6(x)", "relu6_module": "nn.ReLU6()", "leaky_relu": "F.leaky_relu(x, negative_slope=0.2)",
    "leaky_relu_module": "nn.LeakyReLU(0.05)", "sigmoid": "torch.sigmoid(x)", "sigmoid_method": "x.sigmoid()",
    "sigmoid_module": "nn.Sigmoid()", "tanh": "torch.tanh(x)", "tanh_module": "nn.Tanh()", "gelu": "F.gelu(x)",
    "gelu_tanh": "F.gelu(x, approximate='tanh')", "gelu_module": "nn.GELU(approximate='tanh')", "silu": "F.silu(x)",
    "silu_module": "nn.SiLU()", "swish": "x * torch.sigmoid(x)", "mish": "F.mish(x)", "mish_module": "nn.Mish()",
    "hardtanh": "F.hardtanh(x, min_val=-2.0, max_val=3.0)", "hardtanh_module": "nn.Hardtanh(-0.5, 0.5)",
    "clamp_min": "torch.clamp(x, min=0.25)", "clamp_max_method": "x.clamp(max=0.5)", "clip": "torch.clip(x, -1, 1)",
    "hardswish": "F.hardswish(x)", "hardswish_module": "nn.Hardswish()", "hardsigmoid": "F.hardsigmoid(x)",
    "softplus": "F.softplus(x)", "softplus_beta": "F.softplus(x, beta=2.0, threshold=5.0)",
    "softplus_module": "nn.Softplus(beta=0.5, threshold=4.0)", "elu": "F.elu(x, alpha=0.7)",
    "elu_module": "nn.ELU()", "selu": "torch.selu(x)", "selu_module": "nn.SELU()", "celu": "F.celu(x, alpha=1.5)",
    "softsign": "F.softsign(x)", "logsigmoid": "F.logsigmoid(x)", "tanhshrink": "F.tanhshrink(x)",
    "threshold": "F.threshold(x, 0.1, -3.0)", "exp": "torch.exp(x * 0.1)", "log": "torch.log(x.abs() + 1.0)",
    "abs": "torch.abs(x)", "neg": "-x", "sqrt": "torch.sqrt(x.abs())", "rsqrt": "torch.rsqrt(x.abs() + 0.5)",
    "reciprocal": "torch.reciprocal(x.abs() + 0.5)", "square": "torch.square(x)", "pow3": "x ** 3",
    "pow_half": "torch.pow(x.abs(), 0.5)", "erf": "torch.erf(x)", "rsub": "2.0 - x", "rdiv": "1.0 / (x.abs() + 1.0)",
    "add_alpha": "torch.add(x, x, alpha=0.5)", "maximum": "torch.maximum(x, x * 0.5)",
    "min_binary": "torch.min(x, -x)",
}


_COMPARE = """
import importlib.util, json, sys
import torch
spec = importlib.util.spec_from_file_location("cand", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
sys.modules["cand"] = mod
spec.loader.exec_module(mod)
errors = []
for seed in json.loads(sys.argv[2]):
    torch.manual_seed(seed)
    ref = mod.Model(*mod.get_init_inputs())
    new = mod.ModelNew(*mod.get_init_inputs())
    new.load_state_dict(ref.state_dict())
    torch.manual_seed(seed + 1)
    inputs = mod.get_inputs()
    with torch.no_grad():
        want, got = ref(*[t.clone() for t in inputs]), new(*[t.clone() for t in inputs])
    want = want if isinstance(want, (tuple, list)) else [want]
    got = got if isinstance(got, (tuple, list)) else [got]
    for w, g in zip(want, got):
        same = w.shape == g.shape and w.dtype == g.dtype
        nan = bool(torch.equal(w.isnan(), g.isnan())) if w.is_floating_point() and same else same
        err = (g.double() - w.double()).nan_to_num().abs().max().item() if same and w.numel() else 0.0
        errors.append({"same_kind": same, "nan_positions": nan, "max_abs": err,
                       "scale": w.double().nan_to_num().abs().max().item() if w.numel() else 0.0})
print(json.dumps(errors))
"""


def compare_interpreted(candidate: str, tmp_path: Path, seeds: tuple[int, ...] = (0, 7)) -> list[dict]:
    """Run ``candidate`` (task source + ModelNew) against its ``Model`` in a new process with
    ``TRITON_INTERPRET=1`` set before Triton is imported (kernels calling Triton's own jitted
    helpers, ``tl.sum`` and the like, need that), on the task's inputs for each seed; one dict per
    output and seed: ``same_kind`` (shape and dtype), ``nan_positions``, ``max_abs`` error and the
    reference's ``scale``."""
    path = tmp_path / "interpreted_candidate.py"
    path.write_text(candidate)
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-c", _COMPARE, str(path), json.dumps(list(seeds))], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def load_source(tmp_path: Path, source: str, name: str):
    """``source`` written to a file and imported as module ``name`` (Triton reads kernels from files)."""
    from cudal1.harness.process_start import load_module

    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return load_module(str(path), name)
