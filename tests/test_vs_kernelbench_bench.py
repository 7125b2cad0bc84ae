"""benchmarks/vs_kernelbench.py without a GPU or KernelBench: the dry run's plan, its one-line
errors, the KernelBench driver (against a fake ``kernelbench`` package) and the rows, totals and
table it builds from KernelBench results and a ``cudal1 verify`` report."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "vs_kernelbench.py"

FAKE_EVAL = """
import os
import time

from pydantic import BaseModel


class KernelExecResult(BaseModel):
    compiled: bool = False
    correctness: bool = False
    metadata: dict = {}
    runtime: float = -1.0
    runtime_stats: dict = {}
    ref_runtime: float = -1.0
    ref_runtime_stats: dict = {}


def eval_kernel_against_ref(original_model_src, custom_model_src, seed_num=42, num_correct_trials=1,
                            num_perf_trials=10, measure_performance=False, timing_method="cuda_event", verbose=False,
                            build_dir=None, device=None, backend="cuda", precision=None):
    assert build_dir and os.environ.get("TORCH_EXTENSIONS_DIR") and measure_performance
    assert (num_correct_trials, num_perf_trials, timing_method, backend) == (5, 100, "cuda_event", "cuda")
    if "HANG" in custom_model_src:
        time.sleep(600)
    if "CRASH" in custom_model_src:
        os._exit(3)
    if "RAISE" in custom_model_src:
        raise ValueError("boom")
    if "FAIL" in custom_model_src:
        error = RuntimeError("Error building extension 'x'")
        metadata = {"compilation_error_name": "RuntimeError", "compilation_error": error}
        return KernelExecResult(compiled=False, metadata=metadata)
    return KernelExecResult(compiled=True, correctness=True, runtime=1.5, ref_runtime=3.0,
                            metadata={"correctness_trials": "(5 / 5)"})
"""


def load_script():
    spec = importlib.util.spec_from_file_location("vs_kernelbench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def vk():
    return load_script()


def write_records(path: Path, codes: list[str | None]) -> Path:
    ref = (
        "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n        return x\n"
    )
    lines = [
        json.dumps(
            {
                "level_id": 1, "task_id": 10 + i, "ref_code": ref,
                "custom_code": "None" if code is None else code, "score_default": 1.5,
            }
        )
        for i, code in enumerate(codes)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def fake_kernelbench(root: Path) -> Path:
    pkg = root / "src" / "kernelbench"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "eval.py").write_text(FAKE_EVAL)
    return root / "src"


def test_dry_run_lists_the_records_and_both_commands(vk, tmp_path, capsys):
    records = write_records(tmp_path / "r.jsonl", ["code A", None, "code C"])
    src = fake_kernelbench(tmp_path / "kb")
    rc = vk.main(
        ["--dry-run", "--records", str(records), "--kernelbench-src", str(src), "--out", str(tmp_path / "o.json")]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "3 records, 2 with code" in out
    assert all(key in out for key in ("level1/10", "level1/11", "level1/12")) and "none (not run)" in out
    assert "order: cudal1 verify then KernelBench" in out
    assert "cudal1.cli.main verify" in out and "--device cuda" in out and "--json" in out
    assert "CUDAL1_CACHE_DIR=" in out and "TORCH_EXTENSIONS_DIR=" in out
    assert "--kb-one" in out and f"PYTHONPATH={src}" in out
    assert "num_correct_trials=5, num_perf_trials=100, measure_performance=True" in out
    assert not (tmp_path / "o.json").exists()


def test_dry_run_order_only_and_limit(vk, tmp_path, capsys):
    records = write_records(tmp_path / "r.jsonl", ["a", "b", "c"])
    assert vk.main(["--dry-run", "--records", str(records), "--only", "cudal1", "--limit", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 records" in out and "level1/12" not in out and "records.jsonl" in out
    assert "verify" in out and "--kb-one" not in out
    src = fake_kernelbench(tmp_path / "kb")
    assert vk.main(["--dry-run", "--records", str(records), "--kernelbench-src", str(src), "--order", "kb-first"]) == 0
    out = capsys.readouterr().out
    assert out.index("--kb-one") < out.index("cudal1.cli.main verify")


def test_bad_inputs_are_one_line_errors(vk, tmp_path, capsys):
    records = write_records(tmp_path / "r.jsonl", ["a"])
    assert vk.main(["--dry-run", "--records", str(records)]) == 2
    assert capsys.readouterr().err.strip() == (
        "vs_kernelbench: --kernelbench-src PATH is required (a KernelBench checkout's src directory; or --only cudal1)")
    kb = tmp_path / "kb"
    fake_kernelbench(kb)
    assert vk.main(["--dry-run", "--records", str(records), "--kernelbench-src", str(kb)]) == 2
    assert "no kernelbench/eval.py there (did you mean its src/ directory?)" in capsys.readouterr().err
    assert vk.main(["--dry-run", "--records", str(tmp_path / "absent.jsonl"), "--only", "cudal1"]) == 2
    assert capsys.readouterr().err.startswith("vs_kernelbench: no records file")
    (tmp_path / "bad.jsonl").write_text('{"level_id": 1}\n')
    assert vk.main(["--dry-run", "--records", str(tmp_path / "bad.jsonl"), "--only", "cudal1"]) == 2
    assert "not a CUDA-L1 record" in capsys.readouterr().err


@pytest.mark.cpu
def test_missing_kernelbench_src_exits_with_one_line(tmp_path):
    records = write_records(tmp_path / "r.jsonl", ["a"])
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--records", str(records), "--kernelbench-src", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"vs_kernelbench: --kernelbench-src {tmp_path / 'nope'}: no such directory"
    ]
    assert "Traceback" not in done.stderr + done.stdout


class Fake:
    """A KernelExecResult stand-in of pydantic v1 (``.dict()``)."""

    def __init__(self, **kw):
        self.kw = kw

    def dict(self):
        return dict(self.kw)


def test_kb_result_dict(vk):
    assert vk.kb_result_dict(None) is None
    got = vk.kb_result_dict(
        Fake(compiled=True, correctness=False, metadata={"runtime_error": RuntimeError("illegal memory")})
    )
    assert got == {"compiled": True, "correctness": False, "metadata": {"runtime_error": "illegal memory"}}

    class V2:
        def model_dump(self):
            return {"compiled": True, "runtime": 1.0}

    assert vk.kb_result_dict(V2()) == {"compiled": True, "runtime": 1.0}
    assert vk.kb_result_dict({"compiled": False}) == {"compiled": False}


def _rec(i, code="x"):
    return {"index": i, "key": f"level1/{i}", "level": 1, "ref_code": "r", "custom_code": code}


def test_kb_rows_classify_every_outcome(vk):
    ok = {"ok": True, "import_s": 2.0, "eval_s": 5.0,
          "result": {"compiled": True, "correctness": True, "runtime": 1.5, "ref_runtime": 3.0,
                     "metadata": {"correctness_trials": "(5 / 5)", "excessive_speedup": False}}}
    row = vk.kb_row(_rec(0), rc=0, timed_out=False, wall_s=9.0, driver=ok, log_tail="noise")
    assert row["outcome"] == "correct" and row["speedup"] == 2.0 and row["eval_s"] == 5.0 and row["log_tail"] == ""
    assert row["correctness_trials"] == "(5 / 5)"

    compile_err = {
        "ok": True,
        "result": {
            "compiled": False, "correctness": False, "runtime": -1.0, "ref_runtime": -1.0,
            "metadata": {
                "compilation_error_name": "RuntimeError",
                "compilation_error": "ninja failed\nError building extension 'k'",
            },
        },
    }
    row = vk.kb_row(_rec(1), rc=0, timed_out=False, wall_s=30.0, driver=compile_err, log_tail="nvcc: error X\n")
    assert row["outcome"] == "compile_error" and row["compiled"] is False and row["speedup"] is None
    assert row["error"] == "RuntimeError: Error building extension 'k'" and "nvcc: error X" in row["log_tail"]

    runtime_err = {"ok": True, "result": {"compiled": True, "correctness": False, "ref_runtime": 2.0,
                                          "metadata": {"runtime_error": "CUDA error: illegal memory access"}}}
    assert vk.kb_row(_rec(2), rc=0, timed_out=False, wall_s=1.0, driver=runtime_err)["outcome"] == "runtime_error"
    wrong = {
        "ok": True,
        "result": {"compiled": True, "correctness": False, "metadata": {"correctness_issue": "Output mismatch"}},
    }
    row = vk.kb_row(_rec(3), rc=0, timed_out=False, wall_s=1.0, driver=wrong)
    assert row["outcome"] == "incorrect" and row["error"] == "Output mismatch"

    raised = {"ok": False, "error_name": "ModuleNotFoundError",
              "error": "Traceback (most recent call last):\n  File x\nModuleNotFoundError: No module named 'litellm'\n"}
    row = vk.kb_row(_rec(4), rc=0, timed_out=False, wall_s=1.0, driver=raised)
    assert row["outcome"] == "error" and row["error"] == "ModuleNotFoundError: No module named 'litellm'"
    assert (
        vk.kb_row(_rec(5), rc=0, timed_out=False, wall_s=1.0, driver={"ok": True, "result": None})["outcome"]
        == "no_result"
    )
    row = vk.kb_row(_rec(6), rc=-9, timed_out=True, wall_s=300.2, driver=None, log_tail="building\n", timeout_s=300.0)
    assert row["outcome"] == "timeout" and row["error"] == "killed after 300 s; building"
    row = vk.kb_row(_rec(7), rc=-11, timed_out=False, wall_s=4.0, driver=None, log_tail="")
    assert row["outcome"] == "crashed" and row["error"] == "exit -11 without a result"
    row = vk.kb_row(_rec(8, None), rc=None, timed_out=False, wall_s=None, driver=None)
    assert row["outcome"] == "missing_code"


def test_kb_totals(vk):
    rows = [vk.kb_row(_rec(0), rc=0, timed_out=False, wall_s=10.0,
                      driver={"ok": True, "import_s": 2.0, "eval_s": 6.0,
                              "result": {"compiled": True, "correctness": True, "runtime": 1.0, "ref_runtime": 1.0}}),
            vk.kb_row(_rec(1), rc=0, timed_out=False, wall_s=20.0,
                      driver={"ok": True, "import_s": 2.0, "eval_s": 16.0,
                              "result": {"compiled": True, "correctness": False, "metadata": {}}}),
            vk.kb_row(_rec(2), rc=-9, timed_out=True, wall_s=30.0, driver=None, timeout_s=30.0),
            vk.kb_row(_rec(3, None), rc=None, timed_out=False, wall_s=None, driver=None)]
    t = vk.kb_totals(rows, wall_s=61.0)
    assert (t["records"], t["run"], t["compiled"], t["correct"], t["timeouts"]) == (4, 3, 2, 1, 1)
    assert t["record_wall_sum_s"] == 60.0 and t["eval_sum_s"] == 22.0 and t["import_sum_s"] == 4.0
    assert t["per_record_s"] == pytest.approx(61.0 / 3)
    assert t["outcomes"] == {"correct": 1, "incorrect": 1, "timeout": 1, "missing_code": 1}


def test_kb_one_driver_writes_a_result(vk, tmp_path, monkeypatch):
    src = fake_kernelbench(tmp_path / "kb")
    monkeypatch.syspath_prepend(str(src))
    for name in ("kernelbench", "kernelbench.eval"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    rows = []
    for i, code in enumerate(["fine", "RAISE", "FAIL"]):
        job = tmp_path / f"job{i}.json"
        result = tmp_path / f"result{i}.json"
        job.write_text(
            json.dumps(
                {
                    "ref_code": "r", "custom_code": code, "seed": 42, "correct_trials": 5, "perf_trials": 100,
                    "build_dir": str(tmp_path / "build"), "result": str(result),
                }
            )
        )
        assert vk.kb_one(str(job)) == 0
        driver = json.loads(result.read_text())
        rows.append(vk.kb_row(_rec(i), rc=0, timed_out=False, wall_s=1.0, driver=driver))
    assert [r["outcome"] for r in rows] == ["correct", "error", "compile_error"]
    assert rows[0]["speedup"] == 2.0 and rows[0]["eval_s"] is not None
    assert rows[1]["error"] == "ValueError: boom"
    assert rows[2]["error"] == "RuntimeError: Error building extension 'x'"


@pytest.mark.cpu
def test_kernelbench_side_runs_records_serially_with_a_timeout(vk, tmp_path):
    """One fresh process per record; a hung record is killed at --kb-timeout, a dying one is 'crashed'."""
    records = write_records(tmp_path / "r.jsonl", ["fine", "HANG", "CRASH", None])
    src = fake_kernelbench(tmp_path / "kb")
    args = vk.parse_args(["--records", str(records), "--kernelbench-src", str(src), "--only", "kb", "--kb-timeout", "8",
                          "--out", str(tmp_path / "out.json")])
    recs, lines = vk.read_records(records)
    bench = vk.Bench(args, recs, lines, vk.check_kernelbench_src(str(src)))
    bench.root = tmp_path / "scratch"
    bench.run_kb()
    rows = bench.kb["rows"]
    assert [r["outcome"] for r in rows] == ["correct", "timeout", "crashed", "missing_code"], [r["error"] for r in rows]
    assert rows[1]["wall_s"] >= 8.0 and rows[2]["rc"] == 3
    assert (bench.root / "kb" / "0000" / "build").parent.is_dir()
    saved = json.loads((tmp_path / "out.json").read_text())
    assert saved["kernelbench"]["totals"]["correct"] == 1 and saved["kernelbench"]["settings"]["num_perf_trials"] == 100


def test_cudal1_rows_totals_and_the_last_table(vk):
    recs = [_rec(0), _rec(1), _rec(2, None)]
    report = {
        "summary": {"classes": {"verified": 1, "incorrect": 1, "missing_code": 1}},
        "records": [
            {"task": "level1/0", "class": "verified", "status": "ok", "measured": 1.9, "claimed": 2.0, "flags": []},
            {
                "task": "level1/1", "class": "incorrect", "status": "incorrect", "measured": None,
                "claimed": 1.1, "flags": [], "message": "max abs error 3.0",
            },
            {"task": "level1/2", "class": "missing_code", "status": None, "measured": None, "claimed": None},
        ],
    }
    walls = {"level1/0": [{"status": "ok", "wall_s": 4.0, "build_s": 1.5}]}
    crows = vk.cudal1_rows(recs, report, walls)
    assert [r["class"] for r in crows] == ["verified", "incorrect", "missing_code"]
    assert crows[0]["wall_s"] == 4.0 and crows[1]["wall_s"] is None
    ctot = vk.cudal1_totals(crows, wall_s=20.0, rc=0, summary={"batch": {"builds": 2}})
    assert (ctot["records"], ctot["judged"], ctot["per_record_s"], ctot["batch"]) == (3, 2, 10.0, {"builds": 2})
    assert ctot["statuses"] == {"ok": 1, "incorrect": 1}

    krows = [
        vk.kb_row(
            _rec(0), rc=0, timed_out=False, wall_s=25.0,
            driver={"ok": True, "result": {"compiled": True, "correctness": True, "runtime": 1.0, "ref_runtime": 2.0}},
        ),
        vk.kb_row(
            _rec(1), rc=0, timed_out=False, wall_s=25.0,
            driver={"ok": True, "result": {"compiled": False, "correctness": False}},
        ),
        vk.kb_row(_rec(2, None), rc=None, timed_out=False, wall_s=None, driver=None),
    ]
    cudal1 = {"totals": ctot, "rows": crows}
    kb = {"totals": vk.kb_totals(krows, 50.0), "rows": krows}
    assert vk.figures(cudal1, kb)["ratio_kb_over_cudal1"] == 2.5
    rows = {r[0]: r[1:] for r in vk.summary_rows(cudal1, kb)}
    assert rows["records run"] == ["2/3", "2/3"]
    assert rows["wall s"] == ["20.0", "50.0"] and rows["s / record"] == ["10.00", "25.00"]
    assert rows["KB / cudal1 wall"] == ["", "2.50x"]
    assert rows["compiled / correct"][1] == "1 / 1 of 2"
    assert rows["verdicts"] == ["incorrect=1 missing_code=1 verified=1", "compile_error=1 correct=1 missing_code=1"]
    per_record = vk.record_rows(recs, cudal1, kb)
    assert per_record[0][:8] == ["0", "level1/0", "verified", "ok", "1.90", "correct", "25.0", "2.00"]
    # one side only: the other column is '-'
    assert {r[0]: r[2] for r in vk.summary_rows(cudal1, None)}["wall s"] == "-"
    assert vk.summary_rows(cudal1 | {"totals": ctot | {"rc": 2}}, None)[1][1] == "20.0 (rc=2)"


def test_small_helpers(vk, tmp_path):
    assert vk.last_json_line('progress\n{"records": 3}\nnot json {\n') == {"records": 3}
    assert vk.last_json_line("nothing") is None
    assert vk.gpu_device(0, None) == "0" and vk.gpu_device(1, "4,6") == "6"
    with pytest.raises(vk.BenchError):
        vk.gpu_device(2, "4,6")
    assert vk.side_order("kb-first", None) == ["kb", "cudal1"] and vk.side_order("cudal1-first", "kb") == ["kb"]
    from datetime import datetime, timezone

    t = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    assert vk.out_path(str(tmp_path), t) == tmp_path / "vs_kernelbench_20260102T030405Z.json"
    assert vk.out_path(str(tmp_path / "x.json"), t) == tmp_path / "x.json"
    assert vk.out_path(None, t).parent.name == "vs_kernelbench"
    assert vk.error_tail("a\n\nb\nc", limit=5) == "b | c" and vk.error_tail("") == ""
    assert vk.store_walls(tmp_path / "absent.sqlite") == {}


@pytest.mark.cpu
def test_a_kernelbench_copy_inside_this_repository_reports_no_commit(vk, tmp_path):
    """Only a checkout of its own has a KernelBench commit: a copy under this repository (or no
    git at all) must not report this repository's commit as KernelBench's."""
    assert vk.kb_commit(vk.REPO / "benchmarks") is None
    assert vk.kb_commit(tmp_path) is None
    own = tmp_path / "kb"
    (own / "src").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(own)], check=True)
    subprocess.run(["git", "-C", str(own), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty",
                    "-m", "x"], check=True)
    assert vk.kb_commit(own / "src")
