"""What ``--smoke`` runs need: a bundled task, programs for it, a judge preset and a scripted teacher.

* :data:`TASK_SOURCE` — ``diag_scale``: ``diag(A) @ B`` for a 512-vector and a 512×512 matrix
  (KernelBench level1/12 in miniature).  The judge runs it in a second or so on a CPU.
* :data:`VARIANTS` — correct ``ModelNew`` programs that differ in speed (a matrix product with a
  materialised diagonal, a Python loop over rows, ``einsum``, broadcasting); :data:`FAILURES` —
  wrong or crashing ones; :data:`CHEATS` — correct-looking ones the judge rejects (input mutation,
  output caching).  The GRPO smoke primes a tiny model on all of them and must learn to prefer
  the fast ones; the ``collect`` smoke's teacher answers with all kinds and only the verified
  must reach the data set.
* :func:`smoke_judge_config` — few correctness and timing trials, so a verdict costs about one
  worker start-up; every guard stays on.
* :func:`scripted_teacher` — the scripted OpenAI-compatible endpoint on 127.0.0.1
  (:mod:`cudal1.train.smoke.server`, stdlib only) answering in CUDA-L1's three-section format,
  cycling through a script of programs.
* :mod:`.stages` runs each training stage on the smoke task; :mod:`.tiny` builds the tiny model.

None of this is a mock of the pipeline: the trainers, the judge's subprocesses and the HTTP
client are the real ones; only the model and the teacher are small.
"""

from __future__ import annotations

from typing import Any

from cudal1.train.smoke.server import ScriptedLLMServer, cycle
from cudal1.types import Task

TASK_NAME = "diag_scale"
TASK_SOURCE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """C = diag(A) @ B: scale the rows of B by the entries of A."""

    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.diag(A) @ B


N = 512


def get_inputs():
    return [torch.randn(N), torch.randn(N, N)]


def get_init_inputs():
    return []
'''

_HEADER = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
'''


def _program(body: str, header: str = _HEADER) -> str:
    return header + "".join(f"        {line}\n" for line in body.splitlines())


# Correct programs, roughly slowest first (measured on a CPU: loop < matmul < einsum ~ broadcast).
VARIANTS: dict[str, str] = {
    "loop": _program("return torch.stack([A[i] * B[i] for i in range(B.shape[0])])"),
    "matmul": _program("return torch.diag(A) @ B"),
    "mm": _program("return torch.mm(torch.diag(A), B)"),
    "einsum": _program('return torch.einsum("i,ij->ij", A, B)'),
    "broadcast": _program("return A.unsqueeze(1) * B"),
    "broadcast_rhs": _program("return B * A[:, None]"),
}

FAILURES: dict[str, str] = {
    "wrong": _program("return torch.diag(A) + B"),  # incorrect
    "crash": _program("return A @ B.t()[:3]"),  # runtime error (shape mismatch)
}

CHEATS: dict[str, str] = {
    "mutates_input": _program("out = A.unsqueeze(1) * B\nB.zero_()\nreturn out"),
    "caches_output": '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0
        self.last = None

    def forward(self, A, B):
        self.calls += 1
        if self.last is None or self.calls <= 8:
            self.last = A.unsqueeze(1) * B
        return self.last
''',
}


def smoke_task(size: int = 512) -> Task:
    """The bundled task; ``size`` sets N (512 for CPU smokes: the programs' speeds then differ by
    more than a loaded CPU's timing noise; GPU runs want thousands)."""
    source = TASK_SOURCE if size == 512 else TASK_SOURCE.replace("N = 512\n", f"N = {int(size)}\n")
    return Task(name=TASK_NAME, source=source, origin="cudal1.train.smoke")


def smoke_eval_task() -> Task:
    """What ``train grpo --smoke --eval-every`` evaluates on: the bundled task at N = 256, a task
    the smoke does not train on (the eval split must be disjoint from the training tasks)."""
    import dataclasses

    return dataclasses.replace(smoke_task(256), name=f"{TASK_NAME}_n256")


def smoke_judge_config(device: str = "cpu"):
    """The judge for smoke runs: two correctness trials, short timing; all guards on."""
    from cudal1.config import EvalConfig

    return EvalConfig.preset("fast").replace(device=device, correctness_trials=2, timing_trials=20, min_timing_trials=5,
                                             timing_budget_s=0.3, warmup_calls=1, bootstrap_samples=200)


def answer(code: str, analysis: str = "", design: str = "") -> str:
    """``code`` as a CUDA-L1 answer: Performance Analysis, Algorithm Design, Code Implementation."""
    return (f"### Performance Analysis\n{analysis or 'The reference materialises an N x N diagonal matrix.'}\n\n"
            f"### Algorithm Design\n{design or 'Scale the rows directly.'}\n\n"
            f"### Code Implementation\n```python\n{code.rstrip()}\n```\n")


def teacher_script() -> list[str]:
    """What the smoke teacher answers, in order (then again): every kind of outcome."""
    return [answer(VARIANTS["broadcast"]), answer(FAILURES["wrong"]), answer(CHEATS["mutates_input"]),
            "I would rather not write code today.", answer(VARIANTS["einsum"]), answer(CHEATS["caches_output"]),
            answer(FAILURES["crash"]), answer(VARIANTS["matmul"])]


def scripted_teacher(texts: list[str] | None = None, model: str = "smoke-teacher") -> ScriptedLLMServer:
    """The ``collect`` smoke's teacher: the one scripted OpenAI-compatible server
    (:mod:`cudal1.train.smoke.server`) answering every choice with the next of ``texts`` (default
    :func:`teacher_script`), over and over.  Use it as a context manager; ``url`` ends in ``/v1``."""
    return ScriptedLLMServer(cycle(list(texts or teacher_script())), model=model, lifetime_s=24 * 3600)


# Plausible measured speedups for the priming prompts' exemplars (CPU-like: loop and matmul slow).
_SPEEDUP_RANGE = {"loop": (0.25, 0.4), "matmul": (0.6, 1.1), "mm": (0.6, 1.1), "einsum": (2.5, 4.0),
                  "broadcast": (3.0, 5.0), "broadcast_rhs": (3.0, 5.0)}


def priming_records(task: Task, count: int, *, seed: int = 0, hardware: str = "CPU",
                    answers: dict[str, str] | None = None, max_exemplars: int = 2,
                    exemplars: dict[str, tuple[str, tuple[float, float]]] | None = None) -> list[dict[str, Any]]:
    """``count`` chat records (``messages``) whose prompts are real contrastive prompts for ``task``
    (0 to ``max_exemplars`` exemplars with plausible speedups) and whose answers are drawn uniformly from ``answers``
    (default: every variant, failure and cheat), each as a short Code Implementation section.
    ``exemplars`` adds programs to the exemplar pool: name -> (code, speedup range)."""
    import random

    from cudal1.prompts import build_prompt
    from cudal1.types import Exemplar, reference_candidate

    rng = random.Random(seed)
    answers = answers or {**VARIANTS, **FAILURES, "mutates_input": CHEATS["mutates_input"]}
    pool = {**VARIANTS, "reference": reference_candidate(task).source}  # GRPO's pool starts with the reference
    ranges = _SPEEDUP_RANGE | {"reference": (0.95, 1.05)}
    for name, (code, span) in (exemplars or {}).items():
        pool[name], ranges[name] = code, span
    records = []
    for _ in range(count):
        shown = [
            Exemplar(pool[k], round(rng.uniform(*ranges[k]), 2))
            for k in rng.sample(sorted(pool), rng.randint(0, max_exemplars))
        ]
        prompt = build_prompt(task, shown, hardware)
        name = rng.choice(sorted(answers))
        records.append({"messages": prompt.messages() + [{"role": "assistant", "content": short_answer(answers[name])}],
                        "variant": name})
    return records


def short_answer(code: str) -> str:
    """``code`` as the shortest answer the parser accepts (the tiny model's whole output)."""
    return f"### Code Implementation\n```python\n{code.rstrip()}\n```"


def fixed_strings(records: list[dict[str, Any]], programs: tuple[str, ...] | list[str] = ()) -> list[str]:
    """Strings the smoke tokenizer keeps whole: the prompt template's constant sentences and every
    line of the bundled task and programs (with its newline).  The tiny model then sees short
    sequences (a CPU pays per token) and chooses between programs line by line, not character
    by character — which keeps priming and GRPO to a few dozen steps.  ``programs``: more programs
    whose lines are kept whole (e.g. ``benchmarks/train_gpu_programs.py``'s GPU programs)."""
    from cudal1.train.smoke.tiny import common_lines

    by_role = lambda role: [m["content"] for r in records for m in r["messages"] if m["role"] == role]  # noqa: E731
    from cudal1.types import reference_candidate

    programs = [reference_candidate(smoke_task()).source, *VARIANTS.values(), *FAILURES.values(), *CHEATS.values(),
                *programs]
    code_lines = sorted({line for code in programs for line in code.splitlines(keepends=True) if line.strip()})
    return common_lines(by_role("system")) + common_lines(by_role("user")) + code_lines + \
        ["### Code Implementation\n", "```python\n"]
