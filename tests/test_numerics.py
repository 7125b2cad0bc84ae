"""The exact-answer correctness rule (harness.numerics): the bound's math, the float64 twin of the
reference, the fall-backs, the parent's re-check, and the numerics corpus
(``tests/fixtures/numerics``: correct programs that round differently, and real damage), judged
in-process for every draw and once through the real subprocess judge."""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import pytest
import torch

from cudal1.config import EvalConfig
from cudal1.harness import compare as cmp
from cudal1.harness.numerics import ExactReference, LeafCheck, exact_applies, float64_model, leaf_check
from cudal1.harness.parent.sandbox import verdict_problem
from cudal1.harness.reference.outputs import stale
from cudal1.tolerances import TOLERANCES, ExactRule

REPO = Path(__file__).resolve().parent.parent
RULE = TOLERANCES["exact"]  # the default correctness rule
EXACT = RULE.exact  # its exact-answer constants


def _check(ref, out, exact, rule=RULE):
    return cmp.compare(ref, out, rule, "cpu", exact=exact)


# ---- the bound ------------------------------------------------------------------------------

class TestBound:
    def test_bound_is_factor_times_reference_error_above_the_floor(self):
        c = LeafCheck(
            "out", "float32", n=100, exact_l2=10.0, ref_l2=1e-3, cand_l2=0.0, exact_inf=1.0, ref_inf=1e-4, cand_inf=0.0
        )
        l2, inf = c.bounds(EXACT)
        assert l2 == pytest.approx(16 * 1e-3) and inf == pytest.approx(16 * 1e-4)

    def test_floor_applies_when_the_reference_is_exact(self):
        c = LeafCheck(
            "out", "float32", n=100, exact_l2=10.0, ref_l2=0.0, cand_l2=0.0, exact_inf=2.0, ref_inf=0.0, cand_inf=0.0
        )
        l2, inf = c.bounds(EXACT)
        assert l2 == pytest.approx(1e-5 * 10.0) and inf == pytest.approx(1e-5 * 2.0)

    def test_absolute_floor_for_an_all_zero_answer(self):
        c = LeafCheck(
            "out", "float32", n=4, exact_l2=0.0, ref_l2=0.0, cand_l2=1e-9, exact_inf=0.0, ref_inf=0.0, cand_inf=1e-9
        )
        assert c.ratio(EXACT) < 1.0  # 1e-8 per element
        c.cand_inf = c.cand_l2 = 1e-6
        assert c.ratio(EXACT) > 1.0

    def test_half_precision_floor_is_its_own(self):
        c = LeafCheck(
            "out", "float16", n=1, exact_l2=1.0, ref_l2=0.0, cand_l2=0.0, exact_inf=1.0, ref_inf=0.0, cand_inf=0.0
        )
        assert c.bounds(EXACT)[0] == pytest.approx(2e-3)

    def test_record_round_trip(self):
        c = LeafCheck("out", "float32", 7, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
        back = LeafCheck.from_record("float32", c.record())
        assert (back.n, back.exact_l2, back.cand_inf) == (7, 1.0, 6.0)
        assert back.ratio(EXACT) == c.ratio(EXACT)

    def test_norms(self):
        e = torch.tensor([3.0, 4.0], dtype=torch.float64)
        r = torch.tensor([3.0, 4.5])
        c = torch.tensor([3.5, 4.0])
        check = leaf_check("out", e, r, c)
        assert (check.exact_l2, check.ref_l2, check.cand_l2) == (5.0, 0.5, 0.5)
        assert (check.exact_inf, check.ref_inf, check.cand_inf) == (4.0, 0.5, 0.5)

    def test_non_finite_positions_of_the_reference_are_left_to_the_position_check(self):
        e = torch.tensor([1.0, math.inf], dtype=torch.float64)
        check = leaf_check("out", e, torch.tensor([1.0, math.inf]), torch.tensor([1.0, math.inf]))
        assert check.n == 1 and check.cand_l2 == 0.0


# ---- compare() with the exact answer ---------------------------------------------------------

class TestCompareExact:
    def test_cancellation_near_zero_is_not_an_error(self):
        # Elements near zero with large *relative* differences, as in a reassociated chain:
        # both roundings are equally far from the exact answer.
        torch.manual_seed(0)
        exact = torch.randn(4096, dtype=torch.float64) * 100
        exact[:8] = 1e-6
        noise = lambda: torch.randn(4096, dtype=torch.float64) * 3e-4  # noqa: E731
        ref, out = (exact + noise()).float(), (exact + noise()).float()
        assert cmp.compare(ref, out, TOLERANCES["strict"], "cpu")[0] is not None  # the fixed rule rejects it
        mismatch, errors = _check(ref, out, exact)
        assert mismatch is None and errors.exact and not errors.fixed

    def test_scaled_output_is_wrong(self):
        torch.manual_seed(0)
        exact = torch.randn(4096, dtype=torch.float64)
        mismatch, _ = _check(exact.float(), (exact * 1.0005).float(), exact)
        assert mismatch is not None and mismatch.flag == "value_mismatch"
        assert "float64 answer" in mismatch.detail
        assert cmp.compare(exact.float(), (exact * 1.0005).float(), TOLERANCES["kernelbench-v0"], "cpu")[0] is None

    def test_one_wrong_element_in_a_large_tensor_is_caught_by_the_worst_element(self):
        torch.manual_seed(0)
        exact = torch.randn(1 << 20, dtype=torch.float64)
        out = exact.float().clone()
        out[12345] += 0.01  # below the normwise floor of a million elements, far above any rounding
        mismatch, errors = _check(exact.float(), out, exact)
        assert mismatch is not None
        check = errors.exact[0]
        assert check.cand_l2 < check.bounds(EXACT)[0]  # the norm alone would have let it through
        assert check.cand_inf > check.bounds(EXACT)[1]

    def test_nan_and_inf_positions_must_match(self):
        exact = torch.tensor([1.0, 2.0], dtype=torch.float64)
        assert _check(torch.tensor([1.0, 2.0]), torch.tensor([1.0, math.nan]), exact)[0].flag == "nan_mismatch"
        ref = torch.tensor([1.0, math.inf])
        assert (
            _check(ref, torch.tensor([1.0, 2.0]), torch.tensor([1.0, math.inf], dtype=torch.float64))[0].flag
            == "nan_mismatch"
        )
        assert _check(torch.tensor([1.0, 2.0]), torch.tensor([1.0, math.inf]), exact)[0] is not None

    def test_outputs_the_rule_cannot_judge_fall_back_with_a_reason(self):
        ref = (torch.tensor([1, 2]), torch.tensor([1.0], dtype=torch.float64))
        exact = (torch.tensor([1, 2]), torch.tensor([1.0], dtype=torch.float64))
        mismatch, errors = _check(ref, ref, exact)
        assert mismatch is None and not errors.exact
        assert set(errors.fixed) == {"out[1]"} and "float64" in errors.fixed["out[1]"]

    def test_exact_applies_reasons(self):
        f32 = torch.zeros(2)
        assert exact_applies(f32, torch.zeros(2, dtype=torch.float64)) == ""
        assert "float64 tensor" in exact_applies(f32, torch.zeros(2))
        assert "shape" in exact_applies(f32, torch.zeros(3, dtype=torch.float64))
        assert "floating" in exact_applies(torch.zeros(2, dtype=torch.int64), None)


# ---- the float64 twin of the reference -------------------------------------------------------

class _WithPlainTensor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)
        self.scale = torch.full((4,), 0.5)  # a plain attribute, not a buffer

    def forward(self, x):
        return self.lin(x) * self.scale + torch.ones(4)  # torch.ones: the default dtype


class _Float32Only(torch.nn.Module):
    def forward(self, x):
        return (
            x + torch.zeros(x.shape, dtype=torch.float32).to(x.dtype)
            if x.dtype == torch.float32
            else torch.tensor("bad")
        )


class TestExactReference:
    def test_same_initialisation_in_float64(self):
        torch.manual_seed(1)
        model = _WithPlainTensor()
        twin = float64_model(model, torch.device("cpu"))
        assert twin.lin.weight.dtype == torch.float64 and twin.scale.dtype == torch.float64
        assert torch.equal(twin.lin.weight.float(), model.lin.weight)  # fp32 -> fp64 is exact
        assert model.lin.weight.dtype == torch.float32  # the reference itself is untouched

    def test_outputs_are_float64_and_closer_to_the_truth(self):
        torch.manual_seed(1)
        model = _WithPlainTensor()
        x = torch.randn(16, 8)
        out = ExactReference(model, torch.device("cpu"))([x])
        assert out.dtype == torch.float64
        truth = (x.double() @ model.lin.weight.double().T + model.lin.bias.double()) * 0.5 + 1
        assert (out - truth).abs().max() < 1e-12
        assert torch.get_default_dtype() == torch.float32  # restored

    def test_a_reference_that_cannot_run_in_float64_says_why(self):
        ex = ExactReference(_Float32Only(), torch.device("cpu"))
        assert ex([torch.zeros(2)]) is None
        assert "does not run in float64" in ex.unavailable

    def test_out_of_memory_beside_other_workers_raises_instead_of_falling_back(self):
        """On a shared GPU an OOM is the neighbours' doing: it must become an ``oom`` verdict (the
        scheduler re-judges alone), not a CPU float64 run (tens of seconds on large tasks) or a
        different correctness rule.  Alone, the CPU fallback stands."""

        class _OomOnTheDevice(torch.nn.Module):
            def forward(self, x):
                if torch.get_default_dtype() == torch.float64 and getattr(self, "on_device", True):
                    self.on_device = False  # the CPU retry (after .to('cpu')) succeeds
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.00 GiB")
                return x * 2

        def exact(shared: bool) -> ExactReference:
            ex = ExactReference(_OomOnTheDevice(), torch.device("cpu"), shared=shared)
            ex.device = torch.device("meta")  # as if built on a device (no GPU needed: the retry is on the CPU)
            return ex

        with pytest.raises(torch.OutOfMemoryError):
            exact(shared=True)([torch.ones(2)])
        alone = exact(shared=False)
        assert torch.equal(alone([torch.ones(2)]), torch.full((2,), 2.0, dtype=torch.float64))
        assert alone.device.type == "cpu" and alone.unavailable == ""


# ---- parent re-check and staleness -------------------------------------------------------------

def _ok_verdict(record):
    return {"status": "ok", "correctness": {"trials": 5, "passed": 5, "exact_checks": {"float32": record}},
            "timing": {"cand": [[1.0, 1.0, 0.1, False, False, 2.0]], "ref": [[1.0, 1.0, 0.1, False, False]]}}


_PHASES = ["setup", "reference", "import", "construct", "correctness", "timing"]


def _spec(tolerances=RULE):
    from cudal1.harness.spec import WorkerSpec

    return WorkerSpec(mode="eval", device="cpu", config=EvalConfig(), tolerances=tolerances, input_seed=1,
                      reference_path="ref.py", reference_module="ref", log_path="worker.log")


class TestParentRecheck:
    job = _spec()

    def test_within_bound_holds_up(self):
        rec = LeafCheck("", "float32", 10, 1.0, 1e-6, 1e-6, 1.0, 1e-6, 1e-6).record()
        assert verdict_problem(self.job, _PHASES, _ok_verdict(rec)) == ""

    def test_beyond_bound_is_caught_with_the_parents_constants(self):
        rec = LeafCheck("", "float32", 10, 1.0, 1e-6, 1e-3, 1.0, 1e-6, 1e-6).record()
        assert "exact rule" in verdict_problem(self.job, _PHASES, _ok_verdict(rec))

    def test_exact_records_under_a_fixed_table_are_caught(self):
        rec = LeafCheck("", "float32", 10, 1.0, 1e-6, 1e-6, 1.0, 1e-6, 1e-6).record()
        job = _spec(TOLERANCES["strict"])
        assert "exact rule" in verdict_problem(job, _PHASES, _ok_verdict(rec))


class TestStale:
    def test_rounding_sized_difference_is_not_stale(self):
        r = torch.randn(128)
        assert not stale(r, r + 1e-4)

    def test_another_inputs_answer_is_stale(self):
        assert stale(torch.randn(128), torch.randn(128))
        assert stale((torch.zeros(2, dtype=torch.int64),), (torch.ones(2, dtype=torch.int64),))


# ---- the corpus (tests/conftest.py's runner) -------------------------------------------------------

CORPUS = sorted(p for p in (REPO / "tests" / "fixtures" / "numerics").glob("*.py") if not p.name.startswith("task_"))
CORPUS_TASK = REPO / "examples" / "tasks" / "matmul_chain.py"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _margin(path: Path) -> float:
    """How far below the bound an honest fixture must stay (header '# margin:', default 0.5)."""
    m = re.search(r"^#\s*margin:\s*(\S+)", path.read_text(), re.M)
    return float(m.group(1)) if m else 0.5


def test_corpus_in_process_every_draw(corpus, corpus_name):
    """The rule itself, on five draws each: correct programs pass every one, damaged ones fail
    every one (a verdict must not depend on which draw came up)."""
    entry = corpus[corpus_name]
    want_ok = entry.expect[0][0] == "ok"
    task_path = entry.task or CORPUS_TASK
    task, cand = _load(task_path, f"numerics_task_{corpus_name}"), _load(entry.path, f"numerics_cand_{corpus_name}")
    torch.manual_seed(42)
    ref_model = task.Model(*task.get_init_inputs())
    torch.manual_seed(42)
    cand_model = cand.ModelNew(*task.get_init_inputs())
    exact_ref = ExactReference(ref_model, torch.device("cpu"))
    for draw in range(5):
        torch.manual_seed(1000 + draw)
        inputs = task.get_inputs()
        with torch.no_grad():
            exact = exact_ref([x.clone() for x in inputs])
            mismatch, errors = _check(ref_model(*inputs), cand_model(*inputs), exact)
        assert exact is not None, exact_ref.unavailable
        if want_ok:
            assert mismatch is None, f"draw {draw}: {mismatch.detail}"
            assert max(c.ratio(EXACT) for c in errors.exact) < _margin(entry.path), (
                "an honest program should pass with margin"
            )
        else:
            assert mismatch is not None and mismatch.flag in {f for _, f in entry.expect}, f"draw {draw}"


@pytest.fixture(scope="module")
def corpus_config(tmp_path_factory):
    return EvalConfig(
        device="cpu", cache_dir=str(tmp_path_factory.mktemp("cache")), timeout_s=60.0, timing_budget_s=0.3,
        timing_trials=10, min_timing_trials=4, correctness_trials=3, bootstrap_samples=200,
        strict_speedup=1e9,
    )


@pytest.mark.cpu
def test_corpus_through_the_judge(corpus, corpus_results, corpus_name, check_verdict):
    r = corpus_results[corpus_name]
    assert check_verdict(corpus[corpus_name], r) == ""
    assert "cached_result" not in r.flags
    if r.status.value == "ok":
        c = r.correctness
        assert c.rule == "exact" and c.rule_note == ""
        assert c.cand_err is not None and c.ref_err is not None and c.cand_err <= c.bound


def test_fixed_presets_still_judge_as_published():
    """kernelbench-v0 stays comparable with published numbers: it accepts an output scaled by
    1.0005 (within its 1e-2), which the strict table and the exact rule both refuse."""
    assert EvalConfig.preset("kernelbench-v0").tolerance == "kernelbench-v0"
    assert EvalConfig().tolerance == "exact" and EvalConfig.preset("default").tolerance == "exact"
    torch.manual_seed(0)
    ref = torch.randn(256, 256)
    scaled = ref * 1.0005
    published, _ = cmp.compare(ref, scaled, TOLERANCES["kernelbench-v0"], "cpu")
    strict, _ = cmp.compare(ref, scaled, TOLERANCES["strict"], "cpu")
    exact, _ = cmp.compare(ref, scaled, TOLERANCES["exact"], "cpu", exact=ref.double())
    assert published is None
    assert strict is not None and strict.flag == "value_mismatch"
    assert exact is not None and exact.flag == "value_mismatch"


# ---- answers shared across candidates ---------------------------------------------------------

class TestExactAnswers:
    def _setup(self):
        from cudal1.harness.numerics import ExactAnswers

        torch.manual_seed(3)
        model = torch.nn.Linear(16, 4)
        exact = ExactReference(model, torch.device("cpu"))

        def make_inputs(seed):
            torch.manual_seed(seed)
            return [torch.randn(8, 16)]
        return ExactAnswers, exact, make_inputs

    def test_computed_once_then_loaded_by_digest(self, tmp_path):
        ExactAnswers, exact, make_inputs = self._setup()
        path = str(tmp_path / "exact" / "a.pt")
        first = ExactAnswers()
        first.prepare(exact, [1, 2], make_inputs, path, None)
        assert first.source == "computed" and first.digest and set(first.answers) == {1, 2}
        second = ExactAnswers()
        second.prepare(exact, [1, 2], make_inputs, path, first.digest)
        assert second.source == "cache" and torch.equal(second.answers[2], first.answers[2])
        assert second.answers[1].dtype == torch.float64

    def test_a_rewritten_cache_file_is_not_trusted(self, tmp_path):
        ExactAnswers, exact, make_inputs = self._setup()
        path = tmp_path / "a.pt"
        first = ExactAnswers()
        first.prepare(exact, [1], make_inputs, str(path), None)
        forged = {"1": torch.zeros(8, 4, dtype=torch.float64)}
        torch.save(forged, path)  # a candidate of another job rewrites the file
        again = ExactAnswers()
        again.prepare(exact, [1], make_inputs, str(path), first.digest)
        assert again.source == "computed" and torch.equal(again.answers[1], first.answers[1])

    def test_no_float64_run_means_no_answers(self, tmp_path):
        from cudal1.harness.numerics import ExactAnswers

        answers = ExactAnswers()
        answers.prepare(
            ExactReference(_Float32Only(), torch.device("cpu")), [1], lambda s: [torch.zeros(2)], None, None
        )
        assert answers.answers == {}


class TestRecheckLimits:
    def test_rounding_passes_and_damage_fails_against_the_fp32_reference(self):
        from cudal1.harness.numerics import within_limits

        torch.manual_seed(0)
        exact = torch.randn(4096, dtype=torch.float64)
        ref = exact.float()
        check = leaf_check("out", exact, ref, ref)
        limit = check.limits(EXACT)
        assert within_limits("out", ref, (exact + 1e-7 * torch.randn(4096, dtype=torch.float64)).float(), limit) == ""
        assert "more than rounding" in within_limits("out", ref, (exact * 1.0005).float(), limit)
        mismatch, _ = cmp.compare(ref, (exact * 1.0005).float(), RULE, "cpu", limits={"out": limit})
        assert mismatch is not None and mismatch.flag == "value_mismatch"


def test_recheck_of_an_all_zero_answer_sets_no_relative_limit():
    from cudal1.harness.numerics import within_limits

    zero = torch.zeros(16)
    check = leaf_check("out", zero.double(), zero, zero)
    assert within_limits("out", zero, zero, check.limits(EXACT)) == ""


def test_large_answer_sets_are_computed_per_candidate(tmp_path, monkeypatch):
    from cudal1.harness import numerics

    monkeypatch.setattr(numerics, "CACHE_LIMIT_BYTES", 100)
    answers = numerics.ExactAnswers()
    answers.prepare(ExactReference(torch.nn.Linear(16, 4), torch.device("cpu")), [1, 2],
                    lambda s: [torch.randn(8, 16)], str(tmp_path / "a.pt"), None)
    assert answers.source == "per-candidate" and set(answers.answers) == {1} and not (tmp_path / "a.pt").exists()
    assert answers.take(1) is not None and answers.take(1) is None  # handed out once, then off the device
    assert answers.take(2) is None  # the others are computed per trial


def test_kept_answer_sets_are_handed_out_every_time(tmp_path):
    from cudal1.harness import numerics

    answers = numerics.ExactAnswers()
    answers.prepare(ExactReference(torch.nn.Linear(16, 4), torch.device("cpu")), [1, 2],
                    lambda s: [torch.randn(8, 16)], str(tmp_path / "a.pt"), None)
    assert answers.source == "computed" and answers.take(1) is not None and answers.take(1) is not None


def test_a_nan_error_never_passes_the_bound():
    c = LeafCheck(
        "out", "float32", n=4, exact_l2=1.0, ref_l2=0.0, cand_l2=math.nan, exact_inf=1.0, ref_inf=0.0, cand_inf=0.0
    )
    assert c.ratio(EXACT) == math.inf
    zero_floor = ExactRule(floors={"float32": (0.0, 0.0)})
    exact_zero = LeafCheck(
        "out", "float32", n=4, exact_l2=0.0, ref_l2=0.0, cand_l2=0.0, exact_inf=0.0, ref_inf=0.0, cand_inf=0.0
    )
    assert exact_zero.ratio(zero_floor) == 0.0


def test_norms_accumulate_across_chunks(monkeypatch):
    """``deviation`` and ``leaf_check`` sum chunk by chunk on the device: the same figures as one
    float64 pass over the finite positions."""
    import math

    from cudal1.harness import numerics

    monkeypatch.setattr(numerics, "_CHUNK", 5)
    ref = torch.randn(37)
    ref[[3, 20]] = float("inf")
    out = ref + 1e-3 * torch.randn(37)
    exact = ref.double() + 1e-7
    exact[11] = float("nan")
    keep = torch.isfinite(ref)
    r, o = ref[keep].double(), out[keep].double()
    ref_l2, l2, ref_inf, inf = numerics.deviation(ref, out)
    assert ref_l2 == pytest.approx(math.sqrt(float((r * r).sum())), rel=1e-12)
    assert l2 == pytest.approx(math.sqrt(float(((o - r) ** 2).sum())), rel=1e-12)
    assert (ref_inf, inf) == pytest.approx((float(r.abs().max()), float((o - r).abs().max())), rel=1e-12)
    check = numerics.leaf_check("out", exact, ref, out)
    both = keep & torch.isfinite(exact)
    e, c = exact[both], out[both].double()
    assert check.n == int(both.sum())
    assert check.cand_l2 == pytest.approx(math.sqrt(float(((c - e) ** 2).sum())), rel=1e-12)
    assert check.exact_inf == pytest.approx(float(e.abs().max()), rel=1e-12)
