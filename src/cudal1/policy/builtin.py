"""The builtin policy: no LLM, proposes verified-rewrite candidates as readable source.

Contract: ``BuiltinPolicy.generate(prompts, n)`` returns, for each prompt, up to ``n`` completions
whose text has the same sections an LLM would write (analysis, design, one code block), so the
judge and the search loop treat them like any other candidate.  Each completion applies one
named pass from ``PASSES`` (a registry; unknown names fail loudly) that it has not proposed for
that task before, and declines (an error completion ``"builtin: no pass left"``) once every
applicable pass was tried.  Generated modules are plain Python a person could keep: the
reference source unchanged, then a ``ModelNew`` subclass, with a comment naming the pass; they
import nothing from cudal1.

Passes here are compilation-level (``torch.compile`` modes, whole-forward CUDA-graph capture).
Algebraic torch.fx rewrites and generated Triton fusions belong to the builtin-policy issue and
plug into the same registry.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Callable

from cudal1.types import Completion, Prompt


@dataclass(frozen=True)
class Pass:
    name: str
    description: str
    cuda_only: bool
    render: Callable[[], str]  # the ModelNew class source (appended after the reference)


def _compile_class(mode: str | None) -> str:
    mode_arg = f', mode="{mode}"' if mode else ""
    label = mode or "default"
    return textwrap.dedent(f'''
        class ModelNew(Model):
            """The reference forward compiled by torch.compile (mode {label}); same parameters."""

            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self._compiled_forward = torch.compile(super().forward{mode_arg})

            def forward(self, *args):
                return self._compiled_forward(*args)
        ''')


def _cudagraph_class() -> str:
    return textwrap.dedent('''
        class ModelNew(Model):
            """The reference forward captured once in a CUDA graph and replayed.

            Inputs are copied into static buffers on every call; outputs are cloned, so a caller
            never sees them change on the next call.  Falls back to eager for non-CUDA inputs
            or when shapes change (the graph is recaptured for the new shapes).
            """

            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self._graph = None
                self._key = None

            def _capture(self, args):
                self._static_in = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        super().forward(*self._static_in)
                torch.cuda.current_stream().wait_stream(side)
                self._graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self._graph):
                    self._static_out = super().forward(*self._static_in)

            def forward(self, *args):
                tensors = [a for a in args if isinstance(a, torch.Tensor)]
                if not tensors or not all(t.is_cuda for t in tensors):
                    return super().forward(*args)
                key = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
                if self._graph is None or key != self._key:
                    self._capture(args)
                    self._key = key
                for dst, src in zip(self._static_in, args):
                    if isinstance(dst, torch.Tensor):
                        dst.copy_(src)
                self._graph.replay()
                out = self._static_out
                if isinstance(out, torch.Tensor):
                    return out.clone()
                return type(out)(o.clone() if isinstance(o, torch.Tensor) else o for o in out)
        ''')


PASSES: dict[str, Pass] = {
    p.name: p
    for p in (
        Pass("compile-default", "torch.compile, default mode (Inductor fusion)", False, lambda: _compile_class(None)),
        Pass("compile-max-autotune", "torch.compile, max-autotune (autotuned Triton/GEMM templates, CUDA graphs)", False,
             lambda: _compile_class("max-autotune")),
        Pass("compile-max-autotune-no-cudagraphs", "torch.compile, max-autotune without CUDA graphs", False,
             lambda: _compile_class("max-autotune-no-cudagraphs")),
        Pass("compile-reduce-overhead", "torch.compile, reduce-overhead (CUDA graphs)", True,
             lambda: _compile_class("reduce-overhead")),
        Pass("cudagraph", "whole-forward CUDA-graph capture with static buffers", True, _cudagraph_class),
    )
}

_MARK = "# cudal1-builtin pass: "


def render_candidate(task_source: str, pass_name: str) -> str:
    """The full candidate module for ``pass_name`` applied to the reference."""
    p = PASSES[pass_name]
    return f"{_MARK}{p.name} — {p.description}\n{task_source.rstrip()}\n\n{p.render().strip()}\n"


def passes_in(code: str) -> list[str]:
    """Pass names recorded in a candidate's header comment (empty for non-builtin code)."""
    return [line[len(_MARK):].split(" — ")[0].strip() for line in code.splitlines() if line.startswith(_MARK)]


class BuiltinPolicy:
    """No-LLM policy over ``PASSES`` (see module docstring).  ``device`` decides CUDA-only passes."""

    name = "builtin"

    def __init__(self, device: str = "cuda", passes: list[str] | None = None, **_: object) -> None:
        names = passes or list(PASSES)
        unknown = [n for n in names if n not in PASSES]
        if unknown:
            raise ValueError(f"unknown builtin pass(es) {', '.join(unknown)}; known: {', '.join(PASSES)}")
        self.passes = [n for n in names if device == "cuda" or not PASSES[n].cuda_only]
        self._proposed: dict[str, set[str]] = {}

    def generate(self, prompts: list[Prompt], n: int = 1) -> list[list[Completion]]:
        out = []
        for prompt in prompts:
            tried = self._proposed.setdefault(prompt.task_hash, set())
            for code in prompt.exemplar_codes:  # resume: passes already in the pool count as tried
                tried.update(passes_in(code))
            batch = []
            for _ in range(n):
                name = next((p for p in self.passes if p not in tried), None)
                if name is None or not prompt.task_source:
                    batch.append(Completion(text="", policy=self.name, error="builtin: no pass left for this task"))
                    continue
                tried.add(name)
                batch.append(Completion(text=self._response(prompt.task_source, name), policy=self.name,
                                        model="builtin", meta={"passes": [name]}))
            out.append(batch)
        return out

    @staticmethod
    def _response(task_source: str, name: str) -> str:
        p = PASSES[name]
        return (f"## Performance Analysis\nBuiltin pass `{name}`: {p.description}.\n\n"
                f"## Algorithm Design\nKeep the reference computation; change how it is executed.\n\n"
                f"## Code Implementation\n```python\n{render_candidate(task_source, name)}```\n")

    def close(self) -> None:
        return None
