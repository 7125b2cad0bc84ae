"""Graph pass ``triton-reduce`` (CPU): which softmax, normalization and reduction calls it takes,
what it leaves to PyTorch, and the generated kernels' numerics in Triton's interpreter (both the
one-read path and the blocked path for long rows).  Compiled kernels and their speed: the GPU tier
(``tests/gpu/test_builtin_kernels_gpu.py``) and ``benchmarks/builtin_kernelbench.py``."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from cudal1.rewrite.graph.emit import emit_class
from cudal1.rewrite.graph.trace import propagate_shapes, trace_task
from cudal1.rewrite.triton_kernels import reduce as triton_reduce
from triton_cases import compare_interpreted, task


@pytest.fixture(autouse=True)
def small_tensors_count(request, monkeypatch):
    """Interpreted kernels are slow: test on small tensors (the threshold is tested on its own)."""
    if "threshold" not in request.node.name:
        monkeypatch.setattr(triton_reduce, "MIN_NUMEL", 1)


def rewrite(source: str) -> tuple[list[str], str]:
    traced = trace_task(source)
    notes = triton_reduce.run(traced.gm)
    if not notes:
        return [], ""
    traced.gm.graph.lint()
    traced.gm.recompile()
    propagate_shapes(traced.gm, traced.inputs)
    return notes, emit_class(traced.gm, traced.module.__dict__, notes, [triton_reduce.NAME])


EVERYTHING = task(init="""\
    self.ln = nn.LayerNorm(12)
    self.gn = nn.GroupNorm(2, 4)
    self.inorm = nn.InstanceNorm2d(4, affine=True)
    self.rms = nn.RMSNorm(12)
    self.sm = nn.LogSoftmax(dim=-1)
    with torch.no_grad():
        for p in self.parameters():
            p.uniform_(0.5, 1.5)
    """, signature="x, img", forward="""\
    h = self.ln(x) + self.rms(x) + F.layer_norm(x, (3, 12))
    s = torch.softmax(h, dim=-1) + self.sm(h) + h.log_softmax(-1)
    r = s.sum(dim=1) + s.mean(1) + torch.amax(s, dim=1, keepdim=True).squeeze(1) + s.max(dim=1)[0] + s.amin(2)[:, :1]
    i, j = torch.argmax(s, dim=2), s.argmin(1, keepdim=True)
    g = self.gn(img) + self.inorm(img)
    return r, i, j, g
    """, inputs="torch.randn(2, 3, 12), torch.randn(2, 4, 3, 5)")


@pytest.mark.cpu
def test_every_supported_call_becomes_a_kernel_and_matches(tmp_path):
    notes, cls = rewrite(EVERYTHING)
    forward = cls[cls.index("def forward"):]
    launchers = {name: forward.count(f"_cudal1_{name}(") for name in
                 ("layer_norm", "rms_norm", "softmax", "reduce", "group_norm", "instance_norm")}
    assert launchers == {"layer_norm": 2, "rms_norm": 1, "softmax": 3, "reduce": 7, "group_norm": 1,
                         "instance_norm": 1}, (launchers, notes)
    assert len(notes) == 15 and "max values over dim 1" in " ".join(notes)
    for out in compare_interpreted(EVERYTHING + "\n\n" + cls, tmp_path):
        assert out["same_kind"] and out["nan_positions"] and out["max_abs"] <= 2e-5 * max(1.0, out["scale"]), out


@pytest.mark.cpu
def test_long_rows_take_the_blocked_path(tmp_path):
    src = task(init="self.ln = nn.LayerNorm(40)\n", forward="""\
        y = self.ln(x)
        return torch.softmax(y, -1) + F.log_softmax(x, -1) + F.rms_norm(x, (40,))
        """, inputs="torch.randn(3, 40) * 3")
    notes, cls = rewrite(src)
    assert len(notes) == 4
    # the same kernels with rows longer than the one-read limit and a block of 16 elements
    blocked = cls.replace("_CUDAL1_ONE_PASS = 16384", "_CUDAL1_ONE_PASS = 8").replace(
        '{"BLOCK": 1024}', '{"BLOCK": 16}'
    )
    assert blocked.count('{"BLOCK": 16}') == 2 and "_CUDAL1_ONE_PASS = 8" in blocked
    for out in compare_interpreted(src + "\n\n" + blocked, tmp_path, seeds=(3,)):
        assert out["same_kind"] and out["max_abs"] <= 2e-5 * max(1.0, out["scale"]), out


@pytest.mark.cpu
def test_nan_and_ties_follow_torch(tmp_path):
    src = task(forward="""\
        return torch.amax(x, dim=2), torch.argmax(x, dim=2), torch.argmin(x, dim=1), torch.amin(x, dim=1)
        """, inputs="torch.where(torch.arange(30).reshape(2, 3, 5) == 7, float('nan'), torch.randn(2, 3, 5)) * "
                    "(torch.arange(3).reshape(1, 3, 1) != 1)")  # a NaN in a row of zeros (ties), other zero rows
    notes, cls = rewrite(src)
    assert len(notes) == 4
    for out in compare_interpreted(src + "\n\n" + cls, tmp_path, seeds=(0,)):
        assert out["same_kind"] and out["nan_positions"] and out["max_abs"] == 0.0, out


@pytest.mark.parametrize("forward,init", [
    ("return torch.softmax(x, dim=0)\n", ""),  # softmax over a dim other than the last
    ("return x.sum(dim=(1, 2))\n", ""),  # several dims
    ("return x.sum()\n", ""),  # the whole tensor
    ("return torch.sum(x, dim=1, dtype=torch.float64)\n", ""),  # another dtype
    ("return torch.softmax(x, dim=-1, dtype=torch.float64)\n", ""),
    ("return self.bn(x)\n", "self.bn = nn.BatchNorm1d(8)\n"),  # statistics over a strided set
    ("return self.inorm(x)\n", "self.inorm = nn.InstanceNorm1d(8, track_running_stats=True)\n"),
    ("return torch.softmax(x.long().float(), -1).long()\n", ""),  # the result is cast, the softmax is taken
    ("w = torch.softmax(self.w, -1)\nreturn x * w\n", "self.w = nn.Parameter(torch.randn(6, 5))\n"),  # constant
])
def test_declined(forward, init):
    notes, _ = rewrite(task(forward=forward, init=init, inputs="torch.randn(4, 8, 5)" if "bn" in init or "inorm" in
                            init else "torch.randn(4, 6, 5)"))
    if "long()" in forward:
        assert len(notes) == 1  # the float softmax between the casts is still a softmax
    else:
        assert notes == [], notes


def test_threshold_leaves_small_tensors_to_pytorch():
    small = task(forward="return torch.softmax(x, -1)\n", inputs="torch.randn(4, 8)")
    large = task(forward="return torch.softmax(x, -1)\n", inputs="torch.randn(64, 128)")
    assert rewrite(small) == ([], "") and len(rewrite(large)[0]) == 1
