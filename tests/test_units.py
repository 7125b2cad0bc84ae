"""Fast unit tier: pure functions of the judge (no worker processes)."""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import subprocess
import sys

import numpy as np
import pytest
import torch

from cudal1 import flags
from cudal1.config import TOLERANCES, ConfigError, EvalConfig
from cudal1.harness import compare as cmp
from cudal1.harness.channel import MAC_LEN, ChannelError, Message, Receiver, Sender, _mac
from cudal1.harness.stats import bootstrap_speedup_ci, speedup
from cudal1.types import Correctness, Environment, EvalResult, Status, Timing

STRICT = TOLERANCES["strict"]


def check(ref, out, tolerances=STRICT, device="cpu"):
    mismatch, _ = cmp.compare(ref, out, tolerances, device)
    return mismatch


def flag_of(ref, out, tolerances=STRICT, device="cpu"):
    mismatch = check(ref, out, tolerances, device)
    return None if mismatch is None else mismatch.flag


# ---------------------------------------------------------------------------------------------
# harness.compare


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
        tol = {"float64": (1e-3, 0.0)}
        ref = torch.zeros(4, dtype=torch.float64)
        assert check(ref, ref + 1e-3, tol) is None  # |diff| == atol passes
        assert flag_of(ref, ref + 1.0000001e-3, tol) == "value_mismatch"

    def test_rtol_edge_is_inclusive(self):
        tol = {"float64": (0.0, 0.125)}  # exactly representable
        ref = torch.full((4,), 8.0, dtype=torch.float64)
        assert check(ref, ref + 1.0, tol) is None  # |diff| == rtol * |ref|
        assert flag_of(ref, ref + 1.0000001, tol) == "value_mismatch"
        assert check(ref, ref - 1.0, tol) is None

    def test_tolerance_is_per_dtype(self):
        tol = {"float16": (0.5, 0.0), "float32": (0.0, 0.0)}
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
        assert flag_of(torch.arange(5, dtype=torch.int32), torch.arange(5, dtype=torch.int32) * 2, loose) == "value_mismatch"

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

    def test_ints_and_scalars(self):
        assert cmp.tensors_equal([torch.arange(3), 2, "s"], [torch.arange(3), 2, "s"])
        assert not cmp.tensors_equal([torch.arange(3)], [torch.tensor([0, 1, 3])])
        assert not cmp.tensors_equal([2], [3])
        assert cmp.tensors_equal([float("nan")], [float("nan")])


# ---------------------------------------------------------------------------------------------
# harness.channel


class FakeConn:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send_bytes(self, data: bytes) -> None:
        self.sent.append(bytes(data))


def _messages(key: bytes, n: int = 3) -> list[bytes]:
    conn = FakeConn()
    sender = Sender(conn, key)
    for i in range(n):
        sender.send("phase", name=f"p{i}", value=i)
    return conn.sent


KEY = b"k" * 32


class TestChannel:
    def test_round_trip(self):
        raw = _messages(KEY)
        rx = Receiver(KEY)
        got = [rx.decode(r) for r in raw]
        assert got == [Message(seq=i, kind="phase", data={"name": f"p{i}", "value": i}) for i in range(3)]

    def test_round_trip_over_a_real_pipe(self):
        recv_conn, send_conn = mp.Pipe(duplex=False)
        try:
            Sender(send_conn, KEY).send("result", status="ok", flags=["cpu_timing"], x=1.5)
            msg = Receiver(KEY).decode(recv_conn.recv_bytes())
        finally:
            recv_conn.close()
            send_conn.close()
        assert msg.kind == "result"
        assert msg.data == {"status": "ok", "flags": ["cpu_timing"], "x": 1.5}

    def test_wrong_key(self):
        raw = _messages(KEY)
        with pytest.raises(ChannelError):
            Receiver(b"x" * 32).decode(raw[0])

    def test_replay(self):
        raw = _messages(KEY)
        rx = Receiver(KEY)
        rx.decode(raw[0])
        with pytest.raises(ChannelError):
            rx.decode(raw[0])

    def test_out_of_order(self):
        raw = _messages(KEY)
        with pytest.raises(ChannelError):
            Receiver(KEY).decode(raw[1])

    def test_skipped_message(self):
        raw = _messages(KEY)
        rx = Receiver(KEY)
        rx.decode(raw[0])
        with pytest.raises(ChannelError):
            rx.decode(raw[2])

    def test_forged_seq_in_payload_with_valid_mac(self):
        payload = json.dumps({"seq": 5, "kind": "result", "data": {"status": "ok"}}).encode()
        with pytest.raises(ChannelError, match="out-of-order"):
            Receiver(KEY).decode(_mac(KEY, 0, payload) + payload)

    def test_signed_garbage_payload(self):
        payload = b"\xff\xfe not json"
        with pytest.raises(ChannelError, match="undecodable"):
            Receiver(KEY).decode(_mac(KEY, 0, payload) + payload)

    @pytest.mark.parametrize(
        "raw",
        [
            b"",
            b"hello",
            b"\x00" * MAC_LEN,
            b"{\"seq\": 0, \"kind\": \"result\", \"data\": {\"status\": \"ok\"}}" * 2,
            bytes(range(256)),
        ],
        ids=["empty", "short", "mac-only", "plain-json", "bytes"],
    )
    def test_garbage(self, raw):
        with pytest.raises(ChannelError):
            Receiver(KEY).decode(raw)

    def test_truncated(self):
        raw = _messages(KEY)[0]
        for cut in (1, 5, len(raw) - MAC_LEN - 1):
            with pytest.raises(ChannelError):
                Receiver(KEY).decode(raw[:-cut])
        with pytest.raises(ChannelError):
            Receiver(KEY).decode(raw[:MAC_LEN])

    def test_bit_flip(self):
        raw = bytearray(_messages(KEY)[0])
        raw[-3] ^= 0x01
        with pytest.raises(ChannelError):
            Receiver(KEY).decode(bytes(raw))

    def test_failed_message_does_not_advance(self):
        raw = _messages(KEY)
        rx = Receiver(KEY)
        with pytest.raises(ChannelError):
            rx.decode(raw[1])
        assert rx.decode(raw[0]).seq == 0


# ---------------------------------------------------------------------------------------------
# harness.stats


class TestBootstrap:
    def _clean(self, n: int = 40):
        ref = [10.0 + 0.01 * ((i * 7) % 11) for i in range(n)]
        cand = [5.0 + 0.01 * ((i * 5) % 13) for i in range(n)]
        return ref, cand

    def test_ci_contains_point_estimate(self):
        import statistics

        ref, cand = self._clean()
        point = speedup(statistics.median(ref), statistics.median(cand))
        lo, hi = bootstrap_speedup_ci(ref, cand, samples=1000, seed=0)
        assert lo <= point <= hi
        assert lo < hi
        assert 1.9 < lo and hi < 2.1

    def test_constant_samples_give_a_degenerate_interval(self):
        lo, hi = bootstrap_speedup_ci([4.0] * 10, [2.0] * 10)
        assert lo == pytest.approx(2.0) and hi == pytest.approx(2.0)

    @pytest.mark.parametrize("ref,cand", [([], [1.0, 2.0]), ([1.0], [1.0, 2.0]), ([1.0, 2.0], [1.0]), ([1.0], [1.0])])
    def test_fewer_than_two_samples(self, ref, cand):
        assert bootstrap_speedup_ci(ref, cand) is None

    def test_deterministic_with_seed(self):
        rng = __import__("random").Random(1)
        ref = [rng.uniform(9, 11) for _ in range(30)]
        cand = [rng.uniform(4, 6) for _ in range(30)]
        a = bootstrap_speedup_ci(ref, cand, samples=500, seed=123)
        b = bootstrap_speedup_ci(ref, cand, samples=500, seed=123)
        c = bootstrap_speedup_ci(ref, cand, samples=500, seed=124)
        assert a == b
        assert a != c

    def test_speedup(self):
        assert speedup(10.0, 2.0) == 5.0
        assert math.isfinite(speedup(1.0, 0.0))


# ---------------------------------------------------------------------------------------------
# config.EvalConfig


class TestConfig:
    def test_unknown_key(self):
        with pytest.raises(ConfigError, match="bogus"):
            EvalConfig.from_dict({"bogus": 1, "timeout_s": 3})

    def test_unknown_key_in_yaml(self, tmp_path):
        p = tmp_path / "c.yaml"
        p.write_text("timeout_s: 3\ncorectness_trials: 4\n")
        with pytest.raises(ConfigError, match="corectness_trials"):
            EvalConfig.from_yaml(p)

    def test_yaml_loads(self, tmp_path):
        p = tmp_path / "c.yaml"
        p.write_text("timeout_s: 3\ncorrectness_trials: 4\n")
        cfg = EvalConfig.from_yaml(p)
        assert cfg.timeout_s == 3 and cfg.correctness_trials == 4

    def test_yaml_not_a_mapping(self, tmp_path):
        p = tmp_path / "c.yaml"
        p.write_text("- a\n- b\n")
        with pytest.raises(ConfigError):
            EvalConfig.from_yaml(p)

    def test_yaml_missing_file(self, tmp_path):
        with pytest.raises(ConfigError):
            EvalConfig.from_yaml(tmp_path / "nope.yaml")

    def test_yaml_empty_is_defaults(self, tmp_path):
        p = tmp_path / "c.yaml"
        p.write_text("")
        assert EvalConfig.from_yaml(p) == EvalConfig()

    @pytest.mark.parametrize("name", ["default", "fast", "thorough", "kernelbench-v0"])
    def test_presets_load(self, name):
        cfg = EvalConfig.preset(name)
        assert isinstance(cfg, EvalConfig)
        assert len(cfg.hash()) == 16

    def test_preset_contents(self):
        assert EvalConfig.preset("default") == EvalConfig()
        assert EvalConfig.preset("kernelbench-v0").tolerance == "kernelbench-v0"
        assert EvalConfig.preset("fast").correctness_trials < EvalConfig().correctness_trials
        assert EvalConfig.preset("thorough").correctness_trials > EvalConfig().correctness_trials
        hashes = {EvalConfig.preset(n).hash() for n in ("default", "fast", "thorough", "kernelbench-v0")}
        assert len(hashes) == 4

    def test_unknown_preset(self):
        with pytest.raises(ConfigError, match="nope"):
            EvalConfig.preset("nope")

    def test_hash_stable(self):
        assert EvalConfig().hash() == EvalConfig().hash()
        assert EvalConfig(timeout_s=3.5, tolerance="strict").hash() == EvalConfig(timeout_s=3.5).hash()

    def test_hash_same_for_equal_configs(self):
        assert EvalConfig(timeout_s=3) == EvalConfig(timeout_s=3.0)
        assert EvalConfig(timeout_s=3).hash() == EvalConfig(timeout_s=3.0).hash()

    def test_hash_stable_across_processes(self):
        code = "from cudal1.config import EvalConfig; print(EvalConfig(tolerance='kernelbench-v0').hash())"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        assert out == EvalConfig(tolerance="kernelbench-v0").hash()

    def test_hash_changes_with_verdict_fields(self):
        base = EvalConfig().hash()
        assert EvalConfig(tolerance="kernelbench-v0").hash() != base
        assert EvalConfig(correctness_trials=7).hash() != base
        assert EvalConfig(math_mode="torch-default").hash() != base
        assert EvalConfig(seed=1).hash() != base

    def test_hash_ignores_paths_and_workers(self, tmp_path):
        base = EvalConfig().hash()
        assert EvalConfig(cache_dir=str(tmp_path)).hash() == base
        assert EvalConfig(build_workers=3).hash() == base
        assert EvalConfig(keep_samples=False).hash() == base
        assert EvalConfig(input_seed=1234).hash() == base

    @pytest.mark.parametrize(
        "bad",
        [
            {"device": "gpu"},
            {"tolerance": "loose"},
            {"math_mode": "fast"},
            {"correctness_trials": 0},
            {"timing_trials": 0},
            {"min_timing_trials": 0},
            {"timeout_s": 0},
            {"build_timeout_s": -1},
            {"setup_timeout_s": 0},
            {"timing_budget_s": 0},
            {"input_sets": 0},
        ],
        ids=lambda d: next(iter(d)),
    )
    def test_bad_values(self, bad):
        with pytest.raises(ConfigError):
            EvalConfig(**bad)
        with pytest.raises(ConfigError):
            EvalConfig.from_dict(bad)

    def test_config_error_is_value_error(self):
        assert issubclass(ConfigError, ValueError)

    def test_replace_ignores_none(self):
        cfg = EvalConfig(timeout_s=5).replace(timeout_s=None, correctness_trials=2)
        assert cfg.timeout_s == 5 and cfg.correctness_trials == 2

    def test_replace_validates(self):
        with pytest.raises(ConfigError):
            EvalConfig().replace(device="tpu")

    def test_to_dict_round_trip(self):
        cfg = EvalConfig(timeout_s=7, tolerance="kernelbench-v0", extra={"a": 1})
        assert EvalConfig.from_dict(cfg.to_dict()) == cfg

    def test_cache_root(self, tmp_path, monkeypatch):
        monkeypatch.setenv("CUDAL1_CACHE_DIR", str(tmp_path / "env"))
        assert EvalConfig().cache_root() == tmp_path / "env"
        assert EvalConfig(cache_dir=str(tmp_path / "cfg")).cache_root() == tmp_path / "cfg"


# ---------------------------------------------------------------------------------------------
# types and flags

CONTRACT_KEYS = {"status", "correct", "speedup", "reference_ms", "candidate_ms", "flags", "message"}


def _full_result() -> EvalResult:
    return EvalResult(
        status=Status.OK,
        task_name="diag_matmul",
        task_hash="t" * 64,
        candidate_hash="c" * 64,
        message="",
        flags=["cpu_timing"],
        correctness=Correctness(trials=5, passed=5, max_abs_error=0.0, max_rel_error=0.0, rechecked=2),
        reference=Timing.from_samples([2.0, 2.2, 2.1, 1.9], "cpu_monotonic"),
        candidate=Timing.from_samples([1.0, 1.1, 0.9], "cpu_monotonic"),
        speedup=2.0,
        speedup_ci=(1.8, 2.3),
        phase="done",
        environment=Environment(device="cpu", torch="2.x", python="3.11"),
        config_hash="abc",
        wall_s=1.5,
        build_s=0.1,
    )


class TestTypes:
    def test_summary_contract(self):
        s = _full_result().summary()
        assert CONTRACT_KEYS <= set(s)
        assert s["status"] == "ok" and s["correct"] is True
        assert s["speedup"] == 2.0
        assert s["reference_ms"] == pytest.approx(2.05)
        assert s["candidate_ms"] == pytest.approx(1.0)
        assert s["flags"] == ["cpu_timing"]
        assert s["speedup_ci"] == [1.8, 2.3]
        json.dumps(s)

    def test_summary_of_failure(self):
        r = EvalResult(status=Status.INCORRECT, message="bad", flags=["value_mismatch"])
        s = r.summary()
        assert CONTRACT_KEYS <= set(s)
        assert s["correct"] is False
        assert s["speedup"] is None and s["reference_ms"] is None and s["candidate_ms"] is None
        assert s["status"] == "incorrect" and s["message"] == "bad"

    def test_only_ok_is_correct(self):
        for status in Status:
            assert EvalResult(status=status).correct is (status is Status.OK)

    def test_round_trip(self):
        r = _full_result()
        assert EvalResult.from_dict(r.to_dict()) == r

    def test_round_trip_through_json(self):
        r = _full_result()
        back = EvalResult.from_dict(json.loads(json.dumps(r.to_dict())))
        assert back == r
        assert isinstance(back.status, Status)
        assert isinstance(back.speedup_ci, tuple)
        assert isinstance(back.reference, Timing)

    def test_round_trip_minimal(self):
        r = EvalResult(status=Status.TIMEOUT, message="killed")
        assert EvalResult.from_dict(json.loads(json.dumps(r.to_dict()))) == r

    def test_to_dict_status_is_a_string(self):
        assert _full_result().to_dict()["status"] == "ok"

    def test_timing_from_samples(self):
        t = Timing.from_samples([3.0, 1.0, 2.0], "cuda_event", keep=False)
        assert t.median_ms == 2.0 and t.min_ms == 1.0 and t.trials == 3
        assert t.samples_ms == []
        single = Timing.from_samples([5.0], "cpu_monotonic")
        assert single.iqr_ms == 0.0 and single.median_ms == 5.0


class TestFlags:
    def test_unknown_flag(self):
        with pytest.raises(KeyError):
            flags.check("definitely_not_a_flag")

    def test_known_flag(self):
        assert flags.check("cpu_timing") == "cpu_timing"

    def test_all_flags_documented(self):
        for name, text in flags.FLAGS.items():
            assert name == name.lower() and " " not in name
            assert text


class TestCharge:
    """stats.charge: two-clock samples -> charged times and the side-stream decision."""

    def _honest(self, n=50, stream=0.1, base=0.02, jitter=0.002):
        import random as _r

        rng = _r.Random(0)
        s = [stream + rng.uniform(-0.005, 0.005) for _ in range(n)]
        d = [x + base + rng.uniform(0, jitter) for x in s]
        return s, d

    def test_honest_candidate_is_not_side_stream(self):
        from cudal1.harness.stats import charge

        rs, rd = self._honest(stream=0.3)
        cs, cd = self._honest(stream=0.1)
        c = charge(rs, rd, cs, cd, [0.02] * 30)
        assert not c.side_stream
        assert abs(np.median(c.cand_ms) - np.median(cs)) < 0.005

    def test_escaped_work_is_charged_and_flagged(self):
        from cudal1.harness.stats import charge

        rs, rd = self._honest(stream=0.3)
        cs, cd = self._honest(stream=0.01)
        cd = [d + 0.25 for d in cd]  # 0.25 ms still running on another stream
        c = charge(rs, rd, cs, cd, [0.02] * 30)
        assert c.side_stream
        assert np.median(c.cand_ms) > 0.25

    def test_empty_calibration_uses_reference_excess(self):
        from cudal1.harness.stats import charge

        rs, rd = self._honest(stream=0.3, base=0.05)
        cs, cd = self._honest(stream=0.1, base=0.05)
        assert not charge(rs, rd, cs, cd, []).side_stream

    def test_cpu_clocks_agree(self):
        from cudal1.harness.stats import charge

        c = charge([1.0, 2.0], [1.0, 2.0], [0.5, 0.6], [0.5, 0.6], [])
        assert c.cand_ms == [0.5, 0.6] and not c.side_stream


REPO = __import__("pathlib").Path(__file__).resolve().parents[1]


def test_kernel_names_classify_library_and_custom():
    from cudal1.harness.kernels import custom_kernels

    library = [
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int, float*)",
        "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1",
        "nvjet_tst_128x64_64x8_1x2_h_bz_TNT", "Memcpy DtoD (Device -> Device)", "triton_poi_fused_add_relu_0",
        "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm>(Params)", "cudnn::engines_precompiled::nchwToNhwcKernel",
    ]
    custom = ["fused_relu_scale_kernel", "mean_dim0_kernel<float>", "_triton_relu_kernel", "add_kernel"]
    assert custom_kernels(library) == []
    assert custom_kernels(library + custom) == custom


def test_hyperparameter_guard_catches_ignored_constructor_arguments():
    from cudal1.harness.static_guard import run_static_guards

    ref = (REPO / "examples" / "tasks" / "linear_relu.py").read_text()
    good = (REPO / "examples" / "candidates" / "linear_relu_addmm.py").read_text()
    assert not run_static_guards(good, reference=ref)
    ignored = good.replace("self.scale = scale", "self.scale = 0.5")
    (finding,) = run_static_guards(ignored, reference=ref)
    assert finding.flag == "hyperparameter_ignored" and finding.reject
    fewer = good.replace("def __init__(self, in_features, out_features, scale):", "def __init__(self, in_features, out_features):")
    fewer = fewer.replace("self.scale = scale", "self.scale = 0.5")
    assert [f.flag for f in run_static_guards(fewer, reference=ref)] == ["hyperparameter_ignored"]
    inherits = "from torch import nn\nclass ModelNew(Model):\n    pass\n"
    assert not run_static_guards(inherits, reference=ref)
    forwards = "class ModelNew(Model):\n    def __init__(self, *args):\n        super().__init__(*args)\n"
    assert not run_static_guards(forwards, reference=ref)


# ---------------------------------------------------------------------------------------------
# harness.static_guard: the "frames" check


def test_frames_guard_flags_frame_and_closure_walking_only():
    from cudal1.harness.static_guard import run_static_guards

    def flags_of(src):
        return [f.check for f in run_static_guards(src, ["frames"])]

    assert flags_of("import sys\ntry:\n    1/0\nexcept Exception as e:\n    f = e.__traceback__.tb_frame\n") == ["frames"]
    assert flags_of("def g(f):\n    return getattr(f, 'f_back')\n") == ["frames"]
    assert flags_of("import ctypes\np = ctypes.pythonapi\n") == ["frames"]
    assert flags_of("import signal as s\ns.signal(s.SIGUSR1, print)\n") == ["frames"]
    assert flags_of("import sys\nx = sys._current_frames()\n") == ["frames"]
    assert flags_of("def f():\n    pass\nc = f.__closure__\n") == ["frames"]
    honest = (REPO / "tests" / "fixtures" / "cpu_more" / "honest_thread_queue_handoff.py").read_text()
    assert flags_of(honest) == []


# ---------------------------------------------------------------------------------------------
# harness.sandbox.verdict_problem: the parent's re-checks of an "ok" verdict


def _ok_verdict(**changes):
    data = {"status": "ok", "correctness": {"trials": 5, "passed": 5, "by_dtype": {"float32": [1e-5, 3.0]}},
            "raw": {"ref_stream": [1.0, 1.0], "cand_stream": [0.5, 0.5]}}
    data.update(changes)
    return data


class TestVerdictProblem:
    JOB = {"mode": "eval", "config": {"correctness_trials": 5}, "tolerances": STRICT}
    PHASES = ["setup", "reference", "import", "construct", "correctness", "timing", "verify", "verify_timing"]

    def test_honest_verdict_holds(self):
        from cudal1.harness.sandbox import verdict_problem

        assert verdict_problem(self.JOB, self.PHASES, _ok_verdict()) == ""
        assert verdict_problem(self.JOB, ["setup"], {"status": "incorrect"}) == ""  # only "ok" is re-checked
        assert verdict_problem({"mode": "build"}, ["setup", "import"], {"status": "ok"}) == ""

    def test_missing_or_reordered_phases(self):
        from cudal1.harness.sandbox import verdict_problem

        assert "phases" in verdict_problem(self.JOB, ["setup", "reference", "import", "construct", "correctness"], _ok_verdict())
        assert "phases" in verdict_problem(self.JOB, ["setup", "reference", "import", "construct", "timing", "correctness"],
                                           _ok_verdict())

    def test_too_few_trials_or_no_timing(self):
        from cudal1.harness.sandbox import verdict_problem

        assert "correctness trials" in verdict_problem(self.JOB, self.PHASES, _ok_verdict(correctness={"trials": 2, "passed": 2}))
        assert "correctness trials" in verdict_problem(self.JOB, self.PHASES, _ok_verdict(correctness={"trials": 5, "passed": 4}))
        assert "timed calls" in verdict_problem(self.JOB, self.PHASES, _ok_verdict(raw={}))

    def test_errors_beyond_the_parents_tolerances(self):
        from cudal1.harness.sandbox import verdict_problem

        # 1% off on values near 3: passes only with a loosened table in the worker
        loose = _ok_verdict(correctness={"trials": 5, "passed": 5, "by_dtype": {"float32": [0.03, 3.0]}})
        assert "exceeds the judge's tolerance" in verdict_problem(self.JOB, self.PHASES, loose)
        # exactly at the bound of the elementwise test is fine
        edge = _ok_verdict(correctness={"trials": 5, "passed": 5, "by_dtype": {"float32": [1e-4 + 1e-4 * 3.0, 3.0]}})
        assert verdict_problem(self.JOB, self.PHASES, edge) == ""

    def test_compare_reports_per_dtype_errors(self):
        ref = torch.tensor([1.0, -3.0, float("inf")])
        out = ref + torch.tensor([1e-5, -2e-5, 0.0])
        mismatch, errors = cmp.compare(ref, out, STRICT, "cpu")
        assert mismatch is None
        max_abs, max_ref = errors.by_dtype["float32"]
        assert max_abs == pytest.approx(2e-5, rel=1e-2) and max_ref == 3.0  # the infinite reference is not counted


# ---------------------------------------------------------------------------------------------
# harness.audit_guard, in a child interpreter (a hook cannot be removed once installed)

_AUDIT_SCRIPT = r'''
import os, sys, traceback
from cudal1.harness import audit_guard

CAND = "/nonexistent/cand_under_test.py"
scenario, fd = sys.argv[1], int(sys.argv[2])

def send(kind, payload):
    sys.audit("cudal1.channel", kind, payload)

def finish(status):
    send("result", '{"status": "%s"}' % status)

def phase(name):
    send("phase", '{"name": "%s"}' % name)

def tolerances():
    table = {}
    sys.audit("cudal1.tolerances", table)
    return table

def run():
    phase("correctness")
    if scenario == "tolerances":
        assert tolerances() == {"float32": (1e-4, 1e-4)}
    if scenario == "library_frames":  # the standard library reading frames for the judge or the candidate
        try:
            1 / 0
        except ZeroDivisionError:
            traceback.format_exc()
    if scenario == "inventory_no_leak":  # the inventory must not keep its callers' locals alive
        import gc, weakref
        gc.disable()
        class Big: pass
        def call():
            big = Big()
            INVENTORY[0]()
            return weakref.ref(big)
        refs = [call() for _ in range(3)]
        assert all(r() is None for r in refs), "the thread inventory kept a caller's locals alive"
    if scenario in CANDIDATE:
        exec(compile(CANDIDATE[scenario], CAND, "exec"), {"finish": finish, "send": send, "sys": sys})
    finish("ok")
    if scenario == "twice":
        finish("ok")

CANDIDATE = {
    "forge_finish": "finish('ok')",
    "forge_event": "sys.audit('cudal1.channel', 'result', '{\"status\": \"ok\"}')",
    "tb_frame": "try:\n    1/0\nexcept Exception as e:\n    f = getattr(e.__traceback__, 'tb_' + 'frame')",
    "getframe": "getattr(sys, '_get' + 'frame')(0)",
    "inspect_stack": "import inspect\ngetattr(inspect, 'st' + 'ack')()",
    "gc": "import gc\ngc.get_referrers(sys)",
    "current_frames": "sys._current_frames()",
    "thread_forge": "import threading\nt = threading.Thread(target=finish, args=('ok',))\nt.start()\nt.join()",
}

INVENTORY = []

def entry():
    INVENTORY[:] = [audit_guard.install(b"k" * 32, fd, candidate_path=CAND, bottom=sys._getframe(), send=send, chain=[finish, phase, run],
                        building=entry, register=entry, tolerances_fn=tolerances, profiled=entry,
                        tolerances={"float32": (1e-4, 1e-4)})]
    run()

entry()
os._exit(0)
'''


def _audit_run(scenario: str) -> list[Message]:
    import os
    import struct

    r, w = os.pipe()
    try:
        proc = subprocess.run([sys.executable, "-c", _AUDIT_SCRIPT, scenario, str(w)], pass_fds=(w,), timeout=120,
                              capture_output=True, text=True)
        os.close(w)
        w = -1
        data = b""
        while chunk := os.read(r, 1 << 16):
            data += chunk
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
    rx, out, pos = Receiver(b"k" * 32), [], 0
    while pos < len(data):
        (n,) = struct.unpack("!i", data[pos:pos + 4])
        out.append(rx.decode(data[pos + 4:pos + 4 + n]))
        pos += 4 + n
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


class TestAuditGuard:
    def test_the_protocol_chain_signs(self):
        msgs = _audit_run("tolerances")
        assert [(m.kind, m.data) for m in msgs] == [("phase", {"name": "correctness"}), ("result", {"status": "ok"})]

    def test_library_code_may_read_frames(self):
        assert [m.kind for m in _audit_run("library_frames")] == ["phase", "result"]

    def test_one_verdict_only(self):
        assert [m.kind for m in _audit_run("twice")] == ["phase", "result"]

    def test_thread_inventory_keeps_no_frames_alive(self):
        assert [m.kind for m in _audit_run("inventory_no_leak")] == ["phase", "result"]

    @pytest.mark.parametrize("scenario, reason", [
        ("forge_finish", "outside the judge's protocol"),
        ("forge_event", "outside the judge's protocol"),
        ("thread_forge", "another thread"),
        ("tb_frame", "tb_frame"),
        ("getframe", "sys._getframe"),
        ("inspect_stack", "sys._getframe"),
        ("gc", "gc.get_referrers"),
        ("current_frames", "sys._current_frames"),
    ])
    def test_candidate_reaching_for_the_judge_ends_the_worker(self, scenario, reason):
        if reason == "sys._getframe" and sys.version_info < (3, 11):
            pytest.skip("sys._getframe is an audit event from Python 3.11 on")
        msgs = _audit_run(scenario)
        assert [m.kind for m in msgs] == ["phase", "tamper"], msgs
        assert reason in msgs[-1].data["reason"]


def test_cuda_error_boilerplate_is_not_an_illegal_memory_access():
    from cudal1.harness.worker import classify_runtime

    boilerplate = ("CUDA kernel errors might be asynchronously reported at some other API call.\n"
                   "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")
    os_error = RuntimeError("CUDA error: OS call failed or operation not supported on this OS\n" + boilerplate)
    assert "illegal_memory_access" not in classify_runtime(os_error, "correctness").flags
    fault = RuntimeError("CUDA error: an illegal memory access was encountered\n" + boilerplate)
    assert "illegal_memory_access" in classify_runtime(fault, "correctness").flags
    assert "illegal_memory_access" in classify_runtime(RuntimeError("CUDA error: device-side assert triggered"), "x").flags
