"""``cudal1 evaluate``: the figures (unit tier) and the real command (CPU tier) against the scripted
OpenAI-compatible server (cudal1/train/smoke/server.py) and a tiny transformers model built at test time.

* pass@k is the unbiased estimator; compiled/correct/ok follow the judge's phases; fast_p counts
  a sample only when its CI clears p (``fast_p_point``: the point value), degenerate tasks never.
* Through an endpoint: exactly k requests per task, each one-shot (no exemplars), every answer
  judged and recorded; a failed request is recorded, not scored, and asked again on re-run; a
  re-run asks for nothing more; ``--samples`` raised asks only for the difference; the run store
  renders with ``cudal1 report``.
* Through transformers (``--policy hf``): the same pipeline with a local model directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cudal1.train.evaluation.figures import CONVENTION, Sample, figures, pass_at_k, pass_ks

# ---- the figures ----------------------------------------------------------------------------


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(8, 4, 1) == pytest.approx(0.5)
    assert pass_at_k(5, 1, 2) == pytest.approx(1 - 6 / 10)  # 1 - C(4,2)/C(5,2)
    assert pass_at_k(8, 1, 8) == 1.0 and pass_at_k(8, 0, 8) == 0.0 and pass_at_k(3, 3, 1) == 1.0
    assert pass_ks(8) == [1, 2, 4, 8] and pass_ks(6) == [1, 2, 4, 6] and pass_ks(1) == [1]
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_compiled_correct_ok_follow_the_judges_phases():
    assert not Sample("format").compiled
    assert not Sample("compile_error", "import").compiled
    assert not Sample("rejected", "").compiled  # the static guard refused it before any build
    runtime = Sample("runtime_error", "correctness")
    assert runtime.compiled and not runtime.correct
    assert Sample("incorrect", "correctness").compiled and not Sample("incorrect", "verify").correct
    caught_timing = Sample("rejected", "timing")  # correct outputs, a cheat caught while timed
    assert caught_timing.correct and not caught_timing.ok
    assert Sample("ok", "done", 2.0, (1.5, 2.5)).ok


def test_figures_over_k_samples():
    ok = lambda s, ci=None: Sample("ok", "done", s, ci)  # noqa: E731
    samples = {
        "a": [ok(3.0, (2.5, 3.5)), ok(1.1, (0.9, 1.3)), Sample("format"), Sample("incorrect", "correctness")],
        "b": [Sample("compile_error", "import")] * 4,
        "c": [ok(1.3, (1.25, 1.4)), Sample("runtime_error", "correctness"), ok(0.8, (0.7, 0.9)), Sample("format")],
        "d": [Sample("ok", "done", 50.0, (49.0, 51.0), degenerate=True)] * 4,
    }
    f = figures(samples, 4)
    assert f["tasks"] == 4 and f["samples"] == 16 and f["complete"]
    assert f["compile_rate"] == pytest.approx(10 / 16) and f["ok_rate"] == pytest.approx(8 / 16)
    assert f["correct_rate"] == pytest.approx(8 / 16)
    assert f["pass@1"] == pytest.approx((2 / 4 + 0 + 2 / 4 + 1) / 4) and f["pass@4"] == pytest.approx(3 / 4)
    # a: 3.0 clears every p; c: 1.3 clears 1.0 and 1.2 (CI 1.25-1.4); d is degenerate: never fast
    assert f["fast_p"] == {"1.0": 0.5, "1.2": 0.5, "1.5": 0.25, "2.0": 0.25}
    assert f["fast_p_point"]["1.0"] == 0.5
    assert f["fast_p_at_1"]["1.0"] == pytest.approx((1 / 4 + 0 + 1 / 4 + 0) / 4)  # a's 1.1 has a CI below 1.0
    # over all four tasks, b (unsolved) and d (degenerate) at 1.0; beside them the two solved ones alone
    assert f["speedup"] == {"geomean": pytest.approx((3.0 * 1.3) ** 0.25), "median": pytest.approx(1.15), "tasks": 4,
                            "unsolved": 2, "convention": CONVENTION, "solved": 2,
                            "solved_geomean": pytest.approx((3.0 * 1.3) ** 0.5), "solved_median": pytest.approx(2.15)}
    assert f["degenerate"] == 1 and f["per_task"]["a"]["best_speedup"] == 3.0
    short = figures({"a": samples["a"][:3]}, 4)
    assert not short["complete"] and short["pass@4"] is None and short["samples"] == 3


def test_solving_fewer_tasks_cannot_raise_the_all_task_figures():
    ok = lambda s: [Sample("ok", "done", s, (s * 0.9, s * 1.1))]  # noqa: E731
    broad = {"t1": ok(4.0), "t2": ok(1.5), "t3": ok(1.2), "t4": ok(1.1)}  # solves every task
    narrow = {
        "t1": ok(4.0), "t2": [Sample("format")], "t3": [Sample("compile_error", "import")],
        "t4": [Sample("format")],
    }
    b, n = figures(broad, 1)["speedup"], figures(narrow, 1)["speedup"]
    assert b["geomean"] > n["geomean"] and b["median"] > n["median"]
    assert n["solved_geomean"] > b["solved_geomean"]  # the solved-only figure is the one a narrow model inflates
    assert (
        n["unsolved"] == 3 and n["median"] == 1.0 and figures(narrow, 1)["fast_p"]["1.0"] == 0.25
    )  # unsolved: not fast
    assert figures({"t": [Sample("format")]}, 1)["speedup"]["geomean"] == 1.0


# ---- the command --------------------------------------------------------------------------------

openai = pytest.importorskip("openai")

from cudal1.cli.main import main as cli_main  # noqa: E402
from cudal1.train import smoke  # noqa: E402
from cudal1.train.smoke.server import Reply, ScriptedLLMServer  # noqa: E402

JUDGE = ["--device", "cpu", "--trials", "2", "--timing-trials", "10"]
ANSWERS = [smoke.answer(smoke.VARIANTS["broadcast"]), smoke.answer(smoke.VARIANTS["einsum"]),
           smoke.answer(smoke.FAILURES["wrong"]), "I would rather not write code today.",
           smoke.answer(smoke.FAILURES["crash"]), smoke.answer(smoke.VARIANTS["broadcast"]),
           smoke.answer(smoke.CHEATS["mutates_input"]), smoke.answer(smoke.VARIANTS["matmul"])]


def _summary(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _task_file(tmp_path: Path) -> Path:
    path = tmp_path / "diag_scale.py"
    path.write_text(smoke.TASK_SOURCE)
    return path


@pytest.mark.cpu
def test_evaluate_through_an_endpoint(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUDAL1_CACHE_DIR", str(tmp_path / "cache"))
    task = _task_file(tmp_path)
    out = tmp_path / "eval"
    script = ANSWERS[:7] + [Reply(status=400, text="context length exceeded")]  # the 8th request fails
    with ScriptedLLMServer(script, default=ANSWERS[7]) as srv:
        args = ["evaluate", str(task), "--base-url", srv.url, "--model", "m", "--samples", "8", "--out", str(out),
                "--json", *JUDGE]
        assert cli_main(args) == 0
        s = _summary(capsys)
        assert len(srv.requests) == 8 and all(r.get("n", 1) == 1 for r in srv.requests)  # one request per sample
        user = [m["content"] for m in srv.requests[0]["messages"] if m["role"] == "user"][0]
        assert "Earlier implementations" not in user and "diag_scale" in user  # one-shot: no exemplars
        assert s["requests"] == 8 and s["failed_requests"] == 1 and s["samples"] == 7 and not s["complete"]
        assert s["judged"] == {"ok": 3, "incorrect": 1, "format": 1, "runtime_error": 1, "rejected": 1}
        assert s["ok_rate"] == pytest.approx(3 / 7) and s["compile_rate"] == pytest.approx(6 / 7)
        assert s["pass@1"] == pytest.approx(3 / 7) and s["pass@4"] == pytest.approx(1 - 1 / 35) and s["pass@8"] is None
        assert set(s["fast_p"]) == {"1.0", "1.2", "1.5", "2.0"} and s["speedup"]["solved"] == 1
        assert s["speedup"]["tasks"] == 1 and s["speedup"]["unsolved"] == 0
        assert all(s["fast_p"][p] <= s["fast_p_point"][p] for p in s["fast_p"])
        assert json.loads((out / "evaluation.json").read_text())["samples"] == 7

        # re-run: only the failed request is asked again; the figures are now over 8 samples
        assert cli_main(args) == 0
        s2 = _summary(capsys)
        assert len(srv.requests) == 9 and s2["requests"] == 1 and s2["complete"] and s2["samples"] == 8
        assert s2["judged"]["ok"] == 4 and s2["pass@8"] == 1.0
        # nothing missing: no request at all
        assert cli_main(args) == 0
        assert len(srv.requests) == 9 and _summary(capsys)["requests"] == 0
        # a bigger budget asks only for the difference
        assert cli_main(args[:7] + ["10"] + args[8:]) == 0
        s3 = _summary(capsys)
        assert len(srv.requests) == 11 and s3["requests"] == 2 and s3["samples_per_task"] == 10

    # the same --out for another model is refused: its answers would count as this one's
    assert (
        cli_main(
            [
                "evaluate", str(task), "--base-url", "http://127.0.0.1:9/v1", "--model", "other", "--out",
                str(out), *JUDGE,
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "another model" in err[0] and "'m' -> 'other'" in err[0]

    from cudal1.store import RunStore

    with RunStore(out / "cudal1.sqlite") as store:
        rows = [r for r in store.responses() if r["policy"] == "evaluate"]
        assert len(rows) == 11 and sum(1 for r in rows if r["error"]) == 1
        assert all(r["round"] == 1 for r in rows)
    assert cli_main(["report", str(out), "--format", "md", "--out", str(tmp_path / "r.md")]) == 0
    assert "diag_scale" in (tmp_path / "r.md").read_text()


def test_evaluate_through_transformers(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    monkeypatch.setenv("CUDAL1_CACHE_DIR", str(tmp_path / "cache"))
    from cudal1.train.smoke.tiny import build_tiny_model

    texts = [smoke.answer(c) for c in smoke.VARIANTS.values()]
    model = build_tiny_model(tmp_path / "tiny", texts, hidden=32)
    out = tmp_path / "eval"
    assert (
        cli_main(
            [
                "evaluate", str(_task_file(tmp_path)), "--policy", "hf", "--model-path", str(model),
                "--samples", "2", "--max-tokens", "8", "--out", str(out), "--json", *JUDGE,
            ]
        )
        == 0
    )
    s = _summary(capsys)
    assert s["policy"] == "hf" and s["requests"] == 2 and s["samples"] == 2 and s["failed_requests"] == 0
    assert sum(s["judged"].values()) == 2 and s["per_task"]["diag_scale"]["samples"] == 2
    assert (out / "config.yaml").is_file() and "policy" in (out / "config.yaml").read_text()


def test_evaluate_usage_errors_are_one_line(tmp_path, capsys):
    task = str(_task_file(tmp_path))
    for argv, words in (
        (["evaluate", task], "needs a model"),
        (["evaluate", task, "--base-url", "http://127.0.0.1:9/v1", "--samples", "0"], "--samples"),
        (["evaluate", task, "--policy", "hf"], "--model-path"),
        (
            ["evaluate", task, "--policy", "hf", "--model-path", str(tmp_path), "--tensor-parallel-size", "2"],
            "--policy vllm only",
        ),
    ):
        assert cli_main(argv + ["--out", str(tmp_path / "o")]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("cudal1: error:") and words in err[0], err
