"""CPU tier: ``cudal1 collect`` against a scripted teacher that also answers with broken and
cheating code (real judge subprocesses), ``--from`` re-judging, and the one-line errors of the
training commands."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from cudal1.cli.main import main as cli_main
from cudal1.train import smoke

pytest.importorskip("openai")


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.cpu
def test_collect_keeps_only_verified_programs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUDAL1_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "data.jsonl"
    assert cli_main(["collect", "--smoke", "--per-task", "0", "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # the script: 3 correct programs, 1 wrong, 1 crashing, 2 cheats, 1 answer without code
    assert summary["judged"] == {"ok": 3, "incorrect": 1, "rejected": 2, "format": 1, "runtime_error": 1}
    records = _lines(out)
    codes = {r["messages"][-1]["content"] for r in records}
    assert len(records) == 3 == summary["kept"]
    assert codes == {smoke.answer(smoke.VARIANTS[k]) for k in ("broadcast", "einsum", "matmul")}
    for r in records:
        assert [m["role"] for m in r["messages"]] == ["system", "user", "assistant"]
        assert r["status"] == "ok" and "degenerate_task" not in r["flags"] and r["speedup"] > 0
        assert r["source"].startswith("teacher:http://127.0.0.1:") and r["task"] == smoke.TASK_NAME
        assert r["config_hash"] and r["environment"]["device"] == "cpu" and r["candidate_hash"]
    speedups = [r["speedup"] for r in records]
    assert speedups == sorted(speedups, reverse=True)  # fastest first
    from datasets import load_dataset  # the test extra installs it: what train sft reads the file with

    ds = load_dataset("json", data_files=str(out), split="train")
    assert len(ds) == 3 and ds[0]["messages"][2]["role"] == "assistant"

    # --per-task 1 from the same store: no new teacher requests are needed to re-select (resume)
    out1 = tmp_path / "data.jsonl"
    from cudal1.recorded import RecordedJudge
    from cudal1.train.stages.collect import select_records, store_path

    judge = RecordedJudge(smoke.smoke_judge_config("cpu"))
    assert judge.config_hash == records[0]["config_hash"]
    with judge.store_at(store_path(out1)):
        sources = sorted({row["policy"] for row in judge.responses()})
        one = select_records(judge, [smoke.smoke_task()], sources, 1)
    assert len(one) == 1 and one[0]["candidate_hash"] == records[0]["candidate_hash"]


@pytest.mark.cpu
def test_collect_from_file_rejudges_and_drops_what_does_not_verify(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUDAL1_CACHE_DIR", str(tmp_path / "cache"))
    task_file = tmp_path / "diag_scale.py"
    task_file.write_text(smoke.TASK_SOURCE)
    published = tmp_path / "published.jsonl"
    published.write_text("".join(json.dumps({"task": "diag_scale", "code": c, "speedup": 9.9}) + "\n" for c in
                                 (smoke.VARIANTS["broadcast"], smoke.CHEATS["mutates_input"], smoke.FAILURES["wrong"])))
    out = tmp_path / "verified.jsonl"
    args = ["collect", "--from", str(published), "--suite", str(task_file), "--out", str(out), "--json",
            "--device", "cpu", "--trials", "2", "--timing-trials", "10", "--per-task", "0"]
    assert cli_main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["judged"] == {"ok": 1, "rejected": 1, "incorrect": 1}
    records = _lines(out)
    assert len(records) == 1 and smoke.VARIANTS["broadcast"].strip() in records[0]["messages"][-1]["content"]
    assert records[0]["source"] == f"file:{published}"
    # resumable: a second run re-uses the store (nothing judged again) and writes the same file
    assert cli_main(args) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["judged"] == {} and _lines(out) == records


def test_unreachable_teacher_is_one_line_naming_the_url(tmp_path, capsys):
    task_file = tmp_path / "diag_scale.py"
    task_file.write_text(smoke.TASK_SOURCE)
    url = "http://127.0.0.1:9/v1"
    code = cli_main(["collect", "--suite", str(task_file), "--teacher", f"{url}=some-model", "--out",
                     str(tmp_path / "d.jsonl")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and url in err[0] and err[0].startswith("cudal1: error:")
    assert (
        cli_main(["collect", "--suite", str(task_file), "--teacher", "not-a-url", "--out", str(tmp_path / "d.jsonl")])
        == 2
    )
    assert "URL=MODEL" in capsys.readouterr().err


def test_missing_train_extra_names_the_extra(monkeypatch, capsys, tmp_path, request):
    from cudal1 import extras

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in ("trl", "peft") else real(name, *a)
    )
    extras.is_available.cache_clear()  # probes are cached per process: ask again, and forget the answers after
    request.addfinalizer(extras.is_available.cache_clear)
    for stage in ("sft", "ssl", "grpo"):
        assert cli_main(["train", stage, "--smoke", "--out", str(tmp_path / stage)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and 'pip install "cudal1[train]"' in err[0] and "trl" in err[0] and "peft" in err[0]


def test_train_usage_errors_are_one_line(capsys, tmp_path):
    pytest.importorskip("trl")
    assert cli_main(["train", "sft", "--out", str(tmp_path / "o")]) == 2
    assert "--data" in capsys.readouterr().err
    assert cli_main(["train", "grpo", "--smoke", "--report-to", "carrier-pigeon", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "carrier-pigeon" in err[0]
    bad = tmp_path / "bad.yaml"
    bad.write_text("group_size: 4\nbogus: 1\n")
    assert cli_main(["train", "grpo", "--smoke", "--config", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "bogus" in capsys.readouterr().err


def test_grpo_eval_needs_eval_tasks(capsys, tmp_path, monkeypatch, hf_hub_imported_online):
    pytest.importorskip("trl")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a machine without the hub
    task_file = tmp_path / "diag_scale.py"
    task_file.write_text(smoke.TASK_SOURCE)
    base = ["train", "grpo", "--suite", str(task_file), "--model", str(tmp_path / "m"), "--device", "cpu",
            "--out", str(tmp_path / "o")]
    assert cli_main(base + ["--eval-every", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--eval-split" in err[0]
    assert cli_main(base + ["--eval-every", "2", "--eval-split", "held-out"]) == 2  # a file has no split
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cudal1: error:")


@pytest.mark.cpu
def test_core_imports_without_the_train_extra():
    import subprocess
    import sys

    code = ("import sys, importlib.abc\n"
            "class Block(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('trl', 'peft', 'datasets', 'accelerate'):\n"
            "            raise ImportError('blocked ' + name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "import cudal1, cudal1.train, cudal1.train.reward, cudal1.train.config, cudal1.cli.main, cudal1.cli.train\n"
            "import cudal1.cli.collect\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
