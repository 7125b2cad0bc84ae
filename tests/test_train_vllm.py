"""Every vLLM setting cudal1 accepts reaches the engine (no vLLM, no GPU: fakes that record).

* GRPO (TRL's engine): each ``vllm_*`` field reaches ``trl.GRPOConfig``, and through TRL's own
  trainer the engine it builds — ``vllm.LLM`` in colocate mode (tensor-parallel size, memory share,
  context length), ``VLLMClient`` in server mode (the server's host and port) — replaced by
  recording fakes in ``trl.generation.vllm_generation``.
* Offline generation (``cudal1.policy.vllm_policy``: ``train ssl``, ``evaluate --policy vllm``):
  ``VLLMEngine`` against the fake ``vllm`` package in ``tests/fake_vllm`` (alone, and as one of an
  engine group of ranks); then both commands end to end in a process of their own with that
  package first on the path: what the engine was given, what it answered, what was judged.

Unit tier, except the two commands (CPU tier: they start the judge)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cudal1.train import smoke

FAKE = Path(__file__).resolve().parent / "fake_vllm"
SETTINGS = {"vllm_gpu_memory_utilization": 0.42, "vllm_max_model_length": 3072,
            "vllm_server_base_url": "http://10.1.2.3:8123"}


def _grpo_args(tmp_path: Path, processes: int = 1, **fields):
    pytest.importorskip("trl")
    from cudal1.train.config import load_config
    from cudal1.train.stages.grpo import grpo_arguments

    return grpo_arguments(
        load_config("grpo", "smoke", {"use_vllm": True, **SETTINGS, **fields}), tmp_path, processes=processes
    )


def test_every_grpo_vllm_setting_reaches_trls_config(tmp_path):
    colocate = _grpo_args(tmp_path, processes=4, vllm_tensor_parallel_size=2, prompts_per_step=4)
    assert colocate.use_vllm and colocate.vllm_mode == "colocate"
    assert colocate.vllm_tensor_parallel_size == 2 and colocate.vllm_gpu_memory_utilization == 0.42
    assert colocate.vllm_max_model_length == 3072
    server = _grpo_args(tmp_path, vllm_mode="server")
    assert server.vllm_mode == "server" and server.vllm_server_base_url == "http://10.1.2.3:8123"
    assert not _grpo_args(tmp_path, use_vllm=False).use_vllm
    with pytest.raises(ValueError, match="must divide the number of training processes"):
        _grpo_args(tmp_path, processes=3, vllm_tensor_parallel_size=2, prompts_per_step=3)


@pytest.fixture
def trl_engine_fakes(monkeypatch):
    """TRL's engine classes replaced by recorders; the rank variables TRL sets are restored after."""
    pytest.importorskip("trl")
    from trl.generation import vllm_generation as vg

    seen: dict = {}

    class LLM:
        def __init__(self, **kwargs):
            seen["LLM"] = kwargs

    class VLLMClient:
        def __init__(self, **kwargs):
            seen["VLLMClient"] = kwargs

        def init_communicator(self, device):
            seen["communicator"] = str(device)

        def get_server_info(self):
            return {"model_config": {"logprobs_mode": "processed_logprobs"}}

    monkeypatch.setattr(vg, "LLM", LLM, raising=False)  # defined there only when vLLM is installed
    monkeypatch.setattr(vg, "VLLMClient", VLLMClient, raising=False)
    monkeypatch.setattr(vg, "is_vllm_available", lambda *a, **k: True)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(
            name, {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.get(name, os.environ.get(name, ""))
        )
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    return seen


@pytest.mark.parametrize("mode", ["colocate", "server"])
def test_trls_trainer_hands_the_settings_to_the_engine(tmp_path, trl_engine_fakes, mode):
    import trl
    from datasets import Dataset

    from cudal1.train.smoke.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "m", [smoke.answer(c) for c in smoke.VARIANTS.values()], hidden=32)
    args = _grpo_args(tmp_path / "out", vllm_mode=mode)
    trl.GRPOTrainer(model=str(model), reward_funcs=[lambda completions, **_: [0.0] * len(completions)], args=args,
                    train_dataset=Dataset.from_dict({"prompt": ["x"] * 16}))
    if mode == "colocate":
        llm = trl_engine_fakes["LLM"]
        assert (llm["model"], llm["tensor_parallel_size"]) == (str(model), 1)
        assert llm["gpu_memory_utilization"] == 0.42 and llm["max_model_len"] == 3072
    else:
        assert "LLM" not in trl_engine_fakes
        assert trl_engine_fakes["VLLMClient"]["base_url"] == "http://10.1.2.3:8123"  # the server's host and port


@pytest.fixture
def fake_vllm(monkeypatch, tmp_path):
    """The fake ``vllm`` package importable in this process (forgotten after the test); its log."""
    from cudal1 import extras

    monkeypatch.syspath_prepend(str(FAKE))
    extras.is_available.cache_clear()  # probes are cached per process: ask again, and forget the answers after
    log = tmp_path / "vllm.jsonl"
    monkeypatch.setenv("FAKE_VLLM_LOG", str(log))
    yield log
    extras.is_available.cache_clear()
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[name]


def _events(log: Path) -> list[dict]:
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def test_offline_engine_gets_every_setting_alone_and_in_an_engine_group(fake_vllm):
    from cudal1.policy.vllm_policy import GenerationSettings, VLLMEngine, use_vllm
    from cudal1.prompts import build_prompt

    assert use_vllm("auto") and use_vllm("vllm")  # installed (the fake): auto means vLLM
    settings = GenerationSettings(
        backend="vllm", temperature=0.6, top_p=0.8, max_new_tokens=777, tensor_parallel_size=4,
        gpu_memory_utilization=0.55, max_model_length=5000,
    )
    engine = VLLMEngine("/models/m", settings, seed=7)
    texts = engine.texts([build_prompt(smoke.smoke_task(), [], "CPU")] * 2, n=3)
    engine.close()
    VLLMEngine("/models/m", settings, seed=8, world=8).close()
    init, chat, destroy, group, _ = _events(fake_vllm)
    assert init["kwargs"] == {
        "seed": 7, "tensor_parallel_size": 4, "gpu_memory_utilization": 0.55, "max_model_len": 5000,
    }
    assert chat["prompts"] == 2 and chat["roles"] == [["system", "user"]]
    assert {k: chat["params"][k] for k in ("n", "temperature", "top_p", "max_tokens")} == \
        {"n": 3, "temperature": 0.6, "top_p": 0.8, "max_tokens": 777}
    assert [len(t) for t in texts] == [3, 3] and destroy["event"] == "destroy"
    assert group["kwargs"]["distributed_executor_backend"] == "external_launcher"  # ranks are the engine's workers
    assert group["kwargs"]["tensor_parallel_size"] == 4


def _run(
    args: list[str], tmp_path: Path, answers: list[str], timeout: float
) -> tuple[subprocess.CompletedProcess, list]:
    log, script = tmp_path / "vllm.jsonl", tmp_path / "answers.json"
    script.write_text(json.dumps(answers))
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(FAKE), str(root / "src"), os.environ.get("PYTHONPATH", "")]),
               FAKE_VLLM_LOG=str(log), FAKE_VLLM_ANSWERS=str(script), CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false", CUDAL1_CACHE_DIR=str(tmp_path / "cache"))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, "-m", "cudal1.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, _events(log)


ANSWERS = [smoke.answer(smoke.VARIANTS["broadcast"]), smoke.answer(smoke.FAILURES["wrong"]),
           smoke.answer(smoke.VARIANTS["einsum"]), "no code at all"]


@pytest.mark.cpu
def test_evaluate_with_policy_vllm_end_to_end(tmp_path):
    task = tmp_path / "diag_scale.py"
    task.write_text(smoke.TASK_SOURCE)
    model = tmp_path / "model"
    model.mkdir()
    proc, events = _run(
        [
            "evaluate", str(task), "--policy", "vllm", "--model-path", str(model), "--tensor-parallel-size",
            "2", "--samples", "4", "--temperature", "0.3", "--max-tokens", "900", "--sample-seed", "5",
            "--device", "cpu", "--trials", "2", "--timing-trials", "10", "--out", str(tmp_path / "eval"),
            "--json",
        ],
        tmp_path,
        ANSWERS,
        timeout=240,
    )
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [e["event"] for e in events] == ["init", "chat", "destroy"]
    assert events[0]["model"] == str(model) and events[0]["kwargs"]["tensor_parallel_size"] == 2
    assert events[0]["kwargs"]["seed"] == 5 and "distributed_executor_backend" not in events[0]["kwargs"]
    assert events[1]["prompts"] == 4 and events[1]["params"]["n"] == 1  # one request per sample
    assert events[1]["params"]["temperature"] == 0.3 and events[1]["params"]["max_tokens"] == 900
    assert summary["policy"] == "vllm" and summary["samples"] == 4
    assert summary["judged"] == {"ok": 2, "incorrect": 1, "format": 1}


@pytest.mark.cpu
def test_ssl_generates_with_the_vllm_engine_end_to_end(tmp_path, seed_primed):
    out = tmp_path / "ssl"
    seed_primed(out)
    from cudal1.train.config import load_config

    cfg = load_config(
        "ssl",
        "smoke",
        {
            "backend": "vllm", "vllm_tensor_parallel_size": 2, "vllm_gpu_memory_utilization": 0.55,
            "vllm_max_model_length": 3072, "temperature": 0.9, "top_p": 0.7, "rounds": 2, "sft.max_steps": 2,
        },
    )
    config = tmp_path / "ssl.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()))
    proc, events = _run(["train", "ssl", "--smoke", "--config", str(config), "--out", str(out), "--json"], tmp_path,
                        ANSWERS, timeout=300)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [e["event"] for e in events] == ["init", "chat", "destroy"] * 2  # freed before each round's fine-tuning
    first, second = events[0], events[3]
    assert first["model"].endswith("prime/primed") and second["model"] == str(out / "round1" / "model")
    for init in (first, second):  # one process: one engine over 2 GPUs, no external launcher
        assert init["kwargs"] == {
            "seed": init["kwargs"]["seed"], "tensor_parallel_size": 2, "gpu_memory_utilization": 0.55,
            "max_model_len": 3072,
        }
    assert {k: events[1]["params"][k] for k in ("temperature", "top_p", "max_tokens")} == \
        {"temperature": 0.9, "top_p": 0.7, "max_tokens": cfg.max_new_tokens}
    assert events[1]["prompts"] == cfg.samples  # every sample of the round in one batch
    rounds = summary["rounds"]
    assert [r["generated"] for r in rounds] == [cfg.samples] * 2 and rounds[0]["judged"]["ok"] == cfg.samples // 2
    assert rounds[0]["kept"] == 2  # broadcast and einsum: two distinct verified programs
