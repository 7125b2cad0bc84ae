"""Policies: the registry, ``openai`` against the scripted local server, ``replay``, ``hf`` on a tiny
model built at test time (no downloads, no LLM)."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
import types
from concurrent.futures import ThreadPoolExecutor

import pytest

from cudal1.config import ConfigError
from cudal1.policy import POLICIES, Policy, PolicyConfig, make_policy
from cudal1.train.smoke.server import Reply, ScriptedLLMServer, fail_first
from cudal1.types import Prompt

needs_openai = pytest.mark.skipif(importlib.util.find_spec("openai") is None, reason="openai is not installed")


def prompt(task: str = "19_ReLU", user: str = "make it fast", task_hash: str = "ab" * 32) -> Prompt:
    return Prompt(task_name=task, task_hash=task_hash, system="You write kernels.", user=user, template_version="t1")


@pytest.fixture
def llm_server():
    """A started :class:`ScriptedLLMServer`; set ``llm_server._script``/``default`` or make your own."""
    with ScriptedLLMServer(lifetime_s=60) as server:
        yield server


def openai_policy(server: ScriptedLLMServer, **options):
    defaults = dict(base_url=server.url, model="m", backoff_base_s=0.01, backoff_max_s=0.05, timeout_s=5.0)
    return make_policy("openai", **(defaults | options))


# ---- registry and config ------------------------------------------------------------------------


def test_unknown_policy_lists_known_names():
    with pytest.raises(ValueError, match="unknown policy 'gpt9'.*builtin.*hf.*openai.*replay"):
        make_policy("gpt9")


def test_registry_imports_lazily(monkeypatch):
    module = types.ModuleType("cudal1_fake_policy")

    class Fake:
        name = "fake"

        def __init__(self, **options):
            self.options = options

    module.Fake = Fake
    monkeypatch.setitem(sys.modules, "cudal1_fake_policy", module)
    monkeypatch.setitem(POLICIES, "fake", "cudal1_fake_policy:Fake")
    assert make_policy("fake", seed=3).options == {"seed": 3}
    assert POLICIES["builtin"] == "cudal1.policy.builtin:BuiltinPolicy"
    monkeypatch.setitem(POLICIES, "broken", "cudal1_fake_policy:Missing")
    with pytest.raises(ValueError, match="has no Missing"):
        make_policy("broken")


def test_config_rejects_unknown_options_and_hides_the_key():
    with pytest.raises(ConfigError, match="unknown policy key.*temprature"):
        PolicyConfig().replace(temprature=0.1)
    with pytest.raises(ConfigError):
        PolicyConfig(top_p=0)
    cfg = PolicyConfig(api_key="sk-secret", temperature=1)
    assert cfg.temperature == 1.0 and isinstance(cfg.temperature, float)
    assert "sk-secret" not in repr(cfg) and "sk-secret" not in json.dumps(cfg.to_dict())


@needs_openai
def test_missing_extra_names_the_install_command(monkeypatch):
    import cudal1.extras as extras

    real = extras.is_available
    monkeypatch.setattr(extras, "is_available", lambda name: name != "openai" and real(name))
    with pytest.raises(extras.MissingExtra, match=r'pip install "cudal1\[llm\]"'):
        make_policy("openai", base_url="http://127.0.0.1:1/v1", model="m")


@needs_openai
def test_openai_without_key_or_base_url_fails_loudly(monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ValueError, match="NO_SUCH_KEY_VAR"):
        make_policy("openai", model="m", api_key_env="NO_SUCH_KEY_VAR")


# ---- openai policy against the scripted server ---------------------------------------------------


@needs_openai
def test_openai_happy_path_n2_with_usage(llm_server):
    llm_server.default = Reply(texts=["first", "second"], usage={"prompt_tokens": 11, "completion_tokens": 7})
    with openai_policy(llm_server, temperature=0.3, top_p=0.9, max_tokens=123, api_key="sk-x") as policy:
        out = policy.generate([prompt(user="alpha"), prompt(user="beta")], n=2)
    assert [[c.text for c in row] for row in out] == [["first", "second"], ["first", "second"]]
    assert all(not c.error and c.latency_s > 0 and c.model == "m" and c.policy == "openai" for row in out for c in row)
    usage = [c.usage for c in out[0]]
    assert usage == [{"prompt_tokens": 6, "completion_tokens": 4}, {"prompt_tokens": 5, "completion_tokens": 3}]
    assert out[0][0].meta["request_usage"] == {"prompt_tokens": 11, "completion_tokens": 7}
    assert len(llm_server.requests) == 2  # one request per prompt, n=2 each
    body = llm_server.requests[0]
    assert body["n"] == 2 and body["temperature"] == 0.3 and body["top_p"] == 0.9 and body["max_tokens"] == 123
    users = sorted(r["messages"][1]["content"] for r in llm_server.requests)
    assert users == ["alpha", "beta"]
    assert body["messages"][0] == {"role": "system", "content": "You write kernels."}


@needs_openai
def test_openai_discovers_model_and_uses_dummy_key(llm_server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    policy = openai_policy(llm_server, model="")
    assert policy.model == "test-model"
    policy.generate([prompt()])
    assert llm_server.requests[0]["model"] == "test-model"
    policy.close()
    policy.close()  # idempotent


@needs_openai
@pytest.mark.parametrize("status", [429, 503])
def test_openai_retries_then_succeeds(status):
    with ScriptedLLMServer(fail_first(2, status, then="recovered")) as server:
        policy = openai_policy(server, max_retries=3)
        [[completion]] = policy.generate([prompt()])
    assert completion.text == "recovered" and not completion.error
    assert completion.meta["attempts"] == 3
    assert len(server.requests) == 3


@needs_openai
def test_openai_gives_up_after_max_retries():
    with ScriptedLLMServer(fail_first(100, 500)) as server:
        [[a, b]] = openai_policy(server, max_retries=2).generate([prompt()], n=2)
    assert a.text == "" and "HTTP 500" in a.error and "3 attempts" in a.error and b.error == a.error
    assert len(server.requests) == 3  # the second sample is not retried all over again


@needs_openai
def test_openai_non_retryable_400_is_an_error_completion():
    with ScriptedLLMServer([Reply(status=400)]) as server:
        [[completion]] = openai_policy(server).generate([prompt()])
    assert completion.text == "" and completion.error.startswith("HTTP 400")
    assert len(server.requests) == 1


@needs_openai
def test_openai_timeout_is_an_error_after_retries():
    with ScriptedLLMServer(default=Reply(delay_s=5)) as server:
        start = time.monotonic()
        [[completion]] = openai_policy(server, timeout_s=0.3, max_retries=1).generate([prompt()])
        elapsed = time.monotonic() - start
    assert "timeout" in completion.error and completion.text == ""
    assert len(server.requests) == 2 and elapsed < 3


@needs_openai
def test_openai_malformed_json_is_an_error_completion():
    with ScriptedLLMServer([Reply(raw=b"{not json"), "fine"]) as server:
        policy = openai_policy(server)
        [[bad]] = policy.generate([prompt()])
        [[good]] = policy.generate([prompt()])
    assert bad.error.startswith("bad response") and bad.text == ""
    assert good.text == "fine"


@needs_openai
def test_openai_falls_back_to_single_requests_when_n_is_rejected():
    with ScriptedLLMServer(default="one", reject_n=True) as server:
        policy = openai_policy(server)
        out = policy.generate([prompt()], n=3)
        assert [c.text for c in out[0]] == ["one"] * 3
        assert len(server.requests) == 4  # the rejected n=3 request, then three n=1 requests
        policy.generate([prompt()], n=2)
        assert len(server.requests) == 6  # learned: no more n>1 attempts
        assert all("n" not in body for body in server.requests[1:])


@needs_openai
def test_openai_concurrency_is_bounded():
    with ScriptedLLMServer(default=Reply(text="x", delay_s=0.15)) as server:
        policy = openai_policy(server, concurrency=3)
        assert isinstance(policy, Policy)
        out = policy.generate([prompt(user=str(i)) for i in range(9)])
        assert [len(row) for row in out] == [1] * 9 and all(row[0].text == "x" for row in out)
        assert 2 <= server.max_in_flight <= 3  # parallel, and bounded
        server.max_in_flight = 0
        # concurrent generate() calls (tasks of a suite) share the same bound
        with ThreadPoolExecutor(4) as pool:
            rows = list(pool.map(lambda i: policy.generate([prompt(user=f"{i}-{j}") for j in range(3)]), range(4)))
        assert sum(len(r) for r in rows) == 12 and server.max_in_flight <= 3


# ---- replay ---------------------------------------------------------------------------------------


def test_replay_policy(tmp_path):
    path = tmp_path / "replay.jsonl"
    records = [
        {"task": "19_ReLU", "code": "class ModelNew: pass"},
        {"task": "level1/19", "code": "```python\nclass ModelNew: ...\n```"},
        {"task": "other", "code": "x = 1"},
        {"task": "ab" * 5, "response": "## Code Implementation\n```python\nclass ModelNew: 3\n```"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    policy = make_policy("replay", replay_path=str(path))
    [[a, b]] = policy.generate([prompt("19_ReLU")], n=2)
    assert a.text == "```python\nclass ModelNew: pass\n```\n" and not a.error
    assert b.text == records[1]["code"]
    [[c, d]] = policy.generate([prompt("19_ReLU")], n=2)
    assert c.text.startswith("## Code Implementation")  # matched by task-hash prefix
    assert d.text == "" and "replay exhausted" in d.error
    assert policy.remaining() == 1
    custom = make_policy("replay", replay_path=str(path), match=lambda p, r: r["task"] == "other")
    [[e]] = custom.generate([prompt("anything")])
    assert "x = 1" in e.text


def test_replay_rejects_malformed_files(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"task": "t", "code": "x"}\n{"task": "t"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        make_policy("replay", replay_path=str(path))
    with pytest.raises(ValueError, match="replay_path"):
        make_policy("replay")


# ---- hf on a tiny model built here ----------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    words = "you write kernels make it fast class ModelNew def forward return x torch relu".split()
    specials = ["<unk>", "<pad>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>"]
    vocab = {w: i for i, w in enumerate(specials + words)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>"
    )
    tokenizer.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=64, vocab_size=len(vocab),
                        bos_token_id=vocab["<eos>"], eos_token_id=vocab["<eos>"], pad_token_id=vocab["<pad>"])
    import torch

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-gpt2")
    GPT2LMHeadModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_hf_policy_generates_n_per_prompt(tiny_model_dir):
    policy = make_policy("hf", model_path=str(tiny_model_dir), max_tokens=6, batch_size=2, seed=1, device="cpu")
    prompts = [prompt(user="make it fast"), prompt(user="class ModelNew def forward return x"), prompt(user="relu")]
    out = policy.generate(prompts, n=2)
    assert [len(row) for row in out] == [2, 2, 2]
    for row in out:
        for c in row:
            assert isinstance(c.text, str) and not c.error and c.policy == "hf"
            assert 1 <= c.usage["completion_tokens"] <= 6 and c.usage["prompt_tokens"] > 3
            assert c.meta["finish_reason"] in ("stop", "length")
    # prompts of different lengths in one batch: left padding keeps the shorter prompt's count exact
    assert out[0][0].usage["prompt_tokens"] != out[1][0].usage["prompt_tokens"]
    policy.close()
    [[closed]] = policy.generate([prompt()])
    assert "closed" in closed.error


def test_hf_policy_needs_a_model_directory(tmp_path):
    pytest.importorskip("transformers")
    with pytest.raises(ValueError, match="local model directory"):
        make_policy("hf", model_path=str(tmp_path / "missing"))


def test_hf_policy_left_padding_keeps_greedy_output(tiny_model_dir):
    policy = make_policy("hf", model_path=str(tiny_model_dir), max_tokens=5, temperature=0, device="cpu")
    short, long = prompt(user="relu"), prompt(user="class ModelNew def forward return x torch relu make it fast")
    [[alone]] = policy.generate([short])
    [[batched], _] = policy.generate([short, long])
    assert alone.text == batched.text and alone.usage == batched.usage


def test_make_policy_checks_every_policy_before_building_it(monkeypatch):
    """One place validates: the CLI's commands and library callers get the same one-line errors."""
    from cudal1.policy import PolicyError, policy_problem

    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("NO_KEY_HERE", raising=False)
    for name, options, says in [
        ("vllm", {}, "--model-path"),
        ("hf", {}, "--model-path"),
        ("replay", {}, "--replay"),
        ("hf", {"model_path": "m", "passes": ["algebraic"]}, "--passes applies"),
        ("hf", {"model_path": "m", "tensor_parallel_size": 2}, "--tensor-parallel-size applies"),
        ("openai", {"api_key_env": "NO_KEY_HERE"}, "--base-url"),
    ]:
        with pytest.raises(PolicyError, match=says):
            make_policy(name, **options)
    assert POLICIES["vllm"] == "cudal1.policy.vllm_policy:VLLMPolicy"  # vLLM is a registered policy like the rest
    assert policy_problem(PolicyConfig(name="vllm", model_path="m", tensor_parallel_size=2)) == ""
    assert policy_problem(PolicyConfig(name="builtin", passes=["algebraic"])) == ""


def test_make_policy_builds_the_builtin_policy_from_its_config():
    from cudal1.policy.builtin import BuiltinPolicy

    policy = make_policy("builtin", PolicyConfig(device="cpu", passes=["algebraic"]))
    assert isinstance(policy, BuiltinPolicy) and policy.device == "cpu" and policy.passes == ["algebraic"]
    with pytest.raises(ValueError, match="nope"):
        make_policy("builtin", passes=["nope"])
