"""CPU tier: measured profiles end to end through the real two-process judge and the CLI
(``judge --profile``, ``profile``, the run store), with operator-level profiles on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli_support import SMALL_DIAG, cli_env, last_json, run_cli, small_config
from cudal1.store import RunStore

pytestmark = pytest.mark.cpu

REPO = Path(__file__).resolve().parent.parent
BROADCAST = REPO / "examples" / "candidates" / "diag_matmul_broadcast.py"
WRONG = REPO / "tests" / "fixtures" / "cpu" / "wrong.py"
CLASSES = {"launch-bound", "memory-bound", "compute-bound", "mixed"}
N = 512  # the small task's size: A (N,), B (N, N) float32; out = diag(A) @ B
TASK_BYTES = 4 * (N + 2 * N * N)  # inputs and output once; the reference has no weights
TASK_FLOPS = 2 * N**3  # the reference's matmul, as torch.utils.flop_counter counts it


@pytest.fixture(name="env")
def _env(tmp_path: Path) -> dict[str, str]:
    return cli_env(tmp_path / "cache")


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(small_config(timeout_s=60.0))
    return path


def _explain(proc: subprocess.CompletedProcess) -> str:
    return f"rc={proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


def _names(program: dict) -> list[str]:
    return [k["name"] for k in program["kernels"]]


def test_judge_profile_json_carries_both_programs_and_the_task_figures(tmp_path, env, config):
    proc = run_cli(["judge", "--reference", SMALL_DIAG, "--candidate", BROADCAST, "--config", config, "--json",
                    "--profile"], env, tmp_path)
    assert proc.returncode == 0, _explain(proc)
    out = last_json(proc.stdout)
    assert out["status"] == "ok" and out["speedup"] > 0, _explain(proc)  # the verdict is as without --profile
    prof = out["profile"]
    assert prof["tool"] == "cupti" and prof["candidate_trusted"] is False
    ref, cand = prof["reference"], prof["candidate"]
    assert ref["status"] == "ok" and cand["status"] == "ok", prof
    assert "aten::mm" in _names(ref) and "aten::mul" in _names(cand) and "aten::mm" not in _names(cand)
    for p in (ref, cand):
        assert p["device"] == "cpu" and p["class"] in CLASSES
        assert p["bytes_moved"] == TASK_BYTES and p["flops"] == TASK_FLOPS  # the task's, measured on the reference
        assert 0 < p["busy_us"] <= p["call_us"] and abs(sum(k["share"] for k in p["kernels"]) - 1) < 1e-6
        assert p["bandwidth_share"] is None  # no peak bandwidth on the CPU


def test_without_profile_nothing_is_profiled(judged_broadcast):
    proc = judged_broadcast  # judge --reference SMALL_DIAG --candidate BROADCAST --config (small) --json
    assert proc.returncode == 0, _explain(proc)
    out = last_json(proc.stdout)
    assert out["status"] == "ok" and out["profile"] is None


def test_a_failed_verdict_has_no_profile_and_keeps_its_status(tmp_path, env, config):
    proc = run_cli(["judge", "--reference", SMALL_DIAG, "--candidate", WRONG, "--config", config, "--json",
                    "--profile"], env, tmp_path)
    out = last_json(proc.stdout)
    assert out["status"] == "incorrect" and out["profile"] is None, _explain(proc)


def test_the_store_keeps_profiles_and_a_rerun_reuses_them(tmp_path, env, config):
    run = tmp_path / "run"
    args = ["judge", "--reference", SMALL_DIAG, "--candidate", BROADCAST, "--config", config, "--out", run]
    first = run_cli([*args, "--profile", "--json"], env, tmp_path)
    assert first.returncode == 0, _explain(first)
    with RunStore(run / "cudal1.sqlite") as store:
        (stored,) = store.evaluations()
    assert stored.profile is not None and stored.profile.reference.ok
    again = run_cli([*args, "--json"], env, tmp_path)  # recorded: not judged again, its profile comes back
    assert again.returncode == 0, _explain(again)
    assert last_json(again.stdout)["profile"] == last_json(first.stdout)["profile"]


def test_profile_command_text_and_ncu_reason_on_the_cpu(tmp_path, env, config):
    proc = run_cli(["profile", SMALL_DIAG, "--candidate", BROADCAST, "--config", config, "--tool", "ncu", "--top",
                    "2"], env, tmp_path)
    assert proc.returncode == 0, _explain(proc)
    ncu_lines = [line for line in proc.stderr.splitlines() if "ncu" in line]
    assert ncu_lines == ["cudal1: ncu: no CUDA device here (Nsight Compute profiles GPU kernels only)"], _explain(proc)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("profile (cupti;")
    assert lines[1].split() == ["reference", "candidate"] and lines[2].split()[0] == "call"  # side by side
    ref = next(i for i, line in enumerate(lines) if line.startswith("reference top kernels"))
    assert "aten::mm" in lines[ref + 1] and "more" in lines[ref + 3]  # top 2, then the rest in one line
    assert any(line.startswith("candidate top kernels") for line in lines) and "where time moved" in proc.stdout


def test_profile_command_json_of_the_reference_alone(tmp_path, env, config):
    proc = run_cli(["profile", SMALL_DIAG, "--config", config, "--json"], env, tmp_path)
    assert proc.returncode == 0, _explain(proc)
    out = last_json(proc.stdout)
    assert out["status"] == "ok" and out["task"] == "diag_matmul"
    assert out["profile"]["reference"]["status"] == "ok" and "aten::mm" in _names(out["profile"]["reference"])


REFUSE = """import json, sys
from cudal1.cli.main import main
seen = []
for args in json.loads(sys.argv[1]):
    try:
        rc = main(args)
    except SystemExit as exc:  # argparse's own refusals
        rc = exc.code
    seen.append([rc, "torch" in sys.modules])
print(json.dumps(seen))
"""


def test_bad_input_is_one_line_before_the_judge_is_imported(tmp_path, env):
    nope = str(tmp_path / "nope.py")
    cases = [["profile", nope], ["profile", str(SMALL_DIAG), "--top", "0"], ["profile", str(SMALL_DIAG), "--tool",
             "perf"], ["judge", "--reference", str(SMALL_DIAG), "--candidate", str(BROADCAST), "--profile", "vtune"],
             ["profile", str(SMALL_DIAG), "--candidate", nope]]
    done = subprocess.run([sys.executable, "-c", REFUSE, json.dumps(cases)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 0, _explain(done)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == [[2, False]] * len(cases), seen
    errors = done.stderr.strip().splitlines()
    assert len(errors) == len(cases) and all(e.startswith("cudal1: error: ") for e in errors), errors


def test_optimize_profiles_the_reference_and_the_best_and_shows_them_in_prompts(tmp_path, env, config):
    out = tmp_path / "opt"
    proc = run_cli(["optimize", SMALL_DIAG, "--policy", "builtin", "--rounds", "2", "--samples", "1", "--config",
                    config, "--out", out, "--profile", "-q", "--json"], env, tmp_path, timeout=400)
    assert proc.returncode == 0, _explain(proc)
    from cudal1.tasks import load_task_file
    from cudal1.types import reference_candidate

    anchor = reference_candidate(load_task_file(SMALL_DIAG)).hash
    with RunStore(out / "cudal1.sqlite") as store:
        results = {r.candidate_hash: r for r in store.evaluations()}
        best = store.best(next(iter(results.values())).task_hash)
        prompts = [r["prompt"]["user"] for r in store.responses()]
    assert results[anchor].profile is not None and results[anchor].profile.reference.ok
    assert best is not None and best.candidate_hash != anchor and best.profile is not None
    profiled = {h for h, r in results.items() if r.profile is not None}
    assert profiled <= {anchor} | {r.candidate_hash for r in results.values() if r.status.value == "ok"}
    assert len(prompts) == 2 and all("## Measured profiles" in p and "### Reference:" in p for p in prompts)
    assert "aten::mm" in prompts[0].split("## Measured profiles")[1]


PROFILE_SHY = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Honest under timing; raises only while a profiler records it."""

    def forward(self, A, B):
        if torch._C._autograd._profiler_enabled():
            raise RuntimeError("no profiling, please")
        return A.unsqueeze(1) * B
'''


def test_a_candidate_failing_its_profiled_call_keeps_its_verdict(tmp_path, env, config):
    shy = tmp_path / "shy.py"
    shy.write_text(PROFILE_SHY)
    proc = run_cli(["judge", "--reference", SMALL_DIAG, "--candidate", shy, "--config", config, "--json",
                    "--profile"], env, tmp_path)
    out = last_json(proc.stdout)
    assert out["status"] == "ok" and out["speedup"] > 0, _explain(proc)
    ref, cand = out["profile"]["reference"], out["profile"]["candidate"]
    assert ref["status"] == "ok" and cand["status"] == "failed", out["profile"]
    assert "no profiling, please" in cand["note"] and cand["kernels"] == []


FAKE_NCU = """#!/bin/sh
# stands in for Nsight Compute: checks the command line it is given, prints a raw-page CSV
case "$*" in *"--profile-from-start off"*"cudal1.profile.ncu_target"*) ;; *) echo "bad args: $*" >&2; exit 3;; esac
echo '==PROF== Connected to process 1'
echo '"ID","Kernel Name","gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed"'
echo '"","","nsecond","%"'
echo '"0","k","100","40"'
"""


def test_run_ncu_builds_its_command_and_reads_the_csv(tmp_path, monkeypatch):
    from cudal1.profile import ncu

    fake = tmp_path / "ncu"
    fake.write_text(FAKE_NCU)
    fake.chmod(0o755)
    monkeypatch.setenv("CUDAL1_NCU", str(fake))
    monkeypatch.setattr(ncu, "ncu_problem", lambda: "")
    got = ncu.run_ncu(str(SMALL_DIAG))
    assert not isinstance(got, str), got
    assert got.kernels == 1 and got.sm_throughput == 40.0
    fake.write_text("#!/bin/sh\necho '==ERROR== ERR_NVGPUCTRPERM - no permission' >&2\nexit 1\n")
    assert "ERR_NVGPUCTRPERM" in ncu.run_ncu(str(SMALL_DIAG))
