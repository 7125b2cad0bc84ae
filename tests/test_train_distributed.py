"""CPU tier: ``cudal1 train`` under ``torchrun --nproc_per_node 2`` (gloo, loopback master).

* SFT smoke: both ranks train in one data-parallel group (the trainer's world size is 2), rank 0
  alone prints the summary, writes ``config.yaml``, ``data.jsonl`` and ``metrics.jsonl`` (one line
  per logged step, no duplicates) and the final model, which loads and runs.
* GRPO smoke (one step): every rank judges its own rollouts and writes them to the
  one SQLite store (WAL) — all ``group_size x prompts_per_step`` rollouts of the step are recorded,
  and counted in the step's ``metrics.jsonl`` line (gathered from both ranks), one run is
  recorded, one summary printed; the evaluation after the step (``--eval-every 1``) gathers both
  ranks' samples into one ``metrics.jsonl`` line.
* SSL smoke: each round's samples are sharded, each rank generates and judges its half into the
  one store, rank 0 writes the round's data; every sample is generated and judged once.
* The GRPO and SSL smokes start from the session's primed model (conftest ``seed_primed``), which
  they find and reuse; priming under two processes is the SFT smoke's path.
* A rank ends in ``dist.leave``: exit handlers run, output flushed, no interpreter teardown.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.cpu  # starts processes: the CPU tier (tests/tiers.py)

pytest.importorskip("trl")
pytest.importorskip("accelerate")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE")}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), "-m", "cudal1.cli.main", "train", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def _summaries(stdout: str) -> list[dict]:
    """The JSON objects printed on stdout (the trainers' own log lines are Python reprs, not JSON)."""
    found = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except ValueError:
                pass
    return [s for s in found if isinstance(s, dict) and "out" in s]


def _metrics(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]


_LEAVE = """
import atexit, pathlib, sys
from cudal1.train import dist

class Teardown:  # a module global: finalised only by the interpreter's own teardown
    def __del__(self):
        print("teardown ran", file=sys.stderr, flush=True)

keep = Teardown()
atexit.register(lambda: pathlib.Path(sys.argv[1]).write_text("exit handlers ran"))
sys.stdout.write("last output, unflushed")
dist.leave(3)
print(" / still here")
"""


@pytest.mark.parametrize("world", ["2", None])
def test_leave_ends_a_rank_after_its_exit_handlers_without_the_teardown(tmp_path, world):
    marker = tmp_path / "atexit.txt"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    if world:
        env["WORLD_SIZE"] = world
    proc = subprocess.run(
        [sys.executable, "-c", _LEAVE, str(marker)], capture_output=True, text=True, timeout=60, env=env
    )
    assert marker.read_text() == "exit handlers ran"  # both ways
    if world:  # several processes: ends in leave, output flushed, no interpreter teardown
        assert (proc.returncode, proc.stdout) == (3, "last output, unflushed"), proc.stderr
        assert "teardown ran" not in proc.stderr
    else:  # alone: a no-op, the process goes on and exits as usual
        assert (proc.returncode, proc.stdout) == (0, "last output, unflushed / still here\n"), proc.stderr
        assert "teardown ran" in proc.stderr


def test_sft_smoke_under_two_processes(tmp_path):
    out = tmp_path / "sft"
    proc = _torchrun(["sft", "--smoke", "--out", str(out), "--json"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summaries = _summaries(proc.stdout)
    assert len(summaries) == 1, proc.stdout[-4000:]  # rank 0 alone prints
    summary = summaries[0]
    assert summary["processes"] == 2  # the trainer's own world size: one group of two ranks trained
    assert summary["steps"] == 12 and summary["examples"] == 6
    # what ran where, gathered from both ranks (gpu_checks.sh's train stage prints it)
    assert summary["distributed"]["world_size"] == 2 and "gloo" in summary["distributed"]["backend"]
    assert [r["rank"] for r in summary["distributed"]["ranks"]] == [0, 1]

    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["run"]["stage"] == "sft" and config["run"]["processes"] == 2

    data = [json.loads(x) for x in (out / "data.jsonl").read_text().splitlines()]
    assert len(data) == 6 and all(r["messages"][-1]["role"] == "assistant" for r in data)

    lines = _metrics(out)
    steps = [m["step"] for m in lines]
    assert steps == [2, 4, 6, 8, 10, 12], steps  # written once: no rank-1 duplicates
    assert all(m["stage"] == "sft" and m["loss"] is not None for m in lines)
    assert lines[-1]["loss"] < lines[0]["loss"]

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    ids = tok("import torch\n", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape[:2] == ids.shape and torch.isfinite(logits).all()


def test_grpo_smoke_under_two_processes(tmp_path, seed_primed):
    import sqlite3

    out = tmp_path / "grpo"
    seed_primed(out)
    proc = _torchrun(
        [
            "grpo", "--smoke", "--max-steps", "1", "--eval-every", "1", "--eval-samples", "4", "--out",
            str(out), "--json",
        ],
        timeout=480,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summaries = _summaries(proc.stdout)
    assert len(summaries) == 1, proc.stdout[-4000:]
    assert summaries[0]["steps"] == 1 and len(summaries[0]["reward_mean"]) == 1
    assert summaries[0]["distributed"]["world_size"] == 2 and summaries[0]["judge_device"] == "cpu"

    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["run"]["processes"] == 2
    per_step = config["grpo"]["group_size"] * config["grpo"]["prompts_per_step"]
    assert [(m["step"], m["stage"]) for m in _metrics(out)] == [(1, "grpo"), (1, "eval")]
    step = _metrics(out)[0]  # its counts are gathered from both ranks, not rank 0's half
    assert sum(step["judged"].values()) == per_step and 0 <= step["success_rate"] <= 1
    ev = _metrics(out)[1]  # the evaluation after step 1: both ranks' samples gathered into one line
    assert (
        ev["samples"] == 4 and ev["complete"] and ev["tasks"] == 1 and set(ev["fast_p"]) == {"1.0", "1.2", "1.5", "2.0"}
    )
    assert summaries[0]["eval"][0]["step"] == 1 and "pass@4" in ev

    con = sqlite3.connect(out / "cudal1.sqlite")
    try:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        rows = dict(con.execute("SELECT round, COUNT(*) FROM responses WHERE policy = 'grpo' GROUP BY round"))
        evals = con.execute("SELECT COUNT(*) FROM responses WHERE policy = 'grpo-eval'").fetchone()[0]
        runs = con.execute("SELECT kind, status FROM runs").fetchall()
    finally:
        con.close()
    # each rank judged and recorded its half of every step's rollouts in the one store
    assert rows == {1: per_step}, rows
    assert evals == 4  # eval samples are recorded apart from the training rollouts
    assert runs == [("train-grpo", "done")]  # recorded once, by rank 0
    assert (out / "config.json").is_file() and (out / "prime" / "primed" / "config.json").is_file()


def test_ssl_smoke_under_two_processes(tmp_path, seed_primed):
    import sqlite3

    out = tmp_path / "ssl"
    seed_primed(out)
    proc = _torchrun(["ssl", "--smoke", "--out", str(out), "--json"], timeout=420)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summaries = _summaries(proc.stdout)
    assert len(summaries) == 1, proc.stdout[-4000:]
    summary = summaries[0]
    config = yaml.safe_load((out / "config.yaml").read_text())
    rounds, samples = config["ssl"]["rounds"], config["ssl"]["samples"]
    assert config["run"]["processes"] == 2 and [r["round"] for r in summary["rounds"]] == list(range(1, rounds + 1))
    assert [m["step"] for m in _metrics(out)] == list(range(1, rounds + 1))  # one line per round, rank 0 only
    for r in summary["rounds"]:
        assert r["generated"] == samples and r["success_rate"] is not None
        assert r["judged_per_rank"] == [samples // 2, samples // 2]  # each rank generated and judged its half
        kept = (out / f"round{r['round']}" / "data.jsonl").read_text().splitlines()
        assert len(kept) == r["kept"]
        assert (out / f"round{r['round']}" / "summary.json").is_file()
    con = sqlite3.connect(out / "cudal1.sqlite")
    try:
        rows = dict(con.execute("SELECT round, COUNT(*) FROM responses WHERE policy = 'ssl' GROUP BY round"))
    finally:
        con.close()
    # the ranks shared each round's samples: every sample generated and judged once, not once per rank
    assert rows == {r: samples for r in range(1, rounds + 1)}, rows
    assert (out / "model").resolve() == Path(summary["model"]).resolve()
    assert (out / "model" / "config.json").is_file()
