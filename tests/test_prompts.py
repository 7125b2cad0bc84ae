"""Unit tests for cudal1.prompts: prompt rendering, response parsing, exemplar selection."""

from __future__ import annotations

import collections
import math
import random
import subprocess
import sys

import pytest

from cudal1.prompts import (
    DEFAULT_BUCKET_WIDTH,
    STRATEGIES,
    available_templates,
    bucket_probabilities,
    build_prompt,
    eligible,
    exemplar_hash,
    failed_feedback,
    format_speedup,
    load_template,
    parse_response,
    select_exemplars,
    speedup_buckets,
)
from cudal1.types import Exemplar, Task, content_hash

REFERENCE = '''import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha

    def forward(self, x):
        return torch.relu(x) * self.alpha

def get_inputs():
    return [torch.randn(4096, 4096)]

def get_init_inputs():
    return [2.0]
'''

MODELNEW = '''import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha

    def forward(self, x):
        return torch.relu(x).mul_(self.alpha)
'''

TASK = Task(name="19_ReLU_scale", source=REFERENCE, level=1, problem_id=19)


def ok(code: str, speedup: float, h: str = "") -> Exemplar:
    return Exemplar(code=code, speedup=speedup, status="ok", candidate_hash=h)


def failed(code: str, status: str = "compile_error", feedback: str = "") -> Exemplar:
    return Exemplar(code=code, speedup=None, status=status, feedback=feedback)


# ---- templates and prompt building ------------------------------------------------------------


def test_template_is_package_data_and_unknown_name_fails_loudly():
    assert "contrastive_v1" in available_templates()
    assert load_template("contrastive_v1").name == "contrastive_v1"
    for bad in ("nope_v9", "../build", ""):
        with pytest.raises(KeyError, match="contrastive_v1"):
            load_template(bad)
    with pytest.raises(KeyError, match="known templates"):
        build_prompt(TASK, [], "CPU", template="nope_v9")


def test_prompt_contains_reference_exemplars_hardware_rules_and_sections():
    exemplars = [
        ok("# fast variant\n" + MODELNEW, 1.7312, h="hash-fast"),
        ok("# slow variant\n" + MODELNEW, 0.85, h="hash-slow"),
        ok("# middle variant\n" + MODELNEW, 1.2),
    ]
    p = build_prompt(TASK, exemplars, "NVIDIA H100 80GB HBM3")
    text = p.system + p.user
    assert REFERENCE.strip() in p.user
    for e in exemplars:
        assert e.code.strip() in p.user
    for s in ("1.73x", "0.85x", "1.20x"):
        assert s in p.user
    assert "NVIDIA H100 80GB HBM3" in p.user
    # rules
    for phrase in ("any valid input", "compile and run", "caching", "hyperparameters", "side-stream", "TF32",
                   "lower-precision"):
        assert phrase.lower() in text.lower(), phrase
    # sections in order, and the allowed toolchains
    i = [p.user.index(s) for s in ("Performance Analysis", "Algorithm Design", "Code Implementation")]
    assert i == sorted(i)
    for s in ("ModelNew", "load_inline", "Triton", "same arguments as `Model.__init__`"):
        assert s in p.user
    # sorted ascending: slowest first, best last
    pos = [p.user.index(v) for v in ("# slow variant", "# middle variant", "# fast variant")]
    assert pos == sorted(pos)
    assert p.template_version == "contrastive_v1"
    assert p.task_name == TASK.name and p.task_hash == TASK.hash
    assert p.exemplar_hashes == ("hash-slow", content_hash("candidate", exemplars[2].code), "hash-fast")
    assert p.messages()[0]["role"] == "system" and p.messages()[1]["content"] == p.user


def test_prompt_is_deterministic_and_code_with_dollars_and_fences_is_safe():
    tricky = MODELNEW + "\n# costs $5 and ${x}\n# ```python inside a comment```\n"
    a = build_prompt(TASK, [ok(tricky, 2.0)], "CPU")
    b = build_prompt(TASK, [ok(tricky, 2.0)], "CPU")
    assert a == b
    assert "costs $5 and ${x}" in a.user
    assert "````python" in a.user  # a longer fence than the backtick run inside the code


def test_zero_exemplar_prompt_reads_well():
    p = build_prompt(TASK, [], "CPU")
    assert "Earlier implementations" not in p.user and "failed" not in p.user.lower()
    assert "shown above" not in p.user
    assert "Analyse the reference implementation" in p.user
    assert "CPU" in p.user and REFERENCE.strip() in p.user
    assert "$" not in p.user  # no unfilled placeholders
    assert "\n\n\n" not in p.user
    assert p.exemplar_hashes == ()


def test_feedback_on_shows_failures_with_truncated_feedback():
    long_error = "error: first line\n" + "x" * 5000 + "\nfinal: RuntimeError boom"
    exemplars = [ok(MODELNEW, 1.5), failed("class ModelNew: broken", "compile_error", long_error),
                 failed("class ModelNew: wrong", "incorrect", "max abs error 3.2 at [0, 1]")]
    p = build_prompt(TASK, exemplars, "CPU", feedback=True, max_feedback_chars=300)
    assert "compile_error" in p.user and "incorrect" in p.user
    assert "error: first line" in p.user and "final: RuntimeError boom" in p.user
    assert "characters omitted" in p.user and "x" * 400 not in p.user
    assert "max abs error 3.2" in p.user and "class ModelNew: broken" in p.user
    assert len(p.exemplar_hashes) == 3
    # the successful one keeps its place in the contrastive section, failures come after it
    assert p.user.index("1.50x") < p.user.index("class ModelNew: broken")


def test_feedback_off_hides_failures():
    exemplars = [ok(MODELNEW, 1.5), failed("class ModelNew: broken", "compile_error", "nvcc: error 42")]
    p = build_prompt(TASK, exemplars, "CPU", feedback=False)
    assert "nvcc: error 42" not in p.user and "class ModelNew: broken" not in p.user
    assert "compile_error" not in p.user
    assert "1.50x" in p.user and len(p.exemplar_hashes) == 1


def test_only_failures_still_gets_a_contrastive_analysis_instruction():
    p = build_prompt(TASK, [failed("x = 1", "runtime_error", "CUDA error: illegal memory access")], "CPU")
    assert "illegal memory access" in p.user and "for any failed attempts" in p.user
    assert "Earlier implementations of this task" not in p.user


def test_empty_hardware_is_an_error():
    with pytest.raises(ValueError):
        build_prompt(TASK, [], "  ")


@pytest.mark.parametrize(
    "value, text",
    [(1.7312, "1.73x"), (1.0, "1.00x"), (0.5, "0.50x"), (120.4, "120x"), (0.004, "0.004x"), (None, "not measured")],
)
def test_format_speedup(value, text):
    assert format_speedup(value) == text


def test_exemplar_hash_falls_back_to_candidate_hash():
    assert exemplar_hash(ok("abc", 1.0)) == content_hash("candidate", "abc")
    assert exemplar_hash(ok("abc", 1.0, h="given")) == "given"


# ---- response parsing -------------------------------------------------------------------------

FENCED = f"```python\n{MODELNEW}```"

PARSE_OK = {
    "markdown_h2": "## Performance Analysis\nV2 fuses.\n\n## Algorithm Design\nOne kernel.\n\n## Code "
                   f"Implementation\n{FENCED}\n",
    "bold_inline": f"**Performance Analysis:** V2 fuses.\nIt saves traffic.\n\n**Algorithm Design:** one kernel\n\n"
    f"**Code Implementation:**\n```py\n{MODELNEW}```",
    "numbered": "1. Performance Analysis: V2 fuses.\n2. Algorithm Design - one kernel\n3. Code "
                f"Implementation\n```\n{MODELNEW}```",
    "h3_numbered_paren_lowercase": f"### 1) performance analysis\nV2 fuses.\n### 2) Algorithm design\none kernel\n"
    f"### 3) CODE IMPLEMENTATION\n{FENCED}",
    "extra_prose": "Sure! Here is my answer.\n\n# Performance Analysis\nV2 fuses.\n\n# Algorithm Design\none "
                   "kernel\n\n"
    f"# Code Implementation\nThe full code:\n{FENCED}\nThis should be about 2x faster. Let me know!",
    "bold_numbered": "**1. Performance Analysis**\nV2 fuses.\n\n**2. Algorithm Design**\none kernel\n\n**3. Code "
                     f"Implementation**\n{FENCED}",
    "bulleted_bold": f"- **Performance Analysis**: V2 fuses.\n- **Algorithm Design**: one kernel\n\n{FENCED}",
}


@pytest.mark.parametrize("style", sorted(PARSE_OK))
def test_parse_heading_styles(style):
    r = parse_response(PARSE_OK[style])
    assert r.format_ok and r.problem == ""
    assert r.code == MODELNEW
    assert "V2 fuses." in r.analysis
    assert "one kernel" in r.design.lower()
    assert "class ModelNew" not in r.analysis


def test_parse_missing_analysis_and_design_sections():
    r = parse_response(f"Here you go:\n{FENCED}")
    assert r.code == MODELNEW and r.analysis == "" and r.design == ""


def test_parse_strips_think_blocks_first():
    draft = "```python\nclass ModelNew:\n    DRAFT = 1\n```"
    r = parse_response(f"<think>\nLet me try\n{draft}\n## Code Implementation\n</think>\n## Performance Analysis\nok\n"
                       f"## Code Implementation\n{FENCED}")
    assert r.code == MODELNEW and "DRAFT" not in r.code and r.analysis == "ok"
    # a closing tag whose opening was in the chat template
    r = parse_response(f"reasoning {draft}\n</think>\n{FENCED}")
    assert r.code == MODELNEW
    # cut off while thinking: the draft is not taken
    r = parse_response(f"<think>\nLet me try\n{draft}")
    assert r.code is None and "<think>" in r.problem


def test_parse_prefers_code_implementation_over_later_usage_example():
    usage = "```python\nmodel = ModelNew(2.0)\nprint(model(torch.randn(4)))\n```"
    r = parse_response(f"## Code Implementation\n{FENCED}\n\nUsage:\n{usage}\n")
    assert r.code == MODELNEW
    # no headings at all: the last block that defines ModelNew, not the usage example after it
    other = MODELNEW.replace("mul_", "mul")
    r = parse_response(f"First try:\n{FENCED}\nBetter:\n```python\n{other}```\nUsage:\n{usage}")
    assert r.code == other


def test_parse_code_section_wins_over_code_quoted_in_analysis():
    quoted = MODELNEW.replace("mul_", "mul")
    r = parse_response(
        f"## Performance Analysis\nThe 1.7x one:\n```python\n{quoted}```\n## Code Implementation\n{FENCED}"
    )
    assert r.code == MODELNEW
    # a broken final answer is a format failure, not replaced by the quoted exemplar
    r = parse_response(f"## Performance Analysis\n```python\n{quoted}```\n## Code Implementation\n"
                       "```python\nclass ModelNew(nn.Module:\n    pass\n```")
    assert r.code is None and r.problem.startswith("code block does not parse")


@pytest.mark.parametrize(
    "text, problem",
    [
        ("", "empty response"),
        ("   \n\n", "empty response"),
        ("I cannot help with that.", "no code block"),
        ("## Code Implementation\nclass ModelNew is left as an exercise.", "no code block"),
        ("```python\nclass Foo(nn.Module):\n    pass\n```", "no class ModelNew in any code block"),
        ("```python\nclass ModelNew(nn.Module:\n    pass\n```", "code block does not parse"),
        ("```cuda\n__global__ void k() {}\n```", "no python code block"),
        (
            "## Code Implementation\n```python\nclass ModelNew(nn.Module):\n    def forward(self, x):\n",
            "code block does not parse",
        ),
    ],
)
def test_parse_format_failures(text, problem):
    r = parse_response(text)
    assert r.code is None and not r.format_ok
    assert r.problem.startswith(problem), r.problem


def test_parse_unfenced_python_and_indented_blocks():
    assert parse_response(MODELNEW).code == MODELNEW
    indented = (
        "1. Code Implementation:\n" + "\n".join("   " + line if line else "" for line in FENCED.splitlines()) + "\n"
    )
    assert parse_response(indented).code == MODELNEW


def test_parse_prose_starting_with_section_words_is_not_a_heading():
    r = parse_response(f"Performance analysis shows the kernel is memory bound.\n{FENCED}")
    assert r.analysis == "" and r.code == MODELNEW


def test_parse_mixed_cpp_and_python_blocks():
    text = (f"## Code Implementation\nThe kernel:\n```cpp\n__global__ void relu(float* x) {{}}\n```\n"
            f"And the module:\n{FENCED}")
    assert parse_response(text).code == MODELNEW


@pytest.mark.parametrize(
    "junk",
    [
        None, 42, "\x00", "```", "``````", "~~~~\n", "**",
        "#" * 200,
        "<think>", "</think>", "<think></think>", "```python\n\x00class ModelNew: pass\n```",
        "## Code Implementation\n" * 50,
        "\r\n```python\r\nclass ModelNew:\r\n  pass\r\n```\r\n",
        "a" * 200_000,
    ],
)
def test_parse_never_raises(junk):
    r = parse_response(junk)
    assert isinstance(r.problem, str)
    assert r.code is None or "ModelNew" in r.code


def test_parse_fuzz_never_raises():
    rng = random.Random(0)
    alphabet = ["```", "```python\n", "\n", "class ModelNew:\n", "    pass\n", "## Code Implementation\n",
                "**Performance Analysis:**", "<think>", "</think>", "~~~", "(", "1. ", "x", " ", "\t", "$"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        parse_response(text)


# ---- exemplar selection -----------------------------------------------------------------------

SPEEDUPS = [0.5, 0.52, 0.9, 1.0, 1.02, 1.3, 1.32, 2.0, 2.05, 4.0]


def make_pool() -> list[Exemplar]:
    pool = [ok(f"code_{i}", s) for i, s in enumerate(SPEEDUPS)]
    pool += [
        failed("broken_1", "compile_error", "nvcc error"),
        Exemplar(code="cheat", speedup=500.0, status="rejected", feedback="cached_result"),
        Exemplar(code="wrong", speedup=9.0, status="incorrect"),
        Exemplar(code="unmeasured", speedup=None, status="ok"),
        Exemplar(code="nan", speedup=float("nan"), status="ok"),
        Exemplar(code="zero", speedup=0.0, status="ok"),
    ]
    return pool


def test_eligible_only_ok_with_positive_finite_speedup_and_dedupes_by_code():
    pool = make_pool() + [ok("code_0", 0.55)]  # re-measured: the latest counts
    codes = [e.code for e in eligible(pool)]
    assert set(codes) == {f"code_{i}" for i in range(len(SPEEDUPS))}
    assert len(codes) == len(SPEEDUPS)
    assert [e.speedup for e in eligible(pool) if e.code == "code_0"] == [0.55]


def test_buckets_are_fixed_width_in_log_speedup():
    buckets = speedup_buckets(eligible(make_pool()))
    assert list(buckets) == sorted(buckets)
    for k, members in buckets.items():
        for e in members:
            assert k * DEFAULT_BUCKET_WIDTH <= math.log(e.speedup) < (k + 1) * DEFAULT_BUCKET_WIDTH
    assert sum(len(m) for m in buckets.values()) == len(SPEEDUPS)
    # 1.0 and 1.02 share a bucket; 1.0 and 1.3 do not
    assert [e.speedup for e in buckets[0]] == [1.0, 1.02]


def test_bucket_probabilities_softmax():
    buckets = speedup_buckets(eligible(make_pool()))
    probs = bucket_probabilities(buckets, tau=1.0)
    assert math.isclose(sum(probs.values()), 1.0)
    ordered = [probs[k] for k in buckets]
    assert ordered == sorted(ordered)  # higher buckets weigh more
    logs = [math.log(s) for s in SPEEDUPS]
    g = sum(logs) / len(logs)
    means = {k: sum(math.log(e.speedup) for e in m) / len(m) for k, m in buckets.items()}
    z = sum(math.exp(m - g) for m in means.values())
    for k in buckets:
        assert math.isclose(probs[k], math.exp(means[k] - g) / z)
    assert bucket_probabilities({}, 1.0) == {}


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_selection_is_deterministic_with_a_fixed_seed(strategy):
    a = select_exemplars(make_pool(), 3, strategy, rng=random.Random(123))
    b = select_exemplars(make_pool(), 3, strategy, rng=random.Random(123))
    assert a == b and len(a) == 3
    assert [e.speedup for e in a] == sorted(e.speedup for e in a)  # ascending: best last


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_failed_rejected_and_unmeasured_are_never_selected(strategy):
    rng = random.Random(7)
    allowed = {f"code_{i}" for i in range(len(SPEEDUPS))}
    for _ in range(300):
        picked = select_exemplars(make_pool(), 4, strategy, rng=rng, tau=0.05)
        assert {e.code for e in picked} <= allowed
        assert all(e.status == "ok" for e in picked)
        assert len({e.code for e in picked}) == len(picked)


def test_contrastive_draws_distinct_buckets():
    pool = make_pool()
    rng = random.Random(3)
    for _ in range(500):
        picked = select_exemplars(pool, 3, rng=rng)
        ks = [math.floor(math.log(e.speedup) / DEFAULT_BUCKET_WIDTH) for e in picked]
        assert len(set(ks)) == 3


def test_contrastive_takes_every_bucket_when_fewer_than_n():
    pool = [ok("a", 1.0), ok("b", 1.01), ok("c", 2.0), failed("d")]
    picked = select_exemplars(pool, 5, rng=random.Random(0))
    assert len(picked) == 2 and picked[-1].code == "c"
    assert select_exemplars([failed("x")], 2, rng=random.Random(0)) == []
    assert select_exemplars(make_pool(), 0, rng=random.Random(0)) == []


def test_softmax_favours_high_buckets():
    pool = make_pool()
    rng = random.Random(11)
    counts: collections.Counter[str] = collections.Counter()
    for _ in range(2000):
        (e,) = select_exemplars(pool, 1, rng=rng, tau=0.1)
        counts[e.code] += 1
    assert counts["code_9"] > 0.9 * 2000  # the 4.0x bucket, alone at the top
    # with τ large the choice is close to uniform over buckets
    rng = random.Random(12)
    hot = collections.Counter(select_exemplars(pool, 1, rng=rng, tau=100.0)[0].code for _ in range(2000))
    assert hot["code_9"] < 0.3 * 2000
    assert hot["code_0"] + hot["code_1"] > 0.05 * 2000
    # and a moderate τ still ranks buckets by speed
    rng = random.Random(13)
    mid = collections.Counter(select_exemplars(pool, 1, rng=rng, tau=1.0)[0].code for _ in range(2000))
    assert mid["code_9"] > mid["code_7"] + mid["code_8"] > mid["code_3"] + mid["code_4"]


def test_best_and_random_strategies():
    pool = make_pool()
    best = select_exemplars(pool, 3, "best", rng=random.Random(0))
    assert [e.speedup for e in best] == [2.0, 2.05, 4.0]
    rng = random.Random(5)
    seen = collections.Counter()
    for _ in range(1000):
        picked = select_exemplars(pool, 2, "random", rng=rng)
        assert len(picked) == 2 and picked[0].code != picked[1].code
        seen.update(e.code for e in picked)
    assert set(seen) == {f"code_{i}" for i in range(len(SPEEDUPS))}
    assert min(seen.values()) > 100  # roughly uniform: each expected 200 times


def test_unknown_strategy_and_bad_arguments():
    with pytest.raises(KeyError, match="contrastive.*random.*best"):
        select_exemplars(make_pool(), 2, "greedy", rng=random.Random(0))
    with pytest.raises(ValueError):
        select_exemplars(make_pool(), 2, rng=random.Random(0), tau=0.0)
    with pytest.raises(ValueError):
        select_exemplars(make_pool(), 2, rng=random.Random(0), bucket_width=-1.0)
    with pytest.raises(ValueError):
        select_exemplars(make_pool(), -1, rng=random.Random(0))


def test_failed_feedback_recent_failures_only():
    pool = [failed(f"old_{i}", "compile_error", "e") for i in range(10)]
    pool += [ok("good", 1.2), Exemplar(code="cheat", speedup=50.0, status="rejected")]
    pool += [failed("recent_a", "runtime_error"), failed("recent_b", "incorrect"), failed("recent_c", "timeout"),
             failed("recent_a", "runtime_error")]
    picked = failed_feedback(pool, 2, random.Random(0), window=3)
    assert len(picked) == 2 and {e.code for e in picked} <= {"recent_a", "recent_b", "recent_c"}
    assert failed_feedback(pool, 2, random.Random(0), window=3) == picked  # deterministic
    everything = failed_feedback(pool, 100, random.Random(0), window=100)
    assert "cheat" not in {e.code for e in everything} and "good" not in {e.code for e in everything}
    assert len(everything) == 13  # 10 old + 3 distinct recent
    idx = [next(i for i, p in enumerate(pool) if p is e) for e in everything]
    assert idx == sorted(idx)  # pool (chronological) order
    assert idx[-1] == len(pool) - 1  # a repeated failure counts at its latest position
    assert failed_feedback(pool, 0, random.Random(0)) == []
    with_rejected = failed_feedback(pool, 100, random.Random(0), window=100, statuses=("rejected",))
    assert [e.code for e in with_rejected] == ["cheat"]


def test_selection_feeds_build_prompt_end_to_end():
    rng = random.Random(0)
    pool = make_pool()
    shown = select_exemplars(pool, 2, rng=rng) + failed_feedback(pool, 1, rng)
    p = build_prompt(TASK, shown, "CPU")
    for e in shown:
        assert e.code in p.user
    assert len(p.exemplar_hashes) == 3


@pytest.mark.cpu
def test_prompts_package_imports_neither_torch_nor_the_harness():
    code = (
        "import sys, cudal1.prompts; "
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.') or m.startswith('cudal1.harness')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


# ---- the Performance Analysis check ---------------------------------------------------------------


def _contrastive_user() -> str:
    shown = [
        ok(MODELNEW.replace("mul_", "mul"), 0.8, "a"),
        ok(MODELNEW, 1.5, "b"),
        ok(MODELNEW + "\n# v3\n", 2.13, "c"),
    ]
    return build_prompt(TASK, shown, "NVIDIA H200").user


def test_analysis_check_reads_what_the_prompt_showed():
    from cudal1.prompts import check_analysis
    from cudal1.prompts.analysis import shown_implementations

    user = _contrastive_user()
    assert shown_implementations(user) == [(1, "0.80x"), (2, "1.50x"), (3, "2.13x")]
    full = check_analysis(
        "Implementation 3 (2.13x) beats Implementation 1 (0.80x) because it scales in place: one kernel "
        "instead of two, so half the memory traffic and one launch less.",
        user,
    )
    assert (full.present, full.best, full.names_best, full.cites_speedups, full.compares) == (True, 3, True, True, True)
    assert full.reasons == ["memory", "launches"] and full.score == 1.0
    by_speedup = check_analysis("The fastest one, at 2.13x, avoids a second pass over the output tensor and its memory "
                                "traffic; the slower ones allocate a temporary.", user)
    assert by_speedup.names_best and not by_speedup.compares and by_speedup.reasons == ["memory"]
    assert by_speedup.score == pytest.approx(2 / 3)
    apart = check_analysis(
        "Implementation 2 reached 1.50 times and Implementation 3 reached 2.13x in the measurements. "
        "Separately: memory traffic and kernel launches matter on GPUs in general.",
        user,
    )
    assert apart.compares and apart.names_best and apart.reasons == [] and apart.score == pytest.approx(2 / 3)
    assert check_analysis("It is faster at 2.13x.", user).score == 0.0  # too short to count
    assert not check_analysis(" ".join(["word"] * 20) + " 12.13x faster", user).cites_speedups  # 12.13x is not 2.13x


BOILERPLATE = [
    # causes without a measurement: what a model could write for any prompt
    "The reference can be made faster by writing a custom CUDA kernel that uses shared memory and many threads per "
    "block "
    "to keep the GPU busy, coalesced loads, fused elementwise operations and fewer kernel launches.",
    # every implementation named, the best called best, every family of cause listed: no figure
    "Implementation 1, Implementation 2 and Implementation 3 differ in memory traffic, kernel launches, fusion, "
    "parallelism, algorithmic work and precision; Implementation 3 is the best and the fastest one, #3, version 3.",
    # figures, but not the measured ones
    "The best version runs at 10x and the slowest at 0.5x because of memory bandwidth, launch overhead and fusion; "
    "a fused kernel at 4.2x would beat both by cutting global memory traffic in half.",
    # keyword stuffing
    " ".join(["memory bandwidth coalescing launch overhead fusion fused threads warps occupancy flops precision"] * 3),
]


@pytest.mark.parametrize("text", BOILERPLATE)
def test_boilerplate_scores_nothing_however_it_is_worded(text):
    from cudal1.prompts import check_analysis

    for user in (_contrastive_user(), build_prompt(TASK, [], "CPU").user):
        check = check_analysis(text, user)
        assert check.present and check.score == 0.0, check
        assert not (check.names_best or check.compares or check.reasons)


def test_analysis_check_of_a_one_shot_prompt():
    from cudal1.prompts import check_analysis

    user = build_prompt(TASK, [], "CPU").user
    reasons = check_analysis(
        "The reference reads the input twice and writes a temporary; fusing relu and the scaling into one "
        "pass halves the memory traffic.",
        user,
    )
    assert reasons.present and reasons.shown == 0 and reasons.best is None
    assert reasons.score == 0.0  # nothing measured was shown: nothing to check the analysis against
