"""Unit tier: technique labels of small fixture programs, and ``cudal1 analyze``'s contract."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cudal1.cli.main import main as cli_main
from cudal1.report.techniques import TECHNIQUES, analyze

REPO = Path(__file__).resolve().parents[1]

CUDA_SOFTMAX = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = """
#define BLOCK_SIZE 256
__device__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}
__global__ void __launch_bounds__(BLOCK_SIZE) softmax_kernel(const float4* __restrict__ x, float* out, int n) {
    __shared__ float tile[BLOCK_SIZE + 1];
    float4 v = x[blockIdx.x * blockDim.x + threadIdx.x];
    float m = warp_max(fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)));
    float e = __expf(v.x - m);
    tile[threadIdx.x] = e;
    __syncthreads();
    out[threadIdx.x] = e / tile[0];
}
"""
ext = load_inline(name="sm", cpp_sources="", cuda_sources=cuda_src, functions=[])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.softmax(x)
'''

TRITON = '''
import torch
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 256}, num_warps=4)], key=["n"])
@triton.jit
def fused(x_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    y = tl.maximum(x * 2.0 + b, 0.0)
    tl.store(out_ptr + offs, y, mask=mask)
    tl.atomic_add(out_ptr, tl.sum(y, axis=0))


class ModelNew(torch.nn.Module):
    def forward(self, x, b):
        out = torch.empty_like(x)
        fused[(1,)](x, b, out, x.numel())
        return out
'''

COMPILED = '''
import torch
import torch.nn as nn
from task import Model


class ModelNew(Model):
    def __init__(self, *args):
        super().__init__(*args)
        self.fast = torch.compile(super().forward, mode="reduce-overhead")

    def forward(self, *args):
        return self.fast(*args)
'''

GRAPHED = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.g = None

    def forward(self, x):
        if self.g is None:
            self.static = x.clone()
            self.g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.g):
                self.out = torch.relu(self.static)
        self.static.copy_(x, non_blocking=True)
        self.g.replay()
        return self.out.clone()
'''


def _lines(source: str) -> set[str]:
    return {line.strip() for line in source.splitlines()}


def _check_evidence(result, source: str, reference: str = "") -> None:
    """Every evidence line is a line of the candidate (or, marked, of the reference)."""
    assert list(result.evidence) == result.techniques
    assert all(t in TECHNIQUES for t in result.techniques)
    for tech, lines in result.evidence.items():
        assert lines, tech
        for line in lines:
            if line.startswith("reference: "):
                assert line[len("reference: "):] in _lines(reference), line
            elif not line.startswith("analysis: "):
                assert line in _lines(source), (tech, line)


def test_cuda_load_inline_kernel():
    r = analyze(CUDA_SOFTMAX)
    _check_evidence(r, CUDA_SOFTMAX)
    for tech in ("cuda_kernel", "warp_reduction", "smem_register_caching", "block_config", "memory_coalescing",
                 "memory_layout", "operation_fusion"):
        assert tech in r.techniques, (tech, r.to_dict())
    assert "triton_kernel" not in r.techniques and "torch_compile" not in r.techniques
    assert any("__shfl_xor_sync" in line for line in r.evidence["warp_reduction"])
    assert any("[BLOCK_SIZE + 1]" in line for line in r.evidence["memory_layout"])  # bank-conflict padding


def test_triton_kernel():
    r = analyze(TRITON)
    _check_evidence(r, TRITON)
    for tech in ("triton_kernel", "block_config", "operation_fusion", "warp_reduction"):
        assert tech in r.techniques, (tech, r.to_dict())
    assert "cuda_kernel" not in r.techniques and "pytorch_rewrite" not in r.techniques
    assert any("tl.maximum" in line for line in r.evidence["operation_fusion"])


def test_single_op_triton_kernel_is_not_fusion():
    single = TRITON.replace("y = tl.maximum(x * 2.0 + b, 0.0)", "y = x + b").replace(
        "    tl.atomic_add(out_ptr, tl.sum(y, axis=0))\n", "")
    r = analyze(single)
    assert "triton_kernel" in r.techniques and "operation_fusion" not in r.techniques
    assert "warp_reduction" not in r.techniques


def test_torch_compile_reduce_overhead_uses_cuda_graphs():
    ref = (REPO / "examples" / "tasks" / "linear_relu.py").read_text()
    r = analyze(COMPILED, ref)
    _check_evidence(r, COMPILED, ref)
    assert r.techniques == ["torch_compile", "cuda_graph"], r.to_dict()  # the base's forward still runs: no rewrite


def test_cuda_graph_capture():
    r = analyze(GRAPHED)
    _check_evidence(r, GRAPHED)
    assert "cuda_graph" in r.techniques and "async_execution" in r.techniques
    assert "torch_compile" not in r.techniques and "cuda_kernel" not in r.techniques


def test_algebraic_rewrite_against_reference():
    ref = (REPO / "examples" / "tasks" / "diag_matmul.py").read_text()
    cand = (REPO / "examples" / "candidates" / "diag_matmul_broadcast.py").read_text()
    r = analyze(cand, ref)
    _check_evidence(r, cand, ref)
    assert "algebraic_shortcut" in r.techniques and "pytorch_rewrite" in r.techniques
    assert any("torch.diag" in line for line in r.evidence["algebraic_shortcut"])
    # without the reference nothing says an operation disappeared
    assert "algebraic_shortcut" not in analyze(cand).techniques


def test_same_operations_is_not_algebraic():
    ref = (REPO / "examples" / "tasks" / "linear_relu.py").read_text()
    cand = (REPO / "examples" / "candidates" / "linear_relu_addmm.py").read_text()
    r = analyze(cand, ref)
    assert "algebraic_shortcut" not in r.techniques  # linear became addmm: same work, a fused library call
    assert {"library_call", "operation_fusion", "pytorch_rewrite"} <= set(r.techniques)


def test_reference_as_candidate_has_no_technique():
    ref = (REPO / "examples" / "tasks" / "diag_matmul.py").read_text()
    assert analyze(ref + "\nModelNew = Model\n", ref).techniques == []


def test_analysis_text_and_unparsable_source():
    r = analyze("class ModelNew: pass\n", analysis="First line. We fuse the bias add into the GEMM epilogue.")
    assert r.techniques == ["operation_fusion"]
    assert r.evidence["operation_fusion"] == ["analysis: We fuse the bias add into the GEMM epilogue."]
    broken = analyze('x = """\n__global__ void k() { __shared__ float s[32]; }\n')  # a syntax error: text rules only
    assert "cuda_kernel" in broken.techniques and "smem_register_caching" in broken.techniques


def test_cli_analyze_json_contract(tmp_path, capsys):
    ref = REPO / "examples" / "tasks" / "diag_matmul.py"
    cand = REPO / "examples" / "candidates" / "diag_matmul_broadcast.py"
    assert cli_main(["analyze", str(cand), "--reference", str(ref), "--json"]) == 0
    last = [line for line in capsys.readouterr().out.splitlines() if line.strip()][-1]
    doc = json.loads(last)
    assert set(doc) == {"techniques", "evidence"}
    assert "algebraic_shortcut" in doc["techniques"] and set(doc["evidence"]) == set(doc["techniques"])
    assert cli_main(["analyze", str(cand)]) == 0
    assert "pytorch_rewrite" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args", [["analyze", "/nonexistent/cand.py"], ["analyze", __file__, "--reference", "/nonexistent.py"]]
)
def test_cli_analyze_unreadable_file(args, capsys):
    assert cli_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cudal1: error: cannot read")


def test_host_code_math_is_not_fusion():
    """Launch-size arithmetic in host code beside a one-operation kernel is not a fused kernel."""
    src = r'''
from torch.utils.cpp_extension import load_inline
cuda = """
__global__ void relu(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f);
}
torch::Tensor run(torch::Tensor x) {
    int blocks = std::min((int)((x.numel() + 255) / 256), 65535);
    for (int k = 0; k < 2; ++k) blocks += 0;
    return x;
}
"""
ext = load_inline(name="r", cpp_sources="", cuda_sources=cuda, functions=["run"])
'''
    r = analyze(src)
    assert "cuda_kernel" in r.techniques and "operation_fusion" not in r.techniques, r.to_dict()
    fused = src.replace("y[i] = fmaxf(x[i], 0.f);", "y[i] = fmaxf(x[i], 0.f) * __expf(x[i]);")
    assert "operation_fusion" in analyze(fused).techniques


@pytest.mark.cpu
def test_labels_come_from_the_code_and_the_reference_only_adds():
    """The builtin policy's candidates are labelled the same with or without their header
    comments, and a reference never takes a label away (over every example candidate too)."""
    from cudal1.policy.builtin import render_candidate

    tasks = {task: (REPO / "examples" / "tasks" / f"{task}.py").read_text()
             for task in ("diag_matmul", "matmul_chain", "linear_relu")}
    jobs = [(task, name) for task in tasks for name in ("algebraic", "compile-default", "cudagraph")]
    with ThreadPoolExecutor(2) as pool:  # each algebraic rewrite traces in a child (~3 s): two at a time
        codes = list(pool.map(lambda job: render_candidate(tasks[job[0]], job[1]), jobs))
    pairs = []
    for (task, name), code in zip(jobs, codes):
        if code is not None:
            stripped = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith("#"))
            assert analyze(code).techniques == analyze(stripped).techniques, (task, name)
            pairs.append((stripped, tasks[task]))
    for cand in sorted((REPO / "examples" / "candidates").glob("*.py")):
        ref = (
            REPO
            / "examples"
            / "tasks"
            / cand.name.replace("_broadcast", "").replace("_addmm", "").replace("_reassociated", "")
        )
        if ref.exists():
            pairs.append((cand.read_text(), ref.read_text()))
    for cand, ref in pairs:
        alone, with_ref = analyze(cand).techniques, analyze(cand, ref).techniques
        assert set(alone) <= set(with_ref), (alone, with_ref)
    chain = render_candidate((REPO / "examples" / "tasks" / "matmul_chain.py").read_text(), "algebraic")
    got = analyze(chain, (REPO / "examples" / "tasks" / "matmul_chain.py").read_text())
    assert "algebraic_shortcut" in got.techniques  # (A @ B) @ X re-nested as A @ (B @ X), read from the code
    assert any(line.startswith("reference: return (A @ B) @ X") for line in got.evidence["algebraic_shortcut"])


def test_cli_analyze_refuses_a_file_that_is_not_python(tmp_path, capsys):
    bad = tmp_path / "notes.py"
    bad.write_text("this is not ( python\n")
    assert cli_main(["analyze", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not valid Python (line 1" in err[0]
    cand = REPO / "examples" / "candidates" / "diag_matmul_broadcast.py"
    assert cli_main(["analyze", str(cand), "--reference", str(bad)]) == 2
