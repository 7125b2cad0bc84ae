"""The builtin policy's exec passes beyond the torch.compile modes (CPU): Inductor setting sets
(``inductor[...]``) and their search, and the compiled forward inside one CUDA graph
(``compile-cudagraph``).  Generated code is checked for what it asks of torch.compile and run on
the CPU; on a GPU the judge times it (``benchmarks/builtin_kernelbench.py``)."""

from __future__ import annotations

import ast

import pytest
import torch

from cudal1.compile_modes import INDUCTOR_SETTINGS, inductor_name, inductor_settings
from cudal1.policy.base import PoolEntry, PoolPrompt
from cudal1.policy.builtin import INDUCTOR_SEARCH, BuiltinPolicy, compose, default_passes, passes_in, render_candidate
from cudal1.policy.builtin_passes import pass_named

WEIGHTS = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2.0


def get_inputs():
    return [torch.randn(16, 32)]


def get_init_inputs():
    return [32]
"""
ELEMENTWISE = WEIGHTS.replace("self.lin = nn.Linear(n, n)", "self.n = n").replace("self.lin(x)", "x")


def _options(code: str) -> dict:
    """The options= mapping of the candidate's one torch.compile call (helper calls unparsed)."""
    (call,) = [
        n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call) and ast.unparse(n.func) == "torch.compile"
    ]
    (kw,) = [k for k in call.keywords if k.arg == "options"]
    return {ast.literal_eval(k): (ast.literal_eval(v) if not isinstance(v, ast.Call) else ast.unparse(v))
            for k, v in zip(kw.value.keys, kw.value.values)}


def test_setting_names_are_canonical():
    assert inductor_name({"freezing", "cd"}) == "inductor[cd,freezing]"
    assert inductor_settings("inductor[cd,freezing]") == ("cd", "freezing") and inductor_settings("cudagraph") is None
    for bad in ("inductor[freezing,cd]", "inductor[]", "inductor[cd,cd]", "inductor[warp]"):
        with pytest.raises(ValueError):
            inductor_settings(bad)
    assert pass_named("inductor[cd,gemm,freezing]").kind == "exec"  # any set, not only the registered singles
    with pytest.raises(KeyError):
        pass_named("inductor[gemm,cd]")


def test_inductor_sets_compile_with_scoped_options_only_where_they_can_matter():
    code = render_candidate(WEIGHTS, "inductor[cd,gemm,freezing]")
    assert passes_in(code) == ["inductor[cd,gemm,freezing]"]
    assert _options(code) == {"coordinate_descent_tuning": True, "max_autotune_gemm": True,
                              "max_autotune_gemm_backends": "_cudal1_gemm_backends()",
                              "benchmark_epilogue_fusion": True, "freezing": True}
    assert "def _cudal1_gemm_backends" in code and "torch._inductor.config." not in code.replace(
        "import torch._inductor.config as inductor_config", "")  # read, never assigned: nothing global changes
    assert render_candidate(ELEMENTWISE, "inductor[freezing]") is None  # no weights to freeze
    assert (
        render_candidate(ELEMENTWISE, "inductor[gemm]") is None
        and render_candidate(ELEMENTWISE, "inductor[padding]") is None
    )
    assert render_candidate(ELEMENTWISE, "inductor[cd,aggressive]") is not None
    from cudal1.harness.parent.static_guard import run_static_guards

    assert [f for f in run_static_guards(code, reference=WEIGHTS) if f.reject] == []


def test_every_setting_is_an_option_this_torch_knows():
    """torch.compile(options=...) refuses unknown keys when it compiles; compiling is the GPU tier's
    job (tests/gpu/test_builtin_kernels_gpu.py), so here every key is looked up in Inductor's config."""
    import torch._inductor.config as inductor_config

    for setting in INDUCTOR_SETTINGS.values():
        for key in setting.options:
            obj = inductor_config
            for atom in key.split("."):
                assert hasattr(obj, atom), (setting.name, key)
                obj = getattr(obj, atom)


def test_compile_cudagraph_wraps_the_compiled_forward_in_the_one_replay_class(monkeypatch):
    code = render_candidate(WEIGHTS, "compile-cudagraph")
    tree = ast.parse(code)
    assert sum(isinstance(n, ast.ClassDef) and n.name == "CudaGraphReplay" for n in ast.walk(tree)) == 1
    assert "CudaGraphReplay(torch.compile(super().forward))" in code
    monkeypatch.setattr(torch, "compile", lambda fn, **_: fn)  # the wiring, not Inductor, on the CPU
    ns: dict = {}
    exec(compile(code, "cand", "exec"), ns)
    torch.manual_seed(0)
    ref = ns["Model"](32)
    new = ns["ModelNew"](32)
    new.load_state_dict(ref.state_dict())
    x = torch.randn(16, 32)
    torch.testing.assert_close(new(x), ref(x), rtol=0, atol=0)
    assert new._replay.graph is None  # CPU inputs are never captured
    assert compose(WEIGHTS, code, "cudagraph") is None  # one exec pass per chain


def _prompt(source: str, pool: tuple[PoolEntry, ...]) -> PoolPrompt:
    return PoolPrompt("t", "h" * 64, "s", "u", "v", task_source=source, pool=pool)


def test_the_setting_search_grows_the_fastest_set_one_setting_at_a_time():
    anchor = PoolEntry(WEIGHTS + "\n\nModelNew = Model\n", 1.0, reference=True)
    singles = [inductor_name([s]) for s in INDUCTOR_SETTINGS]
    policy = BuiltinPolicy(device="cuda", passes=["compile-default", *singles, INDUCTOR_SEARCH])
    measured = (anchor, PoolEntry(render_candidate(WEIGHTS, "compile-default"), 1.2),
                PoolEntry(render_candidate(WEIGHTS, "inductor[cd]"), 1.3),
                PoolEntry(render_candidate(WEIGHTS, "inductor[freezing]"), 1.5))
    # the singles not yet judged come first (registry order), then the best single plus one setting
    got = [c.meta["passes"] for c in policy.generate([_prompt(WEIGHTS, measured)], n=5)[0]]
    assert got == [["inductor[gemm]"], ["inductor[padding]"], ["inductor[aggressive]"], ["inductor[cd,freezing]"],
                   ["inductor[gemm,freezing]"]]
    # a pair beat the best single: the search goes on from the pair
    better = measured + (PoolEntry(render_candidate(WEIGHTS, "inductor[gemm,freezing]"), 1.8),)
    fresh = BuiltinPolicy(device="cuda", passes=[INDUCTOR_SEARCH])
    assert fresh.generate([_prompt(WEIGHTS, better)], n=1)[0][0].meta["passes"] == ["inductor[cd,gemm,freezing]"]
    # nothing measured yet: the search has nothing to grow (the singles are passes of their own)
    assert (
        BuiltinPolicy(device="cuda", passes=[INDUCTOR_SEARCH]).generate([_prompt(WEIGHTS, (anchor,))], n=1)[0][0].error
    )


def test_the_search_runs_on_each_base_chain_and_skips_settings_that_cannot_matter():
    anchor = PoolEntry(ELEMENTWISE + "\n\nModelNew = Model\n", 1.0, reference=True)
    base = render_candidate(ELEMENTWISE, "inductor[cd]")
    pool = (anchor, PoolEntry(base, 1.4))
    got = BuiltinPolicy(device="cuda", passes=[INDUCTOR_SEARCH]).generate([_prompt(ELEMENTWISE, pool)], n=2)[0]
    assert [c.meta.get("passes") for c in got] == [["inductor[cd,aggressive]"], None]  # no weights, no GEMMs
    assert got[1].error == "builtin: no pass left for this task"


def test_policy_names_and_cpu_passes():
    names = default_passes()
    assert names.index(INDUCTOR_SEARCH) == max(i for i, n in enumerate(names) if n.startswith("inductor[")) + 1
    cpu = BuiltinPolicy(device="cpu").passes
    assert INDUCTOR_SEARCH not in cpu and all(not pass_named(n).cuda_only for n in cpu)
    assert BuiltinPolicy(device="cuda", passes=["inductor[cd,freezing]"]).passes == ["inductor[cd,freezing]"]
    assert BuiltinPolicy(device="cuda").compiles() and BuiltinPolicy(device="cpu").compiles()
    assert not BuiltinPolicy(device="cuda", passes=["algebraic", "cudagraph", "channels-last"]).compiles()
    with pytest.raises(ValueError, match="inductor\\[SETTING"):
        BuiltinPolicy(passes=["inductor[warp]"])


def test_the_pass_order_follows_the_reference_class():
    from cudal1.policy.builtin import CLASS_FIRST, GRAPH_PASSES, default_passes, ordered_for

    names = default_passes()
    assert ordered_for(names, "") == names and ordered_for(names, "mixed") == names  # unmeasured: registry order
    for key, first in CLASS_FIRST.items():
        cls, _, work = key.partition("/")
        got = ordered_for(names, cls, work)
        assert sorted(got) == sorted(names) and got[0] == "algebraic", key
        assert got[1:1 + len(first)] == [n for n in first if n in names], key
        rest = got[1 + len(first):]
        if cls == "launch-bound":
            assert rest == [n for n in names if n in rest], key  # the others keep their order
        else:  # graphs last: the others keep their order, then the graph passes keep theirs
            assert not set(first) & set(GRAPH_PASSES), key
            split = len(rest) - len([n for n in rest if n in GRAPH_PASSES])
            assert rest[:split] == [n for n in names if n in rest and n not in GRAPH_PASSES], key
            assert rest[split:] == [n for n in names if n in GRAPH_PASSES], key
    assert ordered_for(["compile-default", "gemm-3xtf32"], "compute-bound") == ["gemm-3xtf32", "compile-default"]
    launch = ordered_for(names, "launch-bound")
    assert launch[1:4] == ["cudagraph", "compile-cudagraph", "compile-reduce-overhead"]  # graphs first there


def test_graph_passes_come_last_on_a_reference_that_keeps_the_device_busy():
    """The policy proposes in :func:`ordered_for`'s order (round 2 stacks on a winner in the same
    order): on a memory-bound reference the exec passes that are not CUDA-graph replay come before
    the ones that are; on a launch-bound one the graphs come first."""
    anchor = PoolEntry(WEIGHTS + "\n\nModelNew = Model\n", 1.0, reference=True)
    passes = ["compile-default", "cudagraph", "compile-cudagraph", "inductor[cd]", "compile-max-autotune-no-cudagraphs"]

    def proposals(cls: str, k: int) -> list[str]:
        policy = BuiltinPolicy(device="cuda", passes=passes)
        got, pool = [], (anchor,)
        for _ in range(k):
            prompt = PoolPrompt("t", "h" * 64, "s", "u", "v", task_source=WEIGHTS, pool=pool, reference_class=cls)
            c = policy.generate([prompt], n=1)[0][0]
            got += c.meta["passes"]
            pool = pool + (PoolEntry(c.code, 0.9),)  # none beats the reference: every proposal starts from it
        return got

    assert proposals("memory-bound", 5) == ["compile-default", "inductor[cd]", "compile-max-autotune-no-cudagraphs",
                                            "cudagraph", "compile-cudagraph"]
    assert proposals("", 5) == passes  # no class: the given order
    assert proposals("launch-bound", 2) == ["cudagraph", "compile-cudagraph"]


def test_a_measured_class_changes_which_pass_the_policy_proposes_first():
    anchor = PoolEntry(WEIGHTS + "\n\nModelNew = Model\n", 1.0, reference=True)
    passes = ["compile-default", "compile-max-autotune-no-cudagraphs", "cudagraph"]

    def first(cls: str) -> list[str]:
        prompt = PoolPrompt("t", "h" * 64, "s", "u", "v", task_source=WEIGHTS, pool=(anchor,), reference_class=cls)
        return BuiltinPolicy(device="cuda", passes=passes).generate([prompt], n=1)[0][0].meta["passes"]

    assert first("") == ["compile-default"]
    assert first("launch-bound") == ["cudagraph"]
    assert first("compute-bound") == ["compile-max-autotune-no-cudagraphs"]


@pytest.mark.cpu
def test_a_compute_bound_convolution_gets_the_convolution_passes_first():
    from cudal1.policy.builtin import CLASS_FIRST, default_passes, ordered_for

    names = default_passes()
    got = ordered_for(names, "compute-bound", "conv")
    assert got[:4] == ["algebraic", "cudnn-autotune", "compile-default", "channels-last"]
    assert ordered_for(names, "compute-bound", "gemm") == ordered_for(names, "compute-bound")  # no gemm entry
    assert ordered_for(names, "memory-bound", "conv") == ordered_for(names, "memory-bound")  # only compute-bound
    assert ordered_for(names, "", "conv") == names
    conv = ("import torch\nclass Model(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.conv = torch.nn.Conv2d(3, 8, 3)\n    def forward(self, x):\n        return self.conv(x)\n")
    anchor = PoolEntry(conv + "\n\nModelNew = Model\n", 1.0, reference=True)
    prompt = PoolPrompt("t", "h" * 64, "s", "u", "v", task_source=conv, pool=(anchor,), reference_class="compute-bound",
                        reference_work="conv")
    policy = BuiltinPolicy(device="cuda", passes=["compile-default", "gemm-3xtf32", "cudnn-autotune"])
    assert policy.generate([prompt], n=1)[0][0].meta["passes"] == ["cudnn-autotune"]
    assert "compute-bound/conv" in CLASS_FIRST


def test_channels_last_declines_a_reference_that_views_its_activations():
    from cudal1.policy.builtin import render_candidate

    conv = ("import torch\nclass Model(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.conv = torch.nn.Conv2d(3, 8, 3)\n    def forward(self, x):\n        return self.conv(x){}\n")
    assert render_candidate(conv.format(""), "channels-last") is not None
    assert render_candidate(conv.format(".flatten(1)"), "channels-last") is not None
    assert render_candidate(conv.format(".view(x.size(0), -1)"), "channels-last") is None  # would raise


def test_main_work_tells_convolutions_from_matrix_products_by_kernel_name():
    from cudal1.profile.model import KernelStat
    from cudal1.profile.rules import main_work

    def k(name: str, share: float) -> KernelStat:
        return KernelStat(name=name, launches=1, total_us=share, mean_us=share, share=share)

    lenet = [k("void implicit_convolve_sgemm<float, float, 1024, 5, 5>", 0.48),
             k("sm80_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nchwkcrs_nchw", 0.20),
             k("void at::native::max_pool_forward_nchw<float, int>", 0.29),
             k("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8", 0.03)]
    assert main_work(lenet) == "conv"  # an implicit GEMM named as a convolution counts as one
    assert main_work([k("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n", 0.98), k("elementwise_kernel", 0.02)]) == "gemm"
    assert main_work([k("cunn_SoftMaxForward<4, float>", 1.0)]) == ""
    assert main_work([k("ampere_sgemm_128x64_tn", 0.4), k("dgrad_engine", 0.4), k("reduce_kernel", 0.2)]) == ""
    assert main_work([]) == ""


def test_the_search_hands_the_reference_class_from_its_profile():
    from cudal1.profile.model import BoundClass, ProfileStatus, ProgramProfile
    from cudal1.search.loop import reference_class

    measured = ProgramProfile(status=ProfileStatus.OK, device="cuda", bound=BoundClass.MEMORY)
    assert reference_class({"reference": measured}) == "memory-bound"
    assert reference_class(None) == "" and reference_class({}) == ""
    assert reference_class({"reference": ProgramProfile(status=ProfileStatus.FAILED, bound=BoundClass.MEMORY)}) == ""
    from cudal1.profile.model import KernelStat
    from cudal1.search.loop import reference_work

    convs = ProgramProfile(status=ProfileStatus.OK, device="cuda", bound=BoundClass.COMPUTE,
                           kernels=[KernelStat(name="cudnn_convolve", launches=1, total_us=1, mean_us=1, share=1.0)])
    assert reference_work({"reference": convs}) == "conv"
    assert reference_work(None) == "" and reference_work({"reference": measured}) == ""


def test_an_elementwise_tail_a_fifth_of_the_kernel_time_puts_fusion_first():
    """level2/54 (a convolution, then multiply, LeakyReLU and GELU) as profiled on the H200: the
    convolution held 73%, four elementwise kernels 27%.  ``work_of`` says ``conv+tail`` and the
    order tries ``triton-fusion`` first (it read 1.19x there; the convolution entry's passes
    1.00-1.03x); one elementwise kernel, or a small share, is no tail; a launch-bound reference
    keeps its graphs first."""
    from cudal1.policy.builtin import CLASS_FIRST, default_passes, ordered_for
    from cudal1.profile.model import BoundClass, KernelStat, ProfileStatus, ProgramProfile
    from cudal1.profile.rules import fusible_tail, work_of
    from cudal1.search.loop import reference_work

    def k(name: str, share: float, launches: int = 1) -> KernelStat:
        return KernelStat(name=name, launches=launches, total_us=share * 100, mean_us=share * 100, share=share)

    conv_tail = [k("sm80_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nchwkcrs_nchw", 0.732),
                 k("void at::native::elementwise_kernel<128, 2, mul>", 0.084),
                 k("void at::native::elementwise_kernel<128, 2, add>", 0.083),
                 k("void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>", 0.05),
                 k("void at::native::vectorized_elementwise_kernel<4, leaky_relu>", 0.05)]
    assert fusible_tail(conv_tail) and work_of(conv_tail) == "conv+tail"
    assert work_of([k("sm80_xmma_gemm_f32f32_tn_n", 0.7), k("vectorized_elementwise_kernel<4, relu>", 0.3)]) == "gemm"
    assert work_of([k("sm80_xmma_gemm_f32f32_tn_n", 0.7), k("vectorized_elementwise_kernel<4, relu>", 0.3, 2)]) \
        == "gemm+tail"  # the same kernel launched twice is a chain too
    assert work_of([k("sm80_xmma_gemm_f32f32_tn_n", 0.9), k("elementwise_kernel<a>", 0.05),
                    k("triton_poi_fused_add_0", 0.05)]) == "gemm"  # a tenth: no tail
    assert work_of([k("elementwise_kernel<a>", 0.5), k("elementwise_kernel<b>", 0.5)]) == "+tail"
    measured = ProgramProfile(status=ProfileStatus.OK, device="cuda", bound=BoundClass.COMPUTE, kernels=conv_tail)
    assert reference_work({"reference": measured}) == "conv+tail"

    names = default_passes()
    got = ordered_for(names, "compute-bound", "conv+tail")
    assert got[:3] == ["algebraic", "triton-fusion", "cudnn-autotune"]
    assert got[3:3 + len(CLASS_FIRST["compute-bound/conv"]) - 1] == list(CLASS_FIRST["compute-bound/conv"][1:])
    assert ordered_for(names, "mixed", "+tail")[:2] == ["algebraic", "triton-fusion"]  # no entry, a tail: fusion
    assert ordered_for(names, "mixed", "+tail")[2:] == [n for n in names if n not in ("algebraic", "triton-fusion")]
    assert ordered_for(names, "memory-bound", "+tail") == ordered_for(names, "memory-bound")  # fusion first already
    assert ordered_for(names, "launch-bound", "+tail") == ordered_for(names, "launch-bound")
    assert ordered_for(names, "", "+tail") == names  # unmeasured: the registry's order
    assert ordered_for(names, "compute-bound", "conv")[1:3] == ["cudnn-autotune", "compile-default"]  # no tail
