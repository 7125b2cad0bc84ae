"""The builtin policy's torch.fx graph rewrites (cudal1.rewrite), on bundled tasks (CPU, real child processes).

Each task in ``tests/fixtures/rewrite`` names on its first line (``# applies: ...``) exactly the
rewrites that must apply; every other one must decline.  The rewritten model must give
the reference's outputs on real inputs, the generated module must not import cudal1, and the
policy must compose passes across rounds.
"""

from __future__ import annotations

import ast
import json
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from cudal1.policy.base import PoolEntry, PoolPrompt
from cudal1.policy.builtin import PASSES, BuiltinPolicy, compose, passes_in
from cudal1.rewrite import ALGEBRAIC_REWRITES, REWRITE_NAMES, rewrite_task

FIXTURES = Path(__file__).parent / "fixtures" / "rewrite"
TASKS = sorted(FIXTURES.glob("*.py"))


def expected_passes(path: Path) -> list[str]:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# applies:"), path
    names = first.split(":", 1)[1].split()
    assert all(n in REWRITE_NAMES for n in names), names
    return names


def load(source: str, name: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    exec(compile(source, name, "exec"), mod.__dict__)
    return mod


def outputs(mod: types.ModuleType, cls: str, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    model = getattr(mod, cls)(*mod.get_init_inputs())
    torch.manual_seed(seed + 1)
    return model(*mod.get_inputs())


@pytest.fixture(scope="module")
def outcomes():
    """Each task's outcome; their tracing children (each imports torch, ~3 s) run two at a time."""
    with ThreadPoolExecutor(2) as pool:
        return dict(zip((p.name for p in TASKS), pool.map(lambda p: rewrite_task(p.read_text()), TASKS)))


@pytest.mark.cpu
@pytest.mark.parametrize("path", TASKS, ids=lambda p: p.stem)
def test_rewrites_apply_exactly_where_their_pattern_is(path, outcomes):
    outcome = outcomes[path.name]
    want = expected_passes(path)
    assert sorted(outcome.applied) == sorted(want), (outcome.applied, outcome.declined, outcome.error)
    for name in set(ALGEBRAIC_REWRITES) - set(want):
        assert name in outcome.declined, name
    if not want:
        assert not outcome.ok and outcome.error == "no rewrite applies"


@pytest.mark.cpu
@pytest.mark.parametrize("path", [p for p in TASKS if expected_passes(p)], ids=lambda p: p.stem)
def test_rewritten_model_computes_the_reference_function(path, outcomes):
    source = path.read_text()
    code = compose(source, None, "algebraic")
    assert code is not None and passes_in(code) == ["algebraic"]
    tree = ast.parse(code)
    assert not any(isinstance(n, (ast.Import, ast.ImportFrom)) and "cudal1" in ast.unparse(n) for n in ast.walk(tree))
    mod = load(code, path.stem)
    for seed in (0, 7):  # different weights and inputs: nothing is specialised to one draw
        expected, got = outputs(mod, "Model", seed), outputs(mod, "ModelNew", seed)
        assert got.shape == expected.shape and got.dtype == expected.dtype
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    for note in (n for notes in outcomes[path.name].notes.values() for n in notes):
        assert note in code  # the class docstring says what was rewritten


@pytest.mark.cpu
def test_folded_weights_follow_parameter_updates():
    source = (FIXTURES / "sum_of_linear.py").read_text()
    mod = load(compose(source, None, "algebraic"), "m")
    torch.manual_seed(0)
    ref, new = mod.Model(*mod.get_init_inputs()), None
    torch.manual_seed(0)
    new = mod.ModelNew(*mod.get_init_inputs())
    x = torch.rand(4, 128)
    torch.testing.assert_close(new(x), ref(x))
    with torch.no_grad():  # an in-place update must invalidate the folded weights
        ref.weight.mul_(-3.0)
        new.weight.mul_(-3.0)
    torch.testing.assert_close(new(x), ref(x), rtol=1e-4, atol=1e-4)
    new.double()  # so must a cast
    torch.testing.assert_close(new(x.double()), ref.double()(x.double()), rtol=1e-6, atol=1e-6)


@pytest.mark.cpu
def test_folded_batchnorm_guards_training_mode():
    source = (FIXTURES / "batchnorm_eval.py").read_text()
    code = compose(source, None, "algebraic")
    assert "if self.bn.training or self.bn1.training:" in code
    mod = load(code, "bn")
    torch.manual_seed(0)
    ref = mod.Model(*mod.get_init_inputs())
    new = mod.ModelNew(*mod.get_init_inputs())
    new.load_state_dict(ref.state_dict())
    x = torch.randn(4, 3, 8, 8)
    torch.testing.assert_close(new(x), ref(x), rtol=1e-5, atol=1e-5)
    ref.train(), new.train()  # batch statistics: the reference forward runs, running stats update alike
    torch.testing.assert_close(new(x), ref(x), rtol=0, atol=0)
    torch.testing.assert_close(new.bn.running_mean, ref.bn.running_mean, rtol=0, atol=0)
    ref.eval(), new.eval()  # the updated statistics are folded again
    torch.testing.assert_close(new(x), ref(x), rtol=1e-5, atol=1e-5)
    training = source.replace("        self.eval()\n", "")
    assert "fold-batchnorm" not in rewrite_task(training).applied  # batch statistics cannot be folded


@pytest.mark.cpu
def test_folding_is_declined_when_it_would_cost_more():
    source = (FIXTURES / "fold_two_linears.py").read_text().replace("return [48, 256, 24]", "return [512, 16, 512]")
    outcome = rewrite_task(source)
    assert "fold-linear" not in outcome.applied  # 512→16→512 is cheaper than one 512x512 map


@pytest.mark.cpu
def test_untraceable_task_is_declined_with_a_reason():
    source = (FIXTURES / "residual_scale.py").read_text().replace(
        "x = self.matmul(x)", "x = self.matmul(x)\n        if x.sum() > 0:\n            x = -x")
    outcome = rewrite_task(source)
    assert not outcome.ok and "torch.fx cannot trace" in outcome.error
    assert compose(source, None, "algebraic") is None


@pytest.mark.cpu
def test_outcomes_are_cached_on_disk_keyed_by_source_and_passes(tmp_path, monkeypatch):
    import cudal1.rewrite as rw

    monkeypatch.setenv("CUDAL1_CACHE_DIR", str(tmp_path))
    source = (FIXTURES / "sum_of_linear.py").read_text()
    first = rewrite_task(source)
    assert first.ok and len(list((tmp_path / "rewrites").glob("*.json"))) == 1

    def no_child(*_args, **_kwargs):
        raise AssertionError("a cached outcome must not trace again")

    monkeypatch.setattr(rw, "_run_child", no_child)
    assert rewrite_task(source) == first  # from disk, no child process
    with pytest.raises(AssertionError):
        rewrite_task(source, ALGEBRAIC_REWRITES[:2])  # other passes: another key
    with pytest.raises(AssertionError):
        rewrite_task(source, cache=False)
    monkeypatch.undo()
    monkeypatch.setenv("CUDAL1_CACHE_DIR", str(tmp_path))
    entry = next((tmp_path / "rewrites").glob("*.json"))
    entry.write_text("{not json")  # a damaged entry is traced again and rewritten
    assert rewrite_task(source) == first and json.loads(entry.read_text())["class_source"] == first.class_source
    crashed = "import torch\nraise SystemExit(3)\n"
    assert not rewrite_task(crashed).ok
    assert len(list((tmp_path / "rewrites").glob("*.json"))) == 1  # child crashes are not cached
    slow = source.replace("def get_inputs():", "import time\ntime.sleep(60)\n\n\ndef get_inputs():")
    timed_out = rewrite_task(slow, timeout_s=1)
    assert "timed out" in timed_out.error and len(list((tmp_path / "rewrites").glob("*.json"))) == 2
    monkeypatch.setattr(rw, "_run_child", no_child)
    assert rewrite_task(slow, timeout_s=1) == timed_out  # a timeout is cached: later runs do not wait again


@pytest.mark.cpu
def test_variants_of_one_task_share_one_child_and_match_single_runs(tmp_path, monkeypatch):
    import cudal1.rewrite as rw

    source = (FIXTURES / "residual_scale.py").read_text()
    variants = [ALGEBRAIC_REWRITES, ALGEBRAIC_REWRITES[:2], ("sdpa",)]
    children = []
    real = rw._run_child
    monkeypatch.setattr(rw, "_run_child", lambda *a: children.append(a) or real(*a))
    together = rw.rewrite_variants(source, variants, cache_dir=tmp_path / "c1")
    assert len(children) == 1  # one process: traced once, the shared prefix applied once
    with ThreadPoolExecutor(2) as pool:  # one child each
        alone = list(pool.map(lambda v: rewrite_task(source, v, cache=False), variants))
    assert together == alone
    assert together[0].applied == ["simplify", "fold-linear"] and together[1].applied == ["simplify"]
    assert not together[2].ok and together[2].error == "no rewrite applies"


def _prompt(source: str, pool: tuple[PoolEntry, ...] = ()) -> PoolPrompt:
    return PoolPrompt("t", "h" * 64, "s", "u", "v", task_source=source, pool=pool)


@pytest.mark.cpu
def test_policy_proposes_algebraic_first_then_composes_on_the_best():
    source = (FIXTURES / "sum_of_linear.py").read_text()
    policy = BuiltinPolicy(device="cuda")
    first = policy.generate([_prompt(source)], n=2)[0]
    assert [c.meta["passes"] for c in first] == [["algebraic"], ["compile-default"]]
    assert "reduction folded into the weights" in first[0].text
    algebraic = compose(source, None, "algebraic")
    anchor = PoolEntry(source + "\n\nModelNew = Model\n", 1.0, reference=True)
    # the algebraic candidate beat the reference: the next proposals stack on top of it
    nxt = policy.generate([_prompt(source, (anchor, PoolEntry(algebraic, 2.0)))], n=2)[0]
    assert [c.meta["passes"] for c in nxt] == [["algebraic", "compile-default"], ["algebraic", "cudagraph"]]
    stacked = load(compose(source, algebraic, "cudagraph"), "s")
    assert issubclass(stacked.ModelNew, stacked._Stage1) and issubclass(stacked._Stage1, stacked.Model)
    # slower than the reference: it is not used as a base
    policy2 = BuiltinPolicy(device="cuda")
    nxt2 = policy2.generate([_prompt(source, (PoolEntry(algebraic, 0.8), anchor))], n=1)[0]
    assert nxt2[0].meta["passes"] == ["compile-default"]
    # the anchor is known by its field, not by its text: unmarked, the reference's text measured at
    # 1.3x is any entry, and the pool ranks against 1.00x (a search without the anchor)
    unmarked = (PoolEntry(algebraic, 1.2), PoolEntry(anchor.code, 1.3))
    assert BuiltinPolicy(device="cuda").generate([_prompt(source, unmarked)], n=1)[0][0].meta["passes"] == \
        ["algebraic", "compile-default"]
    marked = (PoolEntry(algebraic, 1.2), PoolEntry("class ModelNew(Model):\n    pass\n", 1.3, reference=True))
    assert BuiltinPolicy(device="cuda").generate([_prompt(source, marked)], n=1)[0][0].meta["passes"] == \
        ["compile-default"]
    # without an anchor, an entry at or below 1.00x is no base
    below = (PoolEntry(algebraic, 0.8),)
    assert BuiltinPolicy(device="cuda").generate([_prompt(source, below)], n=1)[0][0].meta["passes"] == \
        ["compile-default"]


def test_layout_passes_only_for_convolutions_and_exec_passes_end_a_chain():
    conv = "import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n    def __init__(self):\n" \
           "        super().__init__()\n        self.c = nn.Conv2d(3, 8, 3)\n    def forward(self, x):\n" \
           "        return self.c(x)\ndef get_inputs():\n    return [torch.randn(2, 3, 16, 16)]\n" \
           "def get_init_inputs():\n    return []\n"
    linear = (FIXTURES / "residual_scale.py").read_text()
    assert compose(linear, None, "channels-last") is None and compose(linear, None, "cudnn-autotune") is None
    code = compose(conv, None, "channels-last")
    mod = load(code, "c")
    torch.manual_seed(0)
    x = torch.randn(2, 3, 16, 16)
    torch.manual_seed(1)
    ref = mod.Model()
    torch.manual_seed(1)
    torch.testing.assert_close(mod.ModelNew()(x), ref(x))
    compiled = compose(conv, code, "compile-default")
    assert passes_in(compiled) == ["channels-last", "compile-default"]
    assert compose(conv, compiled, "cudagraph") is None  # nothing stacks on an exec pass
    assert compose(conv, code, "algebraic") is None  # graph rewrites trace the reference only
    assert set(PASSES) >= {"algebraic", "channels-last", "cudnn-autotune", "compile-default", "cudagraph"}


@pytest.mark.cpu
def test_triton_fusion_is_its_own_candidate_after_the_algebraic_rewrites(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    import importlib.util
    import sys

    source = (FIXTURES / "residual_scale.py").read_text().replace(
        "        return x + original", "        x = x + original\n        return torch.tanh(torch.sigmoid(x) * 2.0)")
    with ThreadPoolExecutor(2) as pool:  # each traces in a child of its own
        code, plain = pool.map(lambda name: compose(source, None, name), ("triton-fusion", "algebraic"))
    assert code is not None and passes_in(code) == ["triton-fusion"] and "@triton.jit" in code
    assert "fold-linear" in code and "sigmoid → mul → tanh" in code  # both stages named in the docstring
    assert "@triton.jit" not in plain  # the plain rewrite stays a separate candidate
    policy = BuiltinPolicy(device="cuda")
    got = [c.meta["passes"] for c in policy.generate([_prompt(source)], n=3)[0]]
    assert got == [["algebraic"], ["compile-default"], ["triton-fusion"]]
    assert BuiltinPolicy(device="cpu").passes.count("triton-fusion") == 0  # kernels need a GPU (or the interpreter)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # run the generated kernel on the CPU
    path = tmp_path / "fused.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location("cudal1_test_fused", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["cudal1_test_fused"] = mod
    spec.loader.exec_module(mod)
    for seed in (0, 3):
        expected, got_out = outputs(mod, "Model", seed), outputs(mod, "ModelNew", seed)
        torch.testing.assert_close(got_out, expected, rtol=1e-4, atol=1e-4)
