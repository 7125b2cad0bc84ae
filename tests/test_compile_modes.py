"""compile_modes + cuda_graph: one vocabulary and one CUDA-graph wrapper for the judge's baselines
and the builtin policy's exec passes (CPU: names, generated source, eager fallback)."""

from __future__ import annotations

import ast
import inspect

import pytest
import torch

from cudal1.compile_modes import (
    ALIASES,
    COMPILE_CUDAGRAPH,
    COMPILE_MODES,
    CUDA_GRAPH,
    EAGER,
    INDUCTOR_SETTINGS,
    canonical,
    cuda_graph_source,
    inductor_name,
)
from cudal1.cuda_graph import CudaGraphReplay
from cudal1.harness import baselines
from cudal1.policy.builtin import PASSES, render_candidate

TASK = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        return torch.relu(self.lin(x)), x.sum()


def get_inputs():
    return [torch.randn(4, 8)]


def get_init_inputs():
    return [8]
"""


def test_baselines_and_builtin_exec_passes_share_the_names():
    exec_passes = {n for n, p in PASSES.items() if p.kind == "exec"}
    candidates_only = {COMPILE_CUDAGRAPH} | {inductor_name([s]) for s in INDUCTOR_SETTINGS}
    assert exec_passes == set(COMPILE_MODES) | {CUDA_GRAPH} | candidates_only
    assert not candidates_only & set(baselines.MODES)  # no baseline of that name: nothing to confuse
    assert list(baselines.MODES) == [EAGER, *COMPILE_MODES, CUDA_GRAPH]
    for name, mode in COMPILE_MODES.items():
        assert PASSES[name].description == mode.description and PASSES[name].cuda_only == mode.cuda_only


@pytest.mark.parametrize("name", list(COMPILE_MODES))
def test_compile_candidates_use_the_vocabularys_torch_mode(name):
    tree = ast.parse(render_candidate(TASK, name))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "torch.compile"]
    (call,) = calls
    modes = [k.value.value for k in call.keywords if k.arg == "mode"]
    assert modes == ([COMPILE_MODES[name].torch_mode] if COMPILE_MODES[name].torch_mode else [])


def test_old_baseline_names_resolve_and_unknown_names_fail():
    assert {old: canonical(old) for old in ALIASES} == {
        "compile": "compile-default", "compile-ro": "compile-reduce-overhead", "max-autotune": "compile-max-autotune"}
    assert canonical("cudagraph") == CUDA_GRAPH
    with pytest.raises(ValueError, match="warp"):
        canonical("warp")
    assert baselines.check_modes(["eager", "compile", "compile-ro", "cudagraph"], "cpu") == ["eager", "compile-default"]
    assert baselines.check_modes(["compile-ro", "cudagraph"], "cuda") == ["compile-reduce-overhead", "cudagraph"]
    with pytest.raises(ValueError, match="warp"):
        baselines.check_modes(["eager", "warp"], "cpu")


def test_the_cudagraph_pass_embeds_the_one_wrapper():
    source = cuda_graph_source()
    assert source == inspect.getsource(CudaGraphReplay)
    code = render_candidate(TASK, "cudagraph")
    assert source in code
    assert sum(isinstance(n, ast.ClassDef) and n.name == "CudaGraphReplay" for n in ast.walk(ast.parse(code))) == 1
    model = baselines.GraphedModel(torch.nn.Linear(2, 2))
    assert isinstance(model.replay, CudaGraphReplay) and model.replay.clone_outputs is False


def test_generated_cudagraph_candidate_falls_back_to_eager_off_cuda():
    ns: dict = {}
    exec(compile(render_candidate(TASK, "cudagraph"), "cand", "exec"), ns)
    torch.manual_seed(0)
    ref = ns["Model"](8)
    torch.manual_seed(0)
    new = ns["ModelNew"](8)
    x = torch.randn(4, 8)
    for got, want in zip(new(x), ref(x)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert new._replay.graph is None  # CPU inputs never capture


def test_wrapper_clones_outputs_unless_told_not_to():
    calls = []

    def fn(x):
        calls.append(x)
        return x * 2

    assert torch.equal(CudaGraphReplay(fn)(torch.ones(3)), torch.full((3,), 2.0)) and len(calls) == 1
    assert CudaGraphReplay(fn, clone_outputs=False)("not a tensor") == "not a tensornot a tensor"  # no tensors: eager


def test_only_the_outermost_inductor_compile_is_marked_however_it_ends(monkeypatch):
    """``child.compiling.install`` wraps the ``compile_fx`` Inductor's backend calls: one mark
    on and off per outermost call (it calls itself for some graphs), off even when it raises;
    installing twice wraps once."""
    import torch._inductor.compile_fx as compile_fx_module

    from cudal1.harness.child import compiling

    calls: list[str] = []

    def fake(graph, inputs, depth=0):
        calls.append(f"compile {depth}")
        if graph == "fail":
            raise RuntimeError("lowering failed")
        return compile_fx_module.compile_fx(graph, inputs, depth + 1) if depth < 2 else "compiled"

    monkeypatch.setattr(compile_fx_module, "compile_fx", fake)
    marks: list[bool] = []
    mark = lambda on, off_lease: marks.append(on)  # noqa: E731
    assert compiling.install(mark) == [] and compiling.install(mark) is None
    assert compile_fx_module.compile_fx("graph", []) == "compiled"
    assert marks == [True, False] and calls == ["compile 0", "compile 1", "compile 2"]
    with pytest.raises(RuntimeError, match="lowering failed"):
        compile_fx_module.compile_fx("fail", [])
    assert marks == [True, False, True, False]


def test_inductors_gpu_steps_are_bracketed_only_in_a_compile_off_the_lease(monkeypatch):
    """With a ``gpu`` callback, the GPU steps :data:`compiling.GPU_STEPS` names are wrapped: inside
    an outermost compile that does not autotune (``off_lease``) the first step opens
    ``gpu(True)`` and the last to end ``gpu(False)``, however it ends; a compile whose patches ask
    for max-autotune keeps its lease (no bracket, ``off_lease`` false); outside a compile a step
    runs as it is.  A first-call step (:data:`compiling.GPU_FIRST_STEPS`) is bracketed until a
    call with the same arguments has returned.  Steps this torch lacks are skipped."""
    import sys
    import types

    import torch._inductor.compile_fx as compile_fx_module

    from cudal1.harness.child import compiling

    steps = types.ModuleType("fake_inductor_steps")

    class Bench:
        @staticmethod
        def example(n):
            return n + 1

        @classmethod
        def run(cls, fail=False):
            if fail:
                raise RuntimeError("benchmark failed")
            return Bench.example(1)  # a step inside a step: one bracket

    steps.Bench = Bench
    steps.fold = lambda: "folded"
    set_up: list[str] = []

    def setup(device=None):
        set_up.append(device)
        if device == "broken":
            raise RuntimeError("set-up failed")

    steps.setup = setup
    monkeypatch.setitem(sys.modules, "fake_inductor_steps", steps)
    monkeypatch.setattr(compiling, "GPU_STEPS", (("fake_inductor_steps", "Bench.example"),
                                                 ("fake_inductor_steps", "Bench.run"),
                                                 ("fake_inductor_steps", "fold"),
                                                 ("fake_inductor_steps", "Missing.step"),
                                                 ("no_such_module_here", "step")))
    monkeypatch.setattr(compiling, "GPU_FIRST_STEPS", (("fake_inductor_steps", "setup"),))
    events: list[tuple] = []

    def fake(graph, inputs, config_patches=None):
        results = [steps.Bench.run(), steps.fold()]
        try:
            steps.Bench.run(fail=True)
        except RuntimeError:
            pass
        for device in ("cuda", "cuda", "broken", "broken"):
            try:
                steps.setup(device)
            except RuntimeError:
                pass
        return results

    monkeypatch.setattr(compile_fx_module, "compile_fx", fake)
    found = compiling.install(lambda on, off: events.append(("compiling", on, off)),
                              lambda on: events.append(("gpu", on)))
    assert found == ["fake_inductor_steps:Bench.example", "fake_inductor_steps:Bench.run", "fake_inductor_steps:fold",
                     "fake_inductor_steps:setup"]
    assert steps.fold() == "folded" and events == []  # outside a compile: as it is
    assert compile_fx_module.compile_fx("graph", []) == [2, "folded"]
    bracket = [("gpu", True), ("gpu", False)]
    # run, fold, the failed run; set-up on cuda once, then on "broken" twice (it never returned)
    assert events == [("compiling", True, True), *bracket * 3, *bracket, *bracket * 2, ("compiling", False, True)]
    assert set_up == ["cuda", "cuda", "broken", "broken"]
    events.clear()
    compile_fx_module.compile_fx("graph", [])  # the set-up on cuda has returned once: no bracket now
    assert events == [("compiling", True, True), *bracket * 3, *bracket * 2, ("compiling", False, True)]
    events.clear()
    compile_fx_module.compile_fx("graph", [], config_patches={"max_autotune": True})
    assert events == [("compiling", True, False), ("compiling", False, False)]


def test_triton_compiles_are_marked_off_the_lease_only_when_slow_on_the_main_thread_and_alone(monkeypatch):
    """``install(triton=True)`` wraps every name of Triton's compile with one function: a compile
    still running after :data:`compiling.TRITON_GRACE_S` on the main thread opens a span off the
    lease (on, then off when it ends, however it ends); a fast one (a cache hit) and one on
    another thread send nothing; inside a graph's compile it is part of that span."""
    import sys
    import threading
    import time
    import types

    import torch._inductor.compile_fx as compile_fx_module

    from cudal1.harness.child import compiling

    def triton_compile(src, fail=False):
        time.sleep(0.3 if src == "slow" else 0.0)
        if fail:
            raise RuntimeError("ptxas failed")
        return f"binary of {src}"

    package, inner = types.ModuleType("fake_triton"), types.ModuleType("fake_triton.compiler")
    package.compile = inner.compile = triton_compile
    monkeypatch.setitem(sys.modules, "fake_triton", package)
    monkeypatch.setitem(sys.modules, "fake_triton.compiler", inner)
    monkeypatch.setattr(compiling, "TRITON_COMPILES", (("fake_triton.compiler", "compile"), ("fake_triton", "compile"),
                                                       ("fake_triton", "missing")))
    monkeypatch.setattr(compiling, "TRITON_GRACE_S", 0.05)
    events: list[tuple] = []
    notify = lambda on, off: events.append(("compiling", on, off))  # noqa: E731
    assert compiling.install(notify, lambda on: None, torch_compile=False, triton=True) == []
    assert package.compile is inner.compile and package.compile is not triton_compile
    assert compiling.install(notify, lambda on: None, torch_compile=False, triton=True) is None  # wrapped already

    assert package.compile("cached") == "binary of cached" and events == []
    assert package.compile("slow") == "binary of slow"
    assert events == [("compiling", True, True), ("compiling", False, True)]
    events.clear()
    with pytest.raises(RuntimeError, match="ptxas failed"):
        inner.compile("slow", fail=True)
    assert events == [("compiling", True, True), ("compiling", False, True)]
    events.clear()
    worker = threading.Thread(target=package.compile, args=("slow",))
    worker.start()
    worker.join()
    assert events == []

    def fake_compile_fx(graph, inputs, config_patches=None):
        return package.compile("slow")

    monkeypatch.setattr(compile_fx_module, "compile_fx", fake_compile_fx)
    monkeypatch.setattr(package, "compile", triton_compile)  # unwrapped again: one install wraps both
    monkeypatch.setattr(inner, "compile", triton_compile)
    compiling.install(notify, lambda on: None, torch_compile=True, triton=True)
    assert compile_fx_module.compile_fx("graph", []) == "binary of slow"
    assert events == [("compiling", True, True), ("compiling", False, True)]  # one span: the graph's


def test_an_autotuning_compile_runs_off_the_lease_only_where_its_gpu_steps_are_all_wrapped(monkeypatch):
    """``install(release_autotuning=True)`` lets a compile whose patches ask for max-autotune run
    off the lease, its GPU steps bracketed as any compile's, only where every group of
    :data:`compiling.AUTOTUNING_NEEDS` was wrapped (:data:`compiling.RELEASE_AUTOTUNING`); where one
    is missing (another torch), or without the setting, it keeps its lease."""
    import sys
    import types

    import torch._inductor.compile_fx as compile_fx_module

    from cudal1.harness.child import compiling

    fake = types.ModuleType("fake_autotuning")
    fake.bench = lambda: 0.5
    fake.inputs = lambda: "random inputs"
    monkeypatch.setitem(sys.modules, "fake_autotuning", fake)
    monkeypatch.setattr(compiling, "GPU_STEPS", (("fake_autotuning", "bench"), ("fake_autotuning", "inputs")))
    monkeypatch.setattr(compiling, "GPU_FIRST_STEPS", ())
    monkeypatch.setattr(compiling, "RELEASE_AUTOTUNING", False)
    events: list[tuple] = []

    def fake_compile(graph, inputs, config_patches=None):
        return fake.inputs(), fake.bench()

    def install(needs, release=True):
        monkeypatch.setattr(compile_fx_module, "compile_fx", fake_compile)
        monkeypatch.setattr(fake, "bench", lambda: 0.5)
        monkeypatch.setattr(fake, "inputs", lambda: "random inputs")
        monkeypatch.setattr(compiling, "AUTOTUNING_NEEDS", needs)
        found = compiling.install(lambda on, off: events.append(("compiling", on, off)),
                                  lambda on: events.append(("gpu", on)), release_autotuning=release)
        events.clear()
        assert compile_fx_module.compile_fx("graph", [], config_patches={"max_autotune": True}) == \
            ("random inputs", 0.5)
        return found

    covered = (("fake_autotuning:bench", "elsewhere:bench"), ("fake_autotuning:inputs",))
    assert install(covered) == ["fake_autotuning:bench", "fake_autotuning:inputs"]
    assert compiling.RELEASE_AUTOTUNING and compiling.autotuning_covered(["fake_autotuning:bench",
                                                                          "fake_autotuning:inputs"])
    bracket = [("gpu", True), ("gpu", False)]
    assert events == [("compiling", True, True), *bracket * 2, ("compiling", False, True)]
    install(covered + (("fake_autotuning:missing",),))  # a step this torch lacks: the lease is kept
    assert not compiling.RELEASE_AUTOTUNING
    assert events == [("compiling", True, False), ("compiling", False, False)]
    install(covered, release=False)  # EvalConfig.autotune_off_lease false
    assert events == [("compiling", True, False), ("compiling", False, False)]


def test_a_slow_triton_compile_inside_a_gpu_step_gives_the_steps_lease_back_until_it_ends(monkeypatch):
    """Inside a compile off the lease, a GPU step whose first call compiles a Triton kernel (a
    fused kernel max-autotune times) gives the lease back once the compile has run
    :data:`compiling.TRITON_GRACE_S` (``gpu(False)``) and takes it again before the step runs on
    (``gpu(True)``), however the compile ends; a fast compile (a cache hit) changes nothing, and
    with no grace the lease goes at once."""
    import sys
    import time
    import types

    import torch._inductor.compile_fx as compile_fx_module

    from cudal1.harness.child import compiling

    def triton_compile(src, fail=False):
        time.sleep(0.0 if src == "cached" else 0.3)
        if fail:
            raise RuntimeError("ptxas failed")
        return f"binary of {src}"

    triton = types.ModuleType("fake_triton_in_step")
    triton.compile = triton_compile
    steps = types.ModuleType("fake_fused_bench")

    def bench(src, fail=False):
        try:
            triton.compile(src, fail=fail)
        except RuntimeError:
            pass
        return f"timed {src}"

    steps.bench = bench
    monkeypatch.setitem(sys.modules, "fake_triton_in_step", triton)
    monkeypatch.setitem(sys.modules, "fake_fused_bench", steps)
    monkeypatch.setattr(compiling, "TRITON_COMPILES", (("fake_triton_in_step", "compile"),))
    monkeypatch.setattr(compiling, "GPU_STEPS", (("fake_fused_bench", "bench"),))
    monkeypatch.setattr(compiling, "GPU_FIRST_STEPS", ())
    monkeypatch.setattr(compiling, "RELEASE_AUTOTUNING", False)
    monkeypatch.setattr(compiling, "TRITON_GRACE_S", 0.05)
    events: list[tuple] = []

    def fake_compile(graph, inputs, config_patches=None):
        return [steps.bench(src, fail=src == "broken") for src in graph]

    monkeypatch.setattr(compile_fx_module, "compile_fx", fake_compile)
    compiling.install(lambda on, off: events.append(("compiling", on, off)),
                      lambda on: events.append(("gpu", on)), triton=True)
    step = [("gpu", True), ("gpu", False)]
    assert compile_fx_module.compile_fx(["cached"], []) == ["timed cached"]
    assert events == [("compiling", True, True), *step, ("compiling", False, True)]
    events.clear()
    compile_fx_module.compile_fx(["slow", "broken"], [])
    paused = [("gpu", True), ("gpu", False), ("gpu", True), ("gpu", False)]
    assert events == [("compiling", True, True), *paused, *paused, ("compiling", False, True)]
    events.clear()
    monkeypatch.setattr(compiling, "TRITON_GRACE_S", 0)
    compile_fx_module.compile_fx(["cached"], [])
    assert events == [("compiling", True, True), *paused, ("compiling", False, True)]


def test_cpu_steps_give_the_lease_back_only_inside_a_compile_that_keeps_it(monkeypatch):
    """With a ``cpu`` callback, :data:`compiling.CPU_STEPS` are wrapped: inside an autotuning
    compile (the span keeps its lease) the first step opens ``cpu(True)`` and the last to end
    ``cpu(False)``, however it ends; a step that makes the step (``make_precompile_fn``) has its
    returned wait bracketed; in a compile off the lease or outside a compile they run as they are."""
    import dataclasses
    import sys
    import types

    import torch._inductor.compile_fx as compile_fx_module

    from cudal1.harness.child import compiling

    fake = types.ModuleType("fake_inductor_cpu")

    class Pool:
        def wait(self, scope):
            scope["waited"] = True

    @dataclasses.dataclass(frozen=True)
    class Precompile:  # as torch's PrecompileFunction: a callable that carries its cache key
        fn: object
        precompile_key: str | None = None

        def __call__(self):
            return self.fn()

    class Selector:
        @classmethod
        def make_precompile_fn(cls, choices):
            def wait_on_futures():
                if choices == "broken":
                    raise RuntimeError("precompile failed")
                return {c: 0.1 for c in choices}

            return Precompile(wait_on_futures, f"key of {choices}")

    fake.Pool, fake.Selector = Pool, Selector
    monkeypatch.setitem(sys.modules, "fake_inductor_cpu", fake)
    monkeypatch.setattr(compiling, "GPU_STEPS", ())
    monkeypatch.setattr(compiling, "GPU_FIRST_STEPS", ())
    monkeypatch.setattr(compiling, "CPU_STEPS", (("fake_inductor_cpu", "Pool.wait", False),
                                                 ("fake_inductor_cpu", "Selector.make_precompile_fn", True),
                                                 ("fake_inductor_cpu", "Missing.wait", False)))
    events: list[tuple] = []

    def fake_compile(graph, inputs, config_patches=None):
        scope: dict = {}
        fake.Pool().wait(scope)
        timings = fake.Selector.make_precompile_fn(["a", "b"])()
        try:
            fake.Selector.make_precompile_fn("broken")()
        except RuntimeError:
            pass
        return scope, timings

    monkeypatch.setattr(compile_fx_module, "compile_fx", fake_compile)
    found = compiling.install(lambda on, off: events.append(("compiling", on, off)),
                              lambda on: events.append(("gpu", on)), cpu=lambda on: events.append(("cpu", on)))
    assert found == ["fake_inductor_cpu:Pool.wait", "fake_inductor_cpu:Selector.make_precompile_fn"]
    assert fake.Selector.make_precompile_fn(["a"])() == {"a": 0.1} and events == []  # outside a compile
    assert fake.Selector.make_precompile_fn(["a"]).precompile_key == "key of ['a']"
    assert compile_fx_module.compile_fx("g", [], config_patches={"max_autotune": True}) == (
        {"waited": True}, {"a": 0.1, "b": 0.1})
    cpu = [("cpu", True), ("cpu", False)]
    assert events == [("compiling", True, False), *cpu * 3, ("compiling", False, False)]
    events.clear()
    compile_fx_module.compile_fx("g", [])  # off the lease: nothing to give back
    assert events == [("compiling", True, True), ("compiling", False, True)]


def test_a_triton_autotuners_timings_are_bracketed_alone_on_the_main_thread_outside_a_span(monkeypatch):
    """With ``alone``, :data:`compiling.AUTOTUNE_STEPS` (the autotuner's timing of one choice) are
    wrapped: on the main thread, outside any compile, each timing is bracketed ``alone(True)`` /
    ``alone(False)``, however it ends; on another thread or inside a compile it runs as it is."""
    import sys
    import threading
    import types

    import torch._inductor.compile_fx as compile_fx_module

    from cudal1.harness.child import compiling

    fake = types.ModuleType("fake_autotuner")

    class Autotuner:
        def _bench(self, *args, config):
            if config == "bad":
                raise RuntimeError("out of resources")
            return [float(config)]

    fake.Autotuner = Autotuner
    monkeypatch.setitem(sys.modules, "fake_autotuner", fake)
    monkeypatch.setattr(compiling, "TRITON_COMPILES", ())
    monkeypatch.setattr(compiling, "GPU_STEPS", ())
    monkeypatch.setattr(compiling, "GPU_FIRST_STEPS", ())
    monkeypatch.setattr(compiling, "CPU_STEPS", ())
    monkeypatch.setattr(compiling, "AUTOTUNE_STEPS", (("fake_autotuner", "Autotuner._bench"),))
    events: list[tuple] = []

    def fake_compile(graph, inputs, config_patches=None):
        return Autotuner()._bench(config="3")

    monkeypatch.setattr(compile_fx_module, "compile_fx", fake_compile)
    found = compiling.install(lambda on, off: events.append(("compiling", on, off)),
                              lambda on: events.append(("gpu", on)), triton=True,
                              alone=lambda on: events.append(("alone", on)))
    assert found == ["fake_autotuner:Autotuner._bench"]
    tuner = Autotuner()
    assert [tuner._bench(config=c) for c in ("1", "2")] == [[1.0], [2.0]]
    with pytest.raises(RuntimeError, match="out of resources"):
        tuner._bench(config="bad")
    assert events == [("alone", True), ("alone", False)] * 3
    events.clear()
    worker = threading.Thread(target=tuner._bench, kwargs={"config": "4"})
    worker.start()
    worker.join()
    assert events == []
    assert compile_fx_module.compile_fx("g", []) == [3.0]  # Inductor's own: not a candidate's autotuner
    assert events == [("compiling", True, True), ("compiling", False, True)]


def test_inductors_run_time_autotuners_are_bracketed_alone_only_under_torch_compile(monkeypatch):
    """:data:`compiling.AUTOTUNE_STEPS` also names Inductor's choices at a kernel's first launch
    (several configs timed, coordinate descent): this torch has each of them; they are wrapped only
    where the candidate calls torch.compile (a Triton-only candidate's process does not import
    Inductor's runtime for them), and a first launch outside any compile is bracketed alone."""
    import sys
    import types

    import torch._inductor.compile_fx as compile_fx_module

    from cudal1.harness.child import compiling

    inductors = [(m, p) for m, p in compiling.AUTOTUNE_STEPS if m.startswith("torch._inductor")]
    assert len(inductors) == 2 and all(compiling._attribute(m, p) is not None for m, p in inductors)
    fake_triton, fake_inductor = types.ModuleType("fake_triton_tuner"), types.ModuleType("torch._inductor.fake_tuner")

    class Autotuner:
        def _bench(self, config):
            return [float(config)]

    class CachingAutotuner:
        def benchmark_all_configs(self, *args):
            return {"a": 1.0}

    fake_triton.Autotuner, fake_inductor.CachingAutotuner = Autotuner, CachingAutotuner
    monkeypatch.setitem(sys.modules, "fake_triton_tuner", fake_triton)
    monkeypatch.setitem(sys.modules, "torch._inductor.fake_tuner", fake_inductor)
    for name in ("TRITON_COMPILES", "GPU_STEPS", "GPU_FIRST_STEPS", "CPU_STEPS"):
        monkeypatch.setattr(compiling, name, ())
    monkeypatch.setattr(compiling, "AUTOTUNE_STEPS", (("fake_triton_tuner", "Autotuner._bench"),
                                                      ("torch._inductor.fake_tuner",
                                                       "CachingAutotuner.benchmark_all_configs")))
    monkeypatch.setattr(compile_fx_module, "compile_fx", lambda graph, inputs, config_patches=None:
                        CachingAutotuner().benchmark_all_configs())
    events: list[tuple] = []

    def install(torch_compile):
        return compiling.install(lambda on, off: events.append(("compiling", on, off)), lambda on: None,
                                 torch_compile=torch_compile, triton=True,
                                 alone=lambda on: events.append(("alone", on)))

    assert install(False) == ["fake_triton_tuner:Autotuner._bench"]
    assert CachingAutotuner().benchmark_all_configs() == {"a": 1.0} and events == []
    assert install(True) == ["torch._inductor.fake_tuner:CachingAutotuner.benchmark_all_configs"]
    assert CachingAutotuner().benchmark_all_configs() == {"a": 1.0}
    assert events == [("alone", True), ("alone", False)]
    events.clear()
    compile_fx_module.compile_fx("g", [])  # inside a compile: the compile's own steps, not alone
    assert events == [("compiling", True, True), ("compiling", False, True)]


def test_a_kernel_launch_that_times_nothing_opens_no_alone_bracket(monkeypatch):
    """Inductor's tuning entry points run on launches that make no choice (a Triton template under
    coordinate descent calls ``coordinate_descent_tuning`` on every launch, which returns at once):
    only the timing of a config (``CachingAutotuner.bench``) is bracketed, so such a launch neither
    drains the GPU nor asks for the lease; a launch that tunes gets one bracket per timing, and
    ``benchmark_all_configs`` one over all of its timings (the brackets nest)."""
    import sys
    import types

    import torch._inductor.compile_fx as compile_fx_module

    from cudal1.harness.child import compiling

    fake = types.ModuleType("torch._inductor.fake_heuristics")

    class CachingAutotuner:
        tunes = False

        def bench(self, launcher):
            return float(launcher)

        def coordinate_descent_tuning(self, launcher):
            if not self.tunes:
                return launcher
            return min((launcher, launcher + 1), key=self.bench)

        def benchmark_all_configs(self):
            return {c: self.bench(c) for c in (1, 2, 3)}

    fake.CachingAutotuner = CachingAutotuner
    monkeypatch.setitem(sys.modules, "torch._inductor.fake_heuristics", fake)
    for name in ("TRITON_COMPILES", "GPU_STEPS", "GPU_FIRST_STEPS", "CPU_STEPS"):
        monkeypatch.setattr(compiling, name, ())
    steps = tuple(("torch._inductor.fake_heuristics", p) for m, p in compiling.AUTOTUNE_STEPS
                  if m.startswith("torch._inductor"))
    monkeypatch.setattr(compiling, "AUTOTUNE_STEPS", steps)
    monkeypatch.setattr(compile_fx_module, "compile_fx", lambda graph, inputs, config_patches=None: None)
    events: list[bool] = []
    compiling.install(lambda on, off: None, lambda on: None, torch_compile=True, triton=True, alone=events.append)
    tuner = CachingAutotuner()
    for _ in range(5):  # a template's launches: nothing timed, no bracket
        assert tuner.coordinate_descent_tuning(7) == 7
    assert events == []
    tuner.tunes = True
    assert tuner.coordinate_descent_tuning(7) == 7
    assert events == [True, False, True, False]  # one per timing
    events.clear()
    assert tuner.benchmark_all_configs() == {1: 1.0, 2: 2.0, 3: 3.0}
    assert events == [True, False]  # one over the three timings
