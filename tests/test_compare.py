"""harness.compare: the tolerance check of outputs, and exact tree equality (pure functions)."""

from __future__ import annotations

import pytest
import torch

from cudal1.harness import compare as cmp
from cudal1.tolerances import TOLERANCES, Tolerances

STRICT = TOLERANCES["strict"]


def check(ref, out, tolerances=STRICT, device="cpu"):
    mismatch, _ = cmp.compare(ref, out, tolerances, device)
    return mismatch


def flag_of(ref, out, tolerances=STRICT, device="cpu"):
    mismatch = check(ref, out, tolerances, device)
    return None if mismatch is None else mismatch.flag


class TestCompare:
    def test_identical_passes(self):
        x = torch.randn(16, 8)
        mismatch, errors = cmp.compare(x, x.clone(), STRICT, "cpu")
        assert mismatch is None
        assert errors.max_abs == 0.0 and errors.max_rel == 0.0

    def test_shape_mismatch(self):
        m = check(torch.zeros(4, 4), torch.zeros(4, 3))
        assert m.flag == "shape_mismatch"
        assert "(4, 3)" in m.detail and "(4, 4)" in m.detail

    def test_broadcastable_shape_is_still_a_mismatch(self):
        assert flag_of(torch.zeros(4, 4), torch.zeros(1, 4)) == "shape_mismatch"
        assert flag_of(torch.zeros(4), torch.zeros(4, 1)) == "shape_mismatch"

    def test_dtype_mismatch(self):
        m = check(torch.zeros(3), torch.zeros(3, dtype=torch.float64))
        assert m.flag == "shape_mismatch"
        assert "dtype" in m.detail

    def test_half_output_for_float_reference_is_a_dtype_mismatch(self):
        assert flag_of(torch.ones(3), torch.ones(3, dtype=torch.float16)) == "shape_mismatch"

    def test_nan_in_same_positions_passes(self):
        ref = torch.tensor([1.0, float("nan"), 3.0])
        assert check(ref, ref.clone()) is None

    def test_nan_position_mismatch(self):
        ref = torch.tensor([1.0, float("nan"), 3.0])
        out = torch.tensor([float("nan"), 2.0, 3.0])
        m = check(ref, out)
        assert m.flag == "nan_mismatch"
        assert "2 elements" in m.detail

    def test_extra_nan_in_output(self):
        ref = torch.tensor([1.0, 2.0])
        assert flag_of(ref, torch.tensor([1.0, float("nan")])) == "nan_mismatch"

    def test_missing_nan_in_output(self):
        ref = torch.tensor([1.0, float("nan")])
        assert flag_of(ref, torch.tensor([1.0, 0.0])) == "nan_mismatch"

    def test_same_inf_passes(self):
        ref = torch.tensor([float("inf"), -float("inf"), 1.0])
        assert check(ref, ref.clone()) is None

    def test_inf_sign_flip_is_value_mismatch(self):
        ref = torch.tensor([float("inf"), 1.0])
        assert flag_of(ref, torch.tensor([-float("inf"), 1.0])) == "value_mismatch"

    def test_finite_for_inf_is_value_mismatch(self):
        ref = torch.tensor([float("inf"), 1.0])
        assert flag_of(ref, torch.tensor([3.0e38, 1.0])) == "value_mismatch"

    def test_inf_for_finite_is_value_mismatch(self):
        ref = torch.tensor([2.0, 1.0])
        assert flag_of(ref, torch.tensor([float("inf"), 1.0])) == "value_mismatch"

    def test_value_mismatch_reports_errors_and_index(self):
        ref = torch.zeros(10)
        out = ref.clone()
        out[7] = 0.5
        m = check(ref, out)
        assert m.flag == "value_mismatch"
        assert "1 of 10" in m.detail and "flat index 7" in m.detail
        assert m.max_abs == pytest.approx(0.5)

    def test_fp32_strict_tolerance_values(self):
        ref = torch.ones(100)
        assert check(ref, ref + 5e-5) is None  # within 1e-4 + 1e-4 * 1
        assert flag_of(ref, ref + 1e-3) == "value_mismatch"

    def test_kernelbench_tolerance_is_looser(self):
        ref = torch.ones(100)
        out = ref * 1.001
        assert flag_of(ref, out, TOLERANCES["strict"]) == "value_mismatch"
        assert check(ref, out, TOLERANCES["kernelbench-v0"]) is None

    def test_atol_edge_is_inclusive(self):
        tol = Tolerances("edge", {"float64": (1e-3, 0.0)})
        ref = torch.zeros(4, dtype=torch.float64)
        assert check(ref, ref + 1e-3, tol) is None  # |diff| == atol passes
        assert flag_of(ref, ref + 1.0000001e-3, tol) == "value_mismatch"

    def test_rtol_edge_is_inclusive(self):
        tol = Tolerances("edge", {"float64": (0.0, 0.125)})  # exactly representable
        ref = torch.full((4,), 8.0, dtype=torch.float64)
        assert check(ref, ref + 1.0, tol) is None  # |diff| == rtol * |ref|
        assert flag_of(ref, ref + 1.0000001, tol) == "value_mismatch"
        assert check(ref, ref - 1.0, tol) is None

    def test_tolerance_is_per_dtype(self):
        tol = Tolerances("per-dtype", {"float16": (0.5, 0.0), "float32": (0.0, 0.0)})
        ref = torch.zeros(3, dtype=torch.float16)
        assert check(ref, ref + 0.25, tol) is None
        ref32 = torch.zeros(3)
        assert flag_of(ref32, ref32 + 0.25, tol) == "value_mismatch"

    def test_nested_tuples_pass(self):
        a, b, c = torch.randn(3), torch.randn(2, 2), torch.arange(4)
        ref = (a, (b, [c]))
        out = (a.clone(), (b.clone(), [c.clone()]))
        assert check(ref, out) is None

    def test_nested_tuple_value_mismatch_names_the_leaf(self):
        a, b = torch.randn(3), torch.randn(2, 2)
        m = check((a, (b,)), (a.clone(), (b + 1.0,)))
        assert m.flag == "value_mismatch"
        assert m.detail.startswith("out[1][0]")

    def test_nested_structure_mismatch(self):
        a, b = torch.randn(3), torch.randn(3)
        assert flag_of((a, b), (a,)) == "shape_mismatch"
        assert flag_of((a, (b,)), ((a, b),)) == "shape_mismatch"
        assert flag_of((a, b), a) == "shape_mismatch"

    def test_dict_outputs(self):
        ref = {"x": torch.ones(2), "y": torch.zeros(2)}
        assert check(ref, {"y": torch.zeros(2), "x": torch.ones(2)}) is None
        assert flag_of(ref, {"x": torch.ones(2), "z": torch.zeros(2)}) == "shape_mismatch"

    def test_integer_outputs_must_match_exactly(self):
        loose = {k: (1e9, 1e9) for k in ("float32", "int64", "int32")}
        ref = torch.arange(10)
        assert check(ref, ref.clone(), loose) is None
        m = check(ref, ref + 1, loose)
        assert m.flag == "value_mismatch" and "exact" in m.detail
        assert (
            flag_of(torch.arange(5, dtype=torch.int32), torch.arange(5, dtype=torch.int32) * 2, loose)
            == "value_mismatch"
        )

    def test_bool_outputs_must_match_exactly(self):
        ref = torch.tensor([True, False, True])
        assert check(ref, ref.clone()) is None
        assert flag_of(ref, torch.tensor([True, True, True])) == "value_mismatch"

    def test_python_scalar_leaves(self):
        assert check((torch.ones(1), 3), (torch.ones(1), 3)) is None
        assert flag_of((torch.ones(1), 3), (torch.ones(1), 4)) == "value_mismatch"
        assert check(1.0, 1.0 + 1e-6) is None
        assert flag_of(1.0, 1.1) == "value_mismatch"
        assert check(float("nan"), float("nan")) is None
        assert flag_of(3, 3.0) == "shape_mismatch"

    def test_tensor_where_scalar_expected(self):
        assert flag_of(1.0, torch.tensor(1.0)) == "shape_mismatch"
        assert flag_of(torch.tensor(1.0), 1.0) == "shape_mismatch"

    def test_subclass_is_lazy_output(self):
        class Deferred(torch.Tensor):
            pass

        ref = torch.randn(4)
        m = check(ref, ref.clone().as_subclass(Deferred))
        assert m.flag == "lazy_output"
        assert "Deferred" in m.detail

    def test_subclass_nested_is_lazy_output(self):
        class Deferred(torch.Tensor):
            pass

        ref = (torch.randn(4), torch.randn(4))
        out = (ref[0].clone(), ref[1].clone().as_subclass(Deferred))
        assert flag_of(ref, out) == "lazy_output"

    def test_parameter_output_is_lazy_output(self):
        ref = torch.randn(4)
        assert flag_of(ref, torch.nn.Parameter(ref.clone())) == "lazy_output"

    def test_meta_tensor_is_lazy_output(self):
        ref = torch.randn(4)
        m = check(ref, torch.empty(4, device="meta"))
        assert m.flag == "lazy_output"
        assert "meta" in m.detail

    def test_wrong_device_is_lazy_output(self):
        ref = torch.randn(4)
        assert flag_of(ref, ref.clone(), device="cuda") == "lazy_output"

    def test_sparse_is_lazy_output(self):
        ref = torch.eye(3)
        assert flag_of(ref, ref.to_sparse()) == "lazy_output"

    def test_lazy_check_precedes_structure_check(self):
        class Deferred(torch.Tensor):
            pass

        assert flag_of((torch.ones(2), torch.ones(2)), (torch.ones(2).as_subclass(Deferred),)) == "lazy_output"

    def test_errors_accumulate_over_leaves(self):
        ref = (torch.zeros(2), torch.ones(2))
        out = (torch.tensor([1e-5, 0.0]), torch.tensor([1.0, 1.0 + 5e-5]))
        mismatch, errors = cmp.compare(ref, out, STRICT, "cpu")
        assert mismatch is None
        assert errors.max_abs == pytest.approx(5e-5, rel=1e-2)

    def test_compare_reports_per_dtype_errors(self):
        ref = torch.tensor([1.0, -3.0, float("inf")])
        out = ref + torch.tensor([1e-5, -2e-5, 0.0])
        mismatch, errors = cmp.compare(ref, out, STRICT, "cpu")
        assert mismatch is None
        max_abs, max_ref = errors.by_dtype["float32"]
        assert max_abs == pytest.approx(2e-5, rel=1e-2) and max_ref == 3.0  # the infinite reference is not counted


class TestTensorsEqual:
    def test_equal_trees(self):
        a = [torch.randn(3), (torch.arange(4), 5)]
        assert cmp.tensors_equal(a, [a[0].clone(), (a[1][0].clone(), 5)])

    def test_nan_aware(self):
        x = torch.tensor([1.0, float("nan"), 2.0])
        assert cmp.tensors_equal([x], [x.clone()])
        assert not cmp.tensors_equal([x], [torch.tensor([1.0, 0.0, 2.0])])
        assert not cmp.tensors_equal([x], [torch.tensor([float("nan"), float("nan"), 2.0])])

    def test_exact_not_tolerant(self):
        x = torch.ones(3)
        assert not cmp.tensors_equal([x], [x + 1e-7])

    def test_shape_dtype_and_arity(self):
        x = torch.ones(3)
        assert not cmp.tensors_equal([x], [torch.ones(1, 3)])
        assert not cmp.tensors_equal([x], [torch.ones(3, dtype=torch.float64)])
        assert not cmp.tensors_equal([x], [x, x])
        assert not cmp.tensors_equal([x], [3])

    def test_bitwise_a_write_of_equal_value_still_counts(self):
        """The trees compared are a copy and its original: any write shows, also one that a value
        comparison would call equal (-0.0 over 0.0, another NaN payload)."""
        x = torch.tensor([0.0, float("nan"), 2.0])
        signed = x.clone()
        signed[0] = -0.0
        assert not cmp.tensors_equal([x], [signed])
        payload = x.clone()
        payload.view(torch.int32)[1] ^= 1  # still a NaN, other bits
        assert torch.isnan(payload[1]) and not cmp.tensors_equal([x], [payload])

    def test_same_bits_takes_any_layout_and_dtype(self):
        m = torch.randn(6, 8)
        for a in (m.t(), m[:, ::3], m[0].expand(4, 8), torch.tensor(3.5), torch.randn(5, dtype=torch.complex128),
                  torch.randn(7).to(torch.bfloat16), torch.rand(9) > 0.5, torch.arange(5, dtype=torch.int8)):
            assert cmp.same_bits(a, a.clone()), a.dtype
        changed = m.t().clone()
        changed[2, 3] += 1
        assert not cmp.same_bits(m.t(), changed)
        assert cmp.same_bits(torch.empty(0, 3), torch.empty(0, 3)) and not cmp.same_bits(
            torch.empty(0, 3), torch.empty(3, 0)
        )

    def test_ints_and_scalars(self):
        assert cmp.tensors_equal([torch.arange(3), 2, "s"], [torch.arange(3), 2, "s"])
        assert not cmp.tensors_equal([torch.arange(3)], [torch.tensor([0, 1, 3])])
        assert not cmp.tensors_equal([2], [3])
        assert cmp.tensors_equal([float("nan")], [float("nan")])


def test_errors_accumulate_across_chunks_and_the_first_bad_element_is_found(monkeypatch):
    """The fixed-tolerance errors are summed on the device over chunks; the first element out of
    tolerance is located in its own chunk."""
    monkeypatch.setattr(cmp, "_CHUNK", 7)
    ref = torch.linspace(-3.0, 4.0, 50)
    out = ref.clone()
    out[33] += 0.5
    out[41] += 0.25
    errors, n_bad, first = cmp._value_errors(ref, out, 1e-4, 1e-4)
    assert n_bad == 2 and first.startswith("first at flat index 33:")
    assert errors.max_abs == pytest.approx(0.5, rel=1e-6) and errors.max_ref == pytest.approx(4.0)
    assert errors.max_rel == pytest.approx(0.5 / abs(float(ref[33])), rel=1e-6)
    errors, n_bad, first = cmp._value_errors(ref, ref.clone(), 1e-4, 1e-4)
    assert (n_bad, first, errors.max_abs) == (0, "", 0.0)
