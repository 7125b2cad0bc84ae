"""Graph pass ``gemm-3xtf32`` (CPU): which products it takes, the generated kernel's numerics in
Triton's interpreter, and — through the real judge on the CPU — the precision rule it relies on:
the split-precision arithmetic passes the exact-answer rule, while a plain TF32 or bf16 product
fails it and a global TF32 switch is rejected.  (The interpreter computes ``tl.dot`` in plain fp32
whatever the precision argument; the tensor-core arithmetic itself is checked on the GPU by
``tests/gpu/test_builtin_kernels_gpu.py``.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from cudal1.rewrite.graph.emit import emit_class
from cudal1.rewrite.graph.trace import propagate_shapes, trace_task
from cudal1.rewrite.triton_kernels import gemm as triton_gemm
from cudal1.rewrite.triton_kernels.gemm import MIN_MACS, NAME
from triton_cases import compare_interpreted, load_source, task

PRECISION = Path(__file__).parent / "fixtures" / "rewrite" / "precision"


def rewrite(source: str) -> tuple[list[str], str]:
    traced = trace_task(source)
    notes = triton_gemm.run(traced.gm)
    if not notes:
        return [], ""
    traced.gm.graph.lint()
    traced.gm.recompile()
    propagate_shapes(traced.gm, traced.inputs)  # the launchers on the meta device
    return notes, emit_class(traced.gm, traced.module.__dict__, notes, [NAME])


GEMMS = task(init="self.fc = nn.Linear(40, 48)\nself.proj = nn.Linear(48, 24, bias=False)\n", signature="x, y",
             forward="""\
                 h = torch.relu(self.fc(x))
                 z = torch.bmm(self.proj(h), y)
                 return z + (x.transpose(1, 2) @ x)[:, :36]
                 """, inputs="torch.randn(3, 36, 40), torch.randn(3, 24, 40)")


@pytest.fixture(autouse=True)
def small_products_count(request, monkeypatch):
    """Interpreted kernels are slow: test on small products (the threshold is tested on its own)."""
    if "threshold" not in request.node.name and "declined" not in request.node.name:
        monkeypatch.setattr(triton_gemm, "MIN_MACS", 1)


@pytest.mark.cpu
def test_products_become_split_precision_kernels_and_match(tmp_path):
    notes, cls = rewrite(GEMMS)
    assert len(notes) == 4, notes  # two linear maps, the bmm and the matmul of a transposed view
    assert all("3xTF32" in n for n in notes)
    forward = cls[cls.index("def forward"):]
    assert forward.count("_cudal1_linear(") == 2 and forward.count("_cudal1_matmul(") == 2
    assert 'input_precision="tf32x3"' in cls and "allow_tf32" not in cls  # nothing global is switched
    for out in compare_interpreted(GEMMS + "\n\n" + cls, tmp_path):
        assert out["same_kind"] and out["max_abs"] <= 1e-5 * out["scale"] + 1e-5, out


CONVS = task(
    init="self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)\nself.depthwise = nn.Conv2d(8, 8, 3, groups=8)\n",
    forward="""\
                 y = torch.relu(self.conv(x))
                 z = F.conv2d(y, self.conv.weight[:, :3].repeat(1, 3, 1, 1)[:, :8], None, 1, (2, 1), 2)
                 return self.depthwise(z)
                 """,
    inputs="torch.randn(2, 3, 17, 15)",
)


@pytest.mark.cpu
def test_convolutions_become_implicit_gemm_kernels_and_match(tmp_path):
    notes, cls = rewrite(CONVS)
    forward = cls[cls.index("def forward"):]
    assert forward.count("_cudal1_conv2d(") == 2 and "self.depthwise(" in forward, notes  # groups: left to cuDNN
    for out in compare_interpreted(CONVS + "\n\n" + cls, tmp_path, seeds=(0,)):
        assert out["same_kind"] and out["max_abs"] <= 1e-5 * out["scale"] + 1e-5, out


def test_launchers_hand_other_inputs_to_pytorch(tmp_path, monkeypatch):
    _, cls = rewrite(GEMMS)
    mod = load_source(tmp_path, GEMMS + "\n\n" + cls, "cudal1_test_gemm_routing")
    a, b = torch.randn(5, 7), torch.randn(7, 3)
    assert torch.equal(mod._cudal1_matmul(a, b), a @ b)  # CPU tensors, no interpreter: torch itself

    class KernelCalled(Exception):
        pass

    def kernel(*_args, **_kwargs):
        raise KernelCalled

    monkeypatch.setattr(mod, "_cudal1_gemm", kernel)
    monkeypatch.setattr(mod, "_cudal1_interpreted", lambda: True)  # as if the kernel could run here
    for x, y in [(a.half(), b.half()), (torch.randn(2, 1, 5, 7), torch.randn(3, 7, 4)), (a[0], b),
                 (torch.randn(0, 7), b)]:  # not fp32, broadcast batch dims, a vector, empty: torch itself
        assert torch.equal(mod._cudal1_matmul(x, y), x @ y)
    for x, y in [
        (a, b), (torch.randn(2, 5, 7), b), (a, torch.randn(4, 7, 3)),
        (torch.randn(4, 5, 7), torch.randn(4, 7, 3)),
    ]:
        with pytest.raises(KernelCalled):
            mod._cudal1_matmul(x, y)
    with pytest.raises(KernelCalled):
        mod._cudal1_linear(torch.randn(2, 9, 7), torch.randn(5, 7), torch.randn(5))
    with torch.device("meta"):  # shape propagation in the rewrite child: shapes only
        assert mod._cudal1_linear(torch.empty(2, 9, 7), torch.empty(5, 7)).shape == (2, 9, 5)
        assert mod._cudal1_matmul(torch.empty(3, 9, 7), torch.empty(3, 7, 2)).shape == (3, 9, 2)


@pytest.mark.parametrize("forward,inputs", [
    ("return x @ y\n", "torch.randn(8, 16), torch.randn(16, 8)"),  # below MIN_MACS: cuBLAS's launch path
    ("return x.half() @ y.half()\n", "torch.randn(256, 256), torch.randn(256, 256)"),  # not fp32
    ("return x @ y[0]\n", "torch.randn(256, 256), torch.randn(256, 256)"),  # a matrix-vector product
    ("return (x.long() @ y.long()).float()\n", "torch.randn(256, 256), torch.randn(256, 256)"),  # integers
])
def test_declined(forward, inputs):
    assert rewrite(task(forward=forward, signature="x, y", inputs=inputs)) == ([], "")


def test_size_threshold_is_multiply_adds():
    src = task(forward="return x @ y\n", signature="x, y", inputs="torch.randn(128, 128), torch.randn(128, 128)")
    assert 128 ** 3 >= MIN_MACS and len(rewrite(src)[0]) == 1


@pytest.mark.cpu
def test_the_judge_takes_split_precision_and_refuses_downgrades(cpu_judge_config, tmp_path):
    """CPU emulations judged by the real judge: what the pass computes passes, TF32 and bf16 products
    fail the exact-answer rule without touching any global switch, and the switch is rejected."""
    from cudal1.harness import evaluate_pairs
    from cudal1.tasks import load_task_file
    from cudal1.types import Candidate

    task_ = load_task_file(PRECISION / "task_matmul.py")
    files = sorted(p for p in PRECISION.glob("*.py") if not p.name.startswith("task_"))
    expected = {p.name: p.read_text().splitlines()[0].removeprefix("# expect:").split() for p in files}
    results = evaluate_pairs([(task_, Candidate(p.read_text())) for p in files], cpu_judge_config(tmp_path))
    got = {p.name: [r.status.value] + [f for f in r.flags if f in ("value_mismatch", "precision_downgrade")]
           for p, r in zip(files, results)}
    assert got == expected, {p.name: r.message[:300] for p, r in zip(files, results)}
    assert set(expected) == {"split_3xtf32.py", "plain_tf32.py", "bf16_product.py", "tf32_switch.py"}
