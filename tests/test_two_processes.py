"""The judge's trust boundary on the CPU, through the real subprocess judge: the reference runs in a
process that never imports candidate code, the candidate in another one that never sees the
reference module; the candidate's confinement is reported in the verdict."""

from __future__ import annotations

import json
import os
import time

import pytest

from cudal1.harness import evaluate
from cudal1.types import Candidate, Status, Task

TASK = """
import json, os, sys
import torch
import torch.nn as nn

RECORD = %(record)r


class Model(nn.Module):
    def forward(self, x):
        with open(RECORD, "a") as f:
            loaded = any(m.startswith("cudal1_candidate") for m in sys.modules)
            f.write(json.dumps({"pid": os.getpid(), "candidate_loaded": loaded}) + "\\n")
        return x * 2


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return []
"""

CANDIDATE = '''
import json, os, sys
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        prefix = "cudal1_" + "reference"  # computed: the static guard refuses the literal name
        seen = {"pid": os.getpid(), "reference_loaded": any(m.startswith(prefix) for m in sys.modules)}
        with open("candidate_record.jsonl", "a") as f:  # its own directory: the only place it may write
            f.write(json.dumps(seen) + "\\n")
        return x * 2
'''


@pytest.mark.cpu
def test_reference_and_candidate_run_in_separate_processes(tmp_path, cpu_judge_config):
    record = tmp_path / "reference_record.jsonl"
    task = Task("two_processes", TASK % {"record": str(record)})
    cand = Candidate(CANDIDATE, task_hash=task.hash, label="two_processes")
    config = cpu_judge_config(tmp_path / "cache")
    (result,) = evaluate(task, [cand], config)
    assert result.status is Status.OK, result.message
    ref_seen = [json.loads(line) for line in record.read_text().splitlines()]
    build_dirs = list((tmp_path / "cache" / "builds").glob("*/cwd/candidate_record.jsonl"))
    assert len(build_dirs) == 1
    cand_seen = [json.loads(line) for line in build_dirs[0].read_text().splitlines()]
    assert ref_seen and cand_seen
    assert {r["pid"] for r in ref_seen}.isdisjoint({c["pid"] for c in cand_seen})
    assert len({r["pid"] for r in ref_seen}) == 1 and len({c["pid"] for c in cand_seen}) == 1
    assert not any(r["candidate_loaded"] for r in ref_seen)  # never imported beside the reference
    assert not any(c["reference_loaded"] for c in cand_seen)  # the task module stays on the clean side
    assert result.environment.isolation  # the confinement report reached the verdict
    # The parent returned at the reference worker's verdict; both processes are killed and reaped
    # behind it, none left running or unreaped.
    from cudal1.harness.parent import sandbox

    pids = {r["pid"] for r in ref_seen} | {c["pid"] for c in cand_seen}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (sandbox._live or any(_exists(pid) for pid in pids)):
        time.sleep(0.05)
    assert not sandbox._live and not any(_exists(pid) for pid in pids)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another uid's process (the candidate's, when confined as root)
        return True
    return True


@pytest.mark.cpu
def test_isolation_report_names_every_measure(tmp_path, cpu_judge_config):
    task = Task("two_processes_plain", (TASK % {"record": str(tmp_path / "r.jsonl")}))
    cand = Candidate(CANDIDATE, task_hash=task.hash, label="plain")
    (confined,) = evaluate(task, [cand], cpu_judge_config(tmp_path / "cache"))
    (unconfined,) = evaluate(task, [cand], cpu_judge_config(tmp_path / "cache2", confine_candidates=False))
    assert confined.status is Status.OK and unconfined.status is Status.OK
    measures = confined.environment.isolation
    for name in ("ids", "no_new_privs", "not_dumpable", "seccomp", "landlock_fs", "netns", "home_tmp"):
        assert name in measures, sorted(measures)
        assert measures[name].split(":")[0] in ("applied", "refused", "not applicable"), measures[name]
    for name in ("subreaper", "new_processes"):  # what contains the candidate's processes: applies either way
        assert measures[name].startswith("applied"), measures[name]
    # what contains the candidate's processes, and (CPU clock) how its threads were bound: either way
    assert sorted(unconfined.environment.isolation) == ["cpu_binding", "new_processes", "subreaper"]
    assert confined.environment.slots == unconfined.environment.slots == "host_files"  # CPU: shared host files
