"""Held-out tasks stay out of training (cudal1.train.heldout): ``collect``, ``train sft|ssl|grpo``
refuse them unless ``--allow-held-out``, matched by level and problem id and by the reference
source's fingerprint (a renamed or reformatted copy is caught too); ``collect --from`` leaves their
records out; GRPO's eval split must be disjoint from its training tasks.

Unit tier, except the ``collect --from`` run (it judges: CPU tier)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cudal1.cli.main import main as cli_main
from cudal1.train import smoke
from cudal1.train.heldout import HeldOut, HeldOutError, fingerprint, overlap, refuse, refuse_records
from cudal1.types import Task


def _kernelbench(tmp_path: Path) -> Path:
    """A local KernelBench copy: the smoke task's source as level1/4 (train) and, with N = 384, level1/5 (held out)."""
    held = smoke.TASK_SOURCE.replace("N = 512\n", "N = 384\n")
    path = tmp_path / "kb.jsonl"
    path.write_text(json.dumps({"level": 1, "problem_id": 4, "name": "4_diag", "code": smoke.TASK_SOURCE}) + "\n"
                    + json.dumps({"level": 1, "problem_id": 5, "name": "5_diag", "code": held}) + "\n")
    return path


def _one_line(capsys, *words: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cudal1: error:"), err
    assert all(w in err[0] for w in words), err[0]
    return err[0]


def test_fingerprint_ignores_comments_spacing_and_blank_lines_only():
    src = smoke.TASK_SOURCE
    reformatted = "# copied from somewhere\n" + src.replace(
        "    def forward(self, A, B):", "    def forward( self,A,B ):  # hot"
    ).replace("\n\n\n", "\n\n\n\n")
    assert fingerprint(reformatted) == fingerprint(src) is not None
    assert fingerprint(src.replace("N = 512", "N = 513")) != fingerprint(src)  # another size is another task
    assert fingerprint(src.replace("return torch.diag(A) @ B", "return torch.diag(B) @ A")) != fingerprint(src)
    assert fingerprint("x = f'{a + b} {c!r:>{w}}'\n") == fingerprint(
        "x  =  f'{a + b} {c!r:>{w}}'  # f-string kept whole\n"
    )
    assert fingerprint("def f(:\n  'unterminated") is None


def test_held_out_by_identity_and_by_source_under_another_name(tmp_path):
    held = HeldOut.load(_kernelbench(tmp_path))
    by_id = Task(name="anything", source=smoke.TASK_SOURCE, level=2, problem_id=40)
    assert "level2/40 (held-out id)" == held.reason(by_id)
    copy = smoke.TASK_SOURCE.replace("N = 512\n", "N = 384  # mine now\n")
    renamed = Task(name="my_diag", source=copy)  # no level, no id: only its source gives it away
    assert held.reason(renamed) == "my_diag (the source of level1/5)"
    assert held.reason(Task(name="x", source=smoke.TASK_SOURCE, level=1, problem_id=4)) is None  # a train task
    assert HeldOut.load().reason(renamed) is None  # without the local copy, only the shipped KernelBench texts
    with pytest.raises(HeldOutError, match=r"train ssl: 2 of 3 would train on held-out tasks: .*--allow-held-out"):
        refuse([by_id, renamed, Task(name="x", source=smoke.TASK_SOURCE)], "train ssl", held)


def test_shipped_fingerprints_know_every_held_out_kernelbench_and_release_text(shared_dir):
    from cudal1.jsonl import iter_jsonl
    from cudal1.tasks import load_tasks, split_of

    shipped = HeldOut.load()  # no local copy: the shipped fingerprints alone
    tasks = load_tasks(shared_dir / "kernelbench" / "kernelbench.jsonl")
    held = [t for t in tasks if split_of(t) == "held-out"]
    assert len(held) == 54
    for t in tasks:  # renamed (no level or id), every held-out text is still recognised; no train text is
        found = shipped.reason(Task(name="copy", source=t.source))
        assert (found == f"copy (the source of {t.task_id})") == (t in held), t.task_id
    release = [r for _, r in iter_jsonl(shared_dir / "cuda-l1" / "h100.jsonl") if r["task_id"] % 5 == 0]
    assert len(release) == 50
    assert all(shipped.reason(Task(name="copy", source=r["ref_code"])) for r in release)


def test_sft_refuses_records_of_held_out_tasks(tmp_path, capsys, monkeypatch):
    pytest.importorskip("trl")
    kb = _kernelbench(tmp_path)
    prompt_task = Task(name="renamed", source=smoke.TASK_SOURCE.replace("N = 512\n", "N = 384\n"))
    from cudal1.prompts import build_prompt

    record = {"messages": build_prompt(prompt_task, [], "CPU").messages()
              + [{"role": "assistant", "content": smoke.answer(smoke.VARIANTS["broadcast"])}], "task": "renamed"}
    with pytest.raises(HeldOutError, match=r"renamed \(its prompt holds the source of level1/5\)"):
        refuse_records([record], "train sft", HeldOut.load(kb))
    with pytest.raises(HeldOutError, match=r"level3/10 \(held-out id\)"):
        refuse_records([{"messages": [], "task": "level3/10"}], "train sft", HeldOut.load())
    refuse_records([record | {"task": "level1/4"}], "train sft", HeldOut.load())  # unknown source, train id: fine

    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps(record) + "\n")
    base = ["train", "sft", "--data", str(data), "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / "o")]
    monkeypatch.setenv("CUDAL1_KERNELBENCH", str(kb))  # sft has no --source: a local copy comes from the environment
    assert cli_main(base) == 2
    _one_line(capsys, "held-out", "--allow-held-out", "level1/5")
    assert cli_main(base + ["--allow-held-out"]) == 2  # admitted; then the missing model is what stops it
    _one_line(capsys, "no such model directory")


def test_ssl_and_grpo_refuse_held_out_suites_and_grpo_an_eval_split_it_trains_on(tmp_path, capsys):
    pytest.importorskip("trl")
    kb = _kernelbench(tmp_path)
    model = str(tmp_path / "m")
    for stage in ("ssl", "grpo"):
        assert cli_main(["train", stage, "--suite", "kernelbench:level1", "--source", str(kb), "--model", model,
                         "--device", "cpu", "--out", str(tmp_path / stage)]) == 2
        _one_line(capsys, f"train {stage}: 1 of 2", "level1/5 (held-out id)")
    task_file = tmp_path / "t.py"
    task_file.write_text(smoke.TASK_SOURCE)
    assert (
        cli_main(
            [
                "train", "grpo", "--suite", "kernelbench:level1:train", "--source", str(kb), "--model", model,
                "--eval-every", "2", "--eval-split", str(task_file), "--device", "cpu", "--out",
                str(tmp_path / "g"),
            ]
        )
        == 2
    )
    _one_line(capsys, "1 eval task(s) are also trained on (t = level1/4)", "disjoint")
    assert overlap([smoke.smoke_task()], [smoke.smoke_eval_task()]) == []  # the smoke evaluates on another size


@pytest.mark.cpu
def test_collect_from_a_release_leaves_held_out_records_out(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUDAL1_CACHE_DIR", str(tmp_path / "cache"))
    release = tmp_path / "release.jsonl"
    sources = {4: smoke.TASK_SOURCE, 5: smoke.TASK_SOURCE.replace("N = 512\n", "N = 384\n")}
    rows = [{"level_id": 1, "task_id": tid, "ref_code": src, "custom_code": smoke.VARIANTS["broadcast"],
             "score_default": 3.0} for tid, src in sources.items()]
    release.write_text("".join(json.dumps(r) + "\n" for r in rows))
    judge = ["--device", "cpu", "--trials", "2", "--timing-trials", "10", "--json"]
    out = tmp_path / "data.jsonl"
    # the docs' example, as written: the held-out record is left out and counted
    assert cli_main(["collect", "--from", str(release), "--per-task", "2", "--out", str(out), *judge]) == 0
    s = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert s["held_out_left_out"] == 1 and s["input_records"] == 2 and sum(s["judged"].values()) == 1, s
    assert [r["task"] for r in map(json.loads, out.read_text().splitlines())] == ["level1/4"], s
    out2 = tmp_path / "all.jsonl"
    assert cli_main(["collect", "--from", str(release), "--allow-held-out", "--out", str(out2), *judge]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["held_out_left_out"] == 0
    assert sorted(r["task"] for r in map(json.loads, out2.read_text().splitlines())) == ["level1/4", "level1/5"]
    # from teachers, a suite holding a held-out task is refused before any request
    assert cli_main(["collect", "--suite", "kernelbench:level1", "--source", str(_kernelbench(tmp_path)), "--teacher",
                     "http://127.0.0.1:9/v1=m", "--out", str(tmp_path / "t.jsonl")]) == 2
    _one_line(capsys, "collect: 1 of 2", "level1/5")
