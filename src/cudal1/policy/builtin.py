"""The builtin policy: no LLM, proposes verified-rewrite candidates as readable source.

Contract: ``BuiltinPolicy.generate(prompts, n)`` returns, for each prompt, ``n``
:class:`~cudal1.policy.base.Proposal` objects: ``code`` is the candidate module (judged like any
other candidate, nothing parsed), ``text`` a short account of the passes and what they rewrote.
Prompts are :class:`~cudal1.policy.base.PoolPrompt` objects (the search loop's): the reference
source and the verified pool, with the reference anchor marked.  Each proposal applies one named
pass from ``PASSES`` (a registry; unknown names fail loudly) to a *base*: a pool candidate ranked
above the reference anchor that was itself built by this policy (passes compose across rounds:
e.g. ``algebraic`` then ``compile-default`` on top), else the reference.  A pass may decline a
task (pattern absent, not a CUDA device, not a convolution model); once every applicable (base,
pass) pair was proposed the completion is an error ``"builtin: no pass left"``.  What was
proposed is read back from the pool candidates' header comments, so a resumed run does not
repeat itself.  With the reference's measured class (``PoolPrompt.reference_class``, from
``optimize --profile``) the passes are tried in the order that class asks for (:func:`ordered_for`;
a compute-bound reference whose kernel time is mostly convolutions, ``PoolPrompt.reference_work``,
gets the convolution passes first).

Generated modules are plain Python a person could keep: the reference source unchanged, then one
``ModelNew`` class per pass (each subclassing the previous stage), with a header comment naming the
passes; they import nothing from cudal1.

Passes and their kinds are :mod:`cudal1.policy.builtin_passes`'s: ``graph`` passes rewrite the
traced reference (torch.fx, in a child process; see :mod:`cudal1.rewrite`) and apply to the
reference only (``algebraic``; ``triton-fusion``, ``gemm-3xtf32`` and ``triton-reduce``, the same
rewrites plus generated Triton kernels, each a separate candidate so the judge decides whether its
kernels win); ``layout`` passes (channels_last, scoped cuDNN autotuning) may stack under one
``exec`` pass (torch.compile modes, Inductor setting sets ``inductor[...]``, CUDA-graph capture,
a compiled forward inside one CUDA graph), which always comes last.  ``inductor-search`` in the
pass list is the search over Inductor's settings: on each base chain it proposes the fastest
verified setting set plus one more setting (:func:`_neighbours`), so the sets grow round by round,
each judged like any candidate.
"""

from __future__ import annotations

import os
import threading

from cudal1.compile_modes import INDUCTOR_SETTINGS, inductor_name, inductor_settings
from cudal1.policy.base import PoolPrompt, Proposal, declined_completion
from cudal1.policy.builtin_passes import (
    GRAPH_VARIANTS,
    PASSES,
    Pass,
    pass_named,
    prepare_rewrites,
    rewrite_detail,
    set_rewrite_cache,
)
from cudal1.types import Completion, Prompt

__all__ = ["CLASS_FIRST", "GRAPH_PASSES", "PASSES", "BuiltinPolicy", "Pass", "compose", "ordered_for", "passes_in",
           "prepare_rewrites", "render_candidate", "set_rewrite_cache"]

_MARK = "# cudal1-builtin pass: "
INDUCTOR_SEARCH = "inductor-search"  # the --passes entry that grows Inductor setting sets (see _neighbours)


def passes_in(code: str) -> list[str]:
    """Pass names recorded in a candidate's header comments, in the order they were applied."""
    return [line[len(_MARK):].split(" — ")[0].strip() for line in code.splitlines() if line.startswith(_MARK)]


def _known(name: str) -> Pass | None:
    try:
        return pass_named(name)
    except KeyError:
        return None


def compose(task_source: str, base_code: str | None, pass_name: str) -> str | None:
    """The candidate module applying ``pass_name`` on top of ``base_code`` (a builtin candidate) or
    on the reference when ``base_code`` is None; None when the pass declines."""
    p = pass_named(pass_name)
    chain = passes_in(base_code) if base_code else []
    if not _compatible(chain, pass_name):
        return None
    base_class = f"_Stage{len(chain)}" if chain else "Model"
    cls = p.render(task_source, base_class)
    if cls is None:
        return None
    header = "".join(f"{_MARK}{name} — {_known(name).description}\n"  # type: ignore[union-attr]
                     for name in chain + [pass_name] if _known(name))
    if not chain:
        return f"{header}{task_source.rstrip()}\n\n\n{cls.strip()}\n"
    body = "\n".join(line for line in base_code.splitlines() if not line.startswith(_MARK)).rstrip()
    return f"{header}{body}\n\n\n{base_class} = ModelNew\n\n\n{cls.strip()}\n"


def render_candidate(task_source: str, pass_name: str) -> str | None:
    """``pass_name`` applied to the reference (None when it declines)."""
    return compose(task_source, None, pass_name)


def _compatible(chain: list[str], name: str) -> bool:
    if name in chain or any(p.kind == "exec" for p in map(_known, chain) if p):
        return False  # each pass once; nothing stacks on top of an exec pass
    return pass_named(name).kind != "graph" or not chain


def default_passes() -> list[str]:
    """Every registered pass in registry order, with the Inductor setting search right after the
    single settings it starts from."""
    names = list(PASSES)
    last_single = max(i for i, n in enumerate(names) if inductor_settings(n) is not None)
    return names[:last_single + 1] + [INDUCTOR_SEARCH] + names[last_single + 1:]


def _neighbours(pool: PoolPrompt, chain: tuple[str, ...]) -> list[str]:
    """The Inductor setting search on ``chain``: from the fastest verified ``chain + inductor[S]``
    (faster than ``chain + compile-default`` when that was verified), the sets S plus one more
    setting, in registry order.  Nothing before some single setting has been verified: the singles
    are registry passes of their own.  Greedy forward selection, one setting per step, judged like
    any candidate."""
    measured: dict[tuple[str, ...], float] = {}
    for entry in pool.pool:
        got = passes_in(entry.code)
        if tuple(got[:-1]) != chain or not got or entry.speedup is None:
            continue
        settings = () if got[-1] == "compile-default" else inductor_settings(got[-1]) if got[-1].startswith(
            "inductor[") else None
        if settings is not None:
            measured[settings] = max(entry.speedup, measured.get(settings, 0.0))
    best = max(measured, key=measured.__getitem__, default=())
    if not best:
        return []
    return [inductor_name(set(best) | {s}) for s in INDUCTOR_SETTINGS if s not in best]


# The pass order a measured reference class asks for (docs/builtin.md, "The order follows the
# profile"): these passes come right after ``algebraic`` (fewer FLOPs help whatever bounds the
# call), the rest keep the registry's order.  A class not listed (``mixed``) or an unmeasured
# reference keeps the registry's order.  ``CLASS/WORK`` keys refine a class by what the kernel
# time goes to (cudal1.profile.rules.main_work): a compute-bound convolution is not a matmul.
CLASS_FIRST: dict[str, tuple[str, ...]] = {
    "launch-bound": ("cudagraph", "compile-cudagraph", "compile-reduce-overhead", "triton-fusion", "compile-default"),
    "memory-bound": ("triton-fusion", "triton-reduce", "compile-default", "inductor[cd]", "channels-last"),
    "compute-bound": ("gemm-3xtf32", "inductor[gemm]", "compile-max-autotune-no-cudagraphs", "cudnn-autotune"),
    # cuDNN's algorithm choice, then fusing the convolution's elementwise tail, then the layout
    "compute-bound/conv": ("cudnn-autotune", "compile-default", "channels-last", "compile-max-autotune-no-cudagraphs",
                           "gemm-3xtf32", "inductor[gemm]"),
}

# Passes whose gain is CUDA-graph replay.  The judge's GPU figure is taken with the whole call
# enqueued behind its gate, so host launch latency is already outside it; a graph can only remove
# the device's own gap between launches, and it adds a copy of every input into its static
# buffers.  That pays where the reference is a train of short kernels (``launch-bound``), not where
# its kernels keep the device busy: there these passes come last (after the registry's others).
GRAPH_PASSES = ("cudagraph", "compile-cudagraph", "compile-reduce-overhead", "compile-max-autotune")
GRAPHS_LAST = ("memory-bound", "compute-bound")
# The pass that fuses an elementwise chain into one kernel: first where the reference's profile
# shows one holding a fifth of the kernel time (ordered_for's "+tail").
FUSION_PASS = "triton-fusion"


def ordered_for(passes: list[str], reference_class: str, work: str = "") -> list[str]:
    """``passes`` in the order the reference's measured class asks for (:data:`CLASS_FIRST`, the
    ``class/work`` entry where there is one, else the class's): ``algebraic`` first, then the
    entry's passes that are in ``passes``, then the rest in their given order, the
    :data:`GRAPH_PASSES` among them last for a class in :data:`GRAPHS_LAST`.  A ``+tail`` in
    ``work`` (a fusible elementwise chain, :func:`cudal1.profile.rules.work_of`) puts
    ``triton-fusion`` right after ``algebraic`` for every measured class but ``launch-bound``
    (whose time is in the gaps, not the kernels).  The same list, in the same order, for an
    unlisted or empty class without a tail."""
    main, _, tail = work.partition("+")
    first = CLASS_FIRST.get(f"{reference_class}/{main}") or CLASS_FIRST.get(reference_class) or ()
    if tail == "tail" and reference_class and reference_class != "launch-bound":
        first = (FUSION_PASS,) + tuple(n for n in first if n != FUSION_PASS)
    if not first:
        return list(passes)
    head = [n for n in ("algebraic",) + first if n in passes]
    rest = [n for n in passes if n not in head]
    if reference_class in GRAPHS_LAST:
        rest = [n for n in rest if n not in GRAPH_PASSES] + [n for n in rest if n in GRAPH_PASSES]
    return head + rest


def check_passes(names: list[str]) -> None:
    """``ValueError`` naming the known passes when a name in ``names`` is not one."""
    unknown = [n for n in names if n != INDUCTOR_SEARCH and _known(n) is None]
    if unknown:
        raise ValueError(f"unknown builtin pass(es) {', '.join(unknown)}; known: {', '.join(default_passes())}, "
                         "inductor[SETTING,...] (settings: " + ", ".join(INDUCTOR_SETTINGS) + ")")


class BuiltinPolicy:
    """No-LLM policy over ``PASSES`` (see module docstring).  ``device`` decides CUDA-only passes;
    ``rewrite_cache``: where graph rewrites are cached (default: the user cache)."""

    name = "builtin"
    # Round 1 applies each pass to the reference (no base above the anchor yet), and the pass order
    # reads only the recorded profiles: the anchors' verdicts may come in round 1's batch.
    first_round_blind = True

    def __init__(self, device: str = "cuda", passes: list[str] | None = None, workers: int | None = None,
                 rewrite_cache: str | None = None, **_: object) -> None:
        names = passes or default_passes()
        check_passes(names)
        self.device = device
        self.passes = [n for n in names if device == "cuda" or not (n == INDUCTOR_SEARCH or pass_named(n).cuda_only)]
        self.workers = max(1, workers or (os.cpu_count() or 2) // 2)  # tracing children at once
        if rewrite_cache:
            set_rewrite_cache(rewrite_cache)
        self._proposed: dict[str, set[tuple[str, ...]]] = {}
        self._lock = threading.Lock()

    def compiles(self) -> bool:
        """Whether some pass it may propose runs torch.compile in the judge's workers (minutes of
        CPU-bound compilation per candidate, which more workers per GPU overlap with timing)."""
        return any(n == INDUCTOR_SEARCH or n.startswith(("compile-", "inductor[")) for n in self.passes)

    def settings(self) -> dict[str, object]:
        """What a run saves about this policy: the device and the passes it may propose, in order."""
        return {"device": self.device, "passes": list(self.passes)}

    def generate(self, prompts: list[Prompt], n: int = 1) -> list[list[Completion]]:
        sources = list({p.task_source: None for p in prompts if p.task_source})
        variants = [v for v in GRAPH_VARIANTS if v in self.passes]
        if variants:  # trace every distinct task once, in parallel child processes
            prepare_rewrites(sources, self.workers, variants)
        return [[self._next(prompt) for _ in range(n)] for prompt in prompts]

    @staticmethod
    def _pool(prompt: Prompt) -> PoolPrompt:
        return prompt if isinstance(prompt, PoolPrompt) else PoolPrompt.of(prompt)

    @staticmethod
    def _bases(prompt: PoolPrompt) -> list[str | None]:
        """Builtin candidates that beat the reference anchor, best first, then the reference."""
        return [e.code for e in prompt.above_reference() if passes_in(e.code)] + [None]

    def _names(self, prompt: PoolPrompt, chain: tuple[str, ...]) -> list[str]:
        out: list[str] = []
        for name in ordered_for(self.passes, prompt.reference_class, prompt.reference_work):
            out += _neighbours(prompt, chain) if name == INDUCTOR_SEARCH else [name]
        return out

    def _next(self, prompt: Prompt) -> Completion:
        if not prompt.task_source:
            return declined_completion(self.name, "builtin: the prompt carries no task source", "builtin")
        prompt = self._pool(prompt)
        with self._lock:
            tried = self._proposed.setdefault(prompt.task_hash, set())
            for entry in prompt.pool:  # resume: chains already in the pool count as tried
                tried.add(tuple(passes_in(entry.code)))
            for base in self._bases(prompt):
                chain = tuple(passes_in(base)) if base else ()
                for name in self._names(prompt, chain):
                    if chain + (name,) in tried:
                        continue
                    code = compose(prompt.task_source, base, name)
                    if code is None:
                        continue
                    tried.add(chain + (name,))
                    return Proposal(text=self._account(prompt.task_source, list(chain) + [name]), code=code,
                                    policy=self.name, model="builtin", meta={"passes": list(chain) + [name]})
        return declined_completion(self.name, "builtin: no pass left for this task", "builtin")

    @staticmethod
    def _account(task_source: str, chain: list[str]) -> str:
        """What the candidate does, for the record (the run store's response and analysis)."""
        lines = [f"- `{name}`: {pass_named(name).description}." for name in chain]
        for name in chain:
            if name in GRAPH_VARIANTS:
                lines.append(f"- rewrites: {rewrite_detail(task_source, name)}")
        return ("Builtin passes, applied in order:\n" + "\n".join(lines) + "\n"
                "The same function as the reference; each pass changes how it is computed or executed, never what.\n")

    def close(self) -> None:
        return None
