"""cudal1.profile: the data model, the class rule, shares of peak, text, ncu's CSV, the CPU collection
(in process), and the reference worker's re-typing of a candidate's reply."""

from __future__ import annotations

import math

import pytest
import torch

from cudal1.profile import BoundClass, KernelStat, Profiles, ProfileStatus, ProgramProfile
from cudal1.profile.collect import call_bytes, count_flops, main_dtype, profile_call
from cudal1.profile.ncu import ncu_problem, parse_csv
from cudal1.profile.rules import classify, derive, peak_flops
from cudal1.profile.text import describe_profiles, family, time_moved
from cudal1.types import EvalResult, Status


def _profile(call_us: float, busy_us: float, kernels: list[tuple[str, float]] | None = None) -> ProgramProfile:
    ks = kernels or [("k", busy_us)]
    total = sum(t for _, t in ks)
    return ProgramProfile(status=ProfileStatus.OK, device="cuda", call_us=call_us, busy_us=busy_us,
                          kernels=[KernelStat(n, 1, t, t, t / total) for n, t in ks])


class TestRule:
    def test_mostly_idle_device_is_launch_bound_whatever_the_intensity(self):
        assert classify(0.3, 1000.0, 10.0) is BoundClass.LAUNCH

    @pytest.mark.parametrize("intensity, expected", [
        (0.0, BoundClass.MEMORY), (4.9, BoundClass.MEMORY), (5.1, BoundClass.MIXED), (19.9, BoundClass.MIXED),
        (20.1, BoundClass.COMPUTE),
    ])
    def test_intensity_against_the_ridge_with_a_factor_of_two(self, intensity, expected):
        assert classify(0.9, intensity, 10.0) is expected

    def test_unknown_peak_is_mixed_unless_there_is_no_arithmetic(self):
        assert classify(0.9, 3.0, None) is BoundClass.MIXED
        assert classify(0.9, 0.0, None) is BoundClass.MEMORY

    def test_derive_fills_shares_of_peak(self):
        p = derive(_profile(100.0, 90.0), bytes_moved=2_000_000, flops=4_000_000, peak_bandwidth=4e12,
                   peak_flop_rate=67e12)
        assert p.achieved_bandwidth == pytest.approx(2e10) and p.bandwidth_share == pytest.approx(0.005)
        assert p.achieved_flops == pytest.approx(4e10) and p.flops_share == pytest.approx(4e10 / 67e12)
        assert p.intensity == pytest.approx(2.0) and p.bound is BoundClass.MEMORY  # ridge 16.75 FLOP/B

    def test_derive_leaves_a_failed_profile_alone(self):
        p = derive(ProgramProfile.not_ok(ProfileStatus.FAILED, "x"), 10, 10, 1.0, 1.0)
        assert p.bytes_moved is None and p.bound is None

    def test_peak_table_matches_device_names(self):
        assert peak_flops("NVIDIA H200", "bfloat16") == 989e12
        assert peak_flops("NVIDIA H200", "int8") is None and peak_flops("Some GPU", "float32") is None
        assert peak_flops(None, "float32") is None


class TestModel:
    def test_round_trip_keeps_every_field_and_names_the_class(self):
        p = derive(_profile(50.0, 10.0, [("a", 6.0), ("b", 4.0)]), 100, 0, None, None)
        p.kernels[0].grid, p.kernels[0].block, p.kernels[0].registers = [4, 1, 1], [256, 1, 1], 32
        pair = Profiles(tool="cupti", reference=p, candidate=ProgramProfile.not_ok(ProfileStatus.FAILED, "why"))
        d = pair.to_dict()
        assert d["reference"]["class"] == "launch-bound" and "bound" not in d["reference"]
        assert d["candidate_trusted"] is False and d["candidate"]["status"] == "failed"
        back = Profiles.from_dict(d)
        assert back.reference == p and back.candidate.note == "why"

    def test_eval_result_carries_the_profile_through_json(self):
        pair = Profiles(reference=_profile(10.0, 9.0), candidate=_profile(5.0, 4.0))
        r = EvalResult(Status.OK, profile=pair)
        again = EvalResult.from_dict(r.to_dict())
        assert again.profile == pair
        assert r.summary()["profile"]["candidate"]["call_us"] == 5.0
        assert EvalResult.from_dict(EvalResult(Status.OK).to_dict()).profile is None

    def test_old_records_without_a_profile_still_load(self):
        d = EvalResult(Status.OK).to_dict()
        del d["profile"]
        assert EvalResult.from_dict(d).profile is None


class TestText:
    def test_families_read_from_names(self):
        assert [family(n) for n in ("aten::mm", "ampere_sgemm_128x64_nn", "triton_red_fused_sum_0", "Memcpy DtoD",
                                    "void at::native::vectorized_elementwise_kernel<4>", "my_kernel")] == \
            ["gemm", "gemm", "reduce", "copy", "elementwise", "other"]

    def test_time_moved_lists_the_largest_change_first(self):
        ref = _profile(100.0, 90.0, [("aten::mm", 80.0), ("aten::relu", 10.0)])
        cand = _profile(30.0, 25.0, [("fused_kernel", 25.0)])
        lines = time_moved(ref, cand)
        assert lines[0].split()[0] == "gemm" and "80 us" in lines[0] and lines[1].split()[0] == "other"

    def test_side_by_side_shows_top_kernels_and_the_rest(self):
        ks = [(f"k{i}", float(10 - i)) for i in range(8)]
        pair = Profiles(reference=derive(_profile(60.0, 52.0, ks), 1000, 0, None, None),
                        candidate=ProgramProfile.not_ok(ProfileStatus.FAILED, "the candidate's process: gone"))
        text = "\n".join(describe_profiles(pair, top=5))
        assert "k4" in text and "k5" not in text and "3 more" in text
        assert "candidate: the candidate's process: gone" in text and "information only" in text
        status = next(line for line in text.splitlines() if line.split()[:1] == ["status"])
        assert status.split() == ["status", "-", "failed"]  # the side-by-side row: reference has none
        assert text.splitlines()[1].split() == ["reference", "candidate"]


NCU_CSV = '''==PROF== Connected to process 1
"ID","Kernel Name","gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed","gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed","sm__warps_active.avg.pct_of_peak_sustained_active","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"
"","","nsecond","%","%","%","ratio","ratio"
"0","gemm","3000","80","40","50","1.0","0.5"
"1","relu","1000","20","90","70","4.0","0"
'''  # noqa: E501 - ncu's header line as it prints it


class TestNcu:
    def test_csv_is_averaged_by_duration_and_stalls_ranked(self):
        m = parse_csv(NCU_CSV)
        assert not isinstance(m, str), m
        assert m.kernels == 2 and m.sm_throughput == 65.0 and m.dram_throughput == 52.5
        assert m.achieved_occupancy == 55.0
        assert [r for r, _ in m.stalls] == ["long_scoreboard", "barrier"]
        assert m.stalls[0][1] == pytest.approx(1.75)

    def test_no_kernel_is_a_reason_not_a_crash(self):
        assert parse_csv("==PROF== Disconnected\n").startswith("ncu: no kernel")

    def test_one_line_reasons(self, monkeypatch):
        assert "no CUDA device" in ncu_problem(cuda_available=False)
        monkeypatch.setenv("PATH", "/nonexistent")
        monkeypatch.delenv("CUDAL1_NCU", raising=False)
        reason = ncu_problem(cuda_available=True)
        assert "not on PATH" in reason and "\n" not in reason


class TestCollectOnTheCpu:
    def test_operators_of_one_call_with_shares_summing_to_one(self):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU())
        x = torch.randn(16, 64)
        p, out = profile_call(model, (x,), torch.device("cpu"))
        assert p.ok and p.device == "cpu" and torch.equal(out, model(x))
        names = [k.name for k in p.kernels]
        assert "aten::addmm" in names and ("aten::relu" in names or "aten::clamp_min" in names), names
        assert math.isclose(sum(k.share for k in p.kernels), 1.0, rel_tol=1e-9)
        assert 0 < p.busy_us <= p.call_us

    def test_a_programs_own_ranges_are_not_operators(self):
        from torch.profiler import record_function

        class Ranged(torch.nn.Module):
            def forward(self, x):
                with record_function("my_range"):
                    y = x @ x
                return torch.relu(y)

        p, _ = profile_call(Ranged(), (torch.randn(64, 64),), torch.device("cpu"))
        names = [k.name for k in p.kernels]
        assert "aten::mm" in names and "my_range" not in names, names

    def test_bytes_count_each_storage_once_and_flops_count_the_matmul(self):
        model = torch.nn.Linear(64, 32)
        x = torch.randn(16, 64)
        out = model(x)
        weights = (64 * 32 + 32) * 4
        assert call_bytes((x, x), out, model) == 16 * 64 * 4 + 16 * 32 * 4 + weights
        assert count_flops(model, (x,)) == 2 * 16 * 64 * 32
        assert main_dtype((x.double(),), out) == "float64"


class TestRetype:
    def test_a_forged_reply_is_capped_and_typed(self):
        from cudal1.harness.reference.profiling import retype

        raw = {"status": "ok", "call_us": 10, "busy_us": 99, "device": "cuda" * 10,
               "kernels": [{"name": "x" * 1000, "launches": 2, "total_us": 4, "mean_us": 2, "share": 7,
                            "grid": [1, "2"], "registers": True}] * 500}
        p = retype(raw)
        assert p.ok and p.busy_us == 10 and len(p.device) == 8 and len(p.kernels) == 200
        k = p.kernels[0]
        assert len(k.name) == 300 and k.share == 1.0 and k.grid is None and k.registers is None

    @pytest.mark.parametrize("raw", [None, [], {"status": "bogus"}, {"status": "ok", "call_us": "nan"},
                                     {"status": "ok", "call_us": -1}, {"status": "ok", "kernels": [{"name": "k"}]}])
    def test_malformed_replies_become_failed_profiles(self, raw):
        from cudal1.harness.reference.profiling import retype

        p = retype(raw)
        assert p.status is ProfileStatus.FAILED and "malformed" in p.note


class _Event:
    """A stand-in for torch's _KinetoEvent (what the CUDA path reads of it)."""

    def __init__(self, name, device, start_us, dur_us, meta="", kind=None):
        self._n, self._d, self._s, self._u, self._m = name, device, start_us, dur_us, meta
        self._k = kind or ("kernel" if device == torch.autograd.DeviceType.CUDA else "cpu_op")

    def activity_type(self):
        return self._k

    def name(self):
        return self._n

    def device_type(self):
        return self._d

    def start_ns(self):
        return int(self._s * 1000)

    def duration_ns(self):
        return int(self._u * 1000)

    def metadata_json(self):
        return self._m


class _Prof:
    def __init__(self, events, trace=None):
        from types import SimpleNamespace

        self.profiler = SimpleNamespace(kineto_results=SimpleNamespace(events=lambda: events))
        self.trace = trace

    def export_chrome_trace(self, path):
        import json

        with open(path, "w") as f:
            json.dump({"traceEvents": self.trace or []}, f)


class TestCudaPathWithStandInEvents:
    """The CUDA branch of the collection, fed kineto-shaped events (no GPU here)."""

    KINETO_META = ('"queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": 11, '
                   '"registers per thread": 40, "shared memory": 4096, "grid": [128, 1, 1], "block": [256, 1, 1]')

    def _events(self, meta: str):
        from cudal1.profile.collect import CALL_LABEL

        cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
        return [_Event(CALL_LABEL, cpu, 0.0, 20.0, kind="user_annotation"),
                _Event("gemm_kernel", cuda, 15.0, 100.0, meta),
                _Event("relu_kernel", cuda, 130.0, 10.0, meta), _Event("relu_kernel", cuda, 150.0, 10.0, meta),
                _Event("aten::mm", cpu, 2.0, 5.0),
                # not work: the marker's range on the device's timeline, a program's own range, a sync record
                _Event(CALL_LABEL, cuda, 15.0, 145.0, kind="gpu_user_annotation"),
                _Event("my_range", cuda, 15.0, 100.0, kind="gpu_user_annotation"),
                _Event("cudaDeviceSynchronize", cuda, 160.0, 1.0, kind="cuda_sync")]

    def test_kernels_span_busy_time_and_cupti_fields(self):
        from cudal1.profile.collect import _cuda_profile

        p = _cuda_profile(_Prof(self._events(self.KINETO_META)))
        # the span is the device's (first kernel's start at 15 to the last one's end at 160): the
        # host's 15 us before the first launch are left out
        assert p.ok and p.device == "cuda" and p.call_us == 145.0 and p.busy_us == 120.0
        assert [(k.name, k.launches, k.total_us) for k in p.kernels] == [("gemm_kernel", 1, 100.0),
                                                                         ("relu_kernel", 2, 20.0)]
        k = p.kernels[0]
        assert k.grid == [128, 1, 1] and k.block == [256, 1, 1] and k.registers == 40 and k.shared_memory == 4096
        assert p.kernels[1].mean_us == 10.0 and abs(k.share - 100 / 120) < 1e-9

    def test_without_event_metadata_the_chrome_trace_supplies_it(self):
        from cudal1.profile.collect import _cuda_profile

        trace = [{"ph": "X", "cat": "kernel", "name": "gemm_kernel",
                  "args": {"grid": [64, 2, 1], "block": [128, 1, 1], "registers per thread": 32}},
                 {"ph": "X", "cat": "cpu_op", "name": "relu_kernel", "args": {"grid": [9, 9, 9]}}]
        p = _cuda_profile(_Prof(self._events(""), trace))
        gemm, relu = p.kernels
        assert gemm.grid == [64, 2, 1] and gemm.registers == 32 and relu.grid is None

    def test_a_lost_marker_is_a_failed_profile(self):
        from cudal1.profile.collect import CALL_LABEL, _cuda_profile

        cpu = torch.autograd.DeviceType.CPU  # the host's marker is lost; the device timeline's copy is no marker
        p = _cuda_profile(_Prof([e for e in self._events(self.KINETO_META)
                                 if not (e.name() == CALL_LABEL and e.device_type() == cpu)]))
        assert p.status is ProfileStatus.FAILED and "marker" in p.note
