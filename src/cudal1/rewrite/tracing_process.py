"""The tracing process: trace a task, apply rewrites, emit and check ``ModelNew``.

Protocol: reads one JSON object ``{"source": str, "variants": [[names], ...]}`` from stdin and
writes one JSON object to stdout, ``{"outcomes": [...]}``, one per variant (each traced afresh):
``{"ok": bool, "class_source": str, "applied": [names], "notes": {name: [str]}, "declined": {name:
reason}, "error": str}``.  Task code is untrusted: this module runs
only in a child process started by :func:`cudal1.rewrite.rewrite_task`, on the meta device
(no GPU is touched, no real memory is allocated for weights or inputs).  A rewrite that breaks
tracing, shape propagation, code generation, or changes the output's shapes/dtypes on the meta
inputs is dropped (recorded in ``declined``), never returned.
"""

from __future__ import annotations

import copy
import json
import linecache
import sys
import types
import warnings
from typing import Any


def _shapes(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return [list(value.shape), str(value.dtype)]
    if isinstance(value, (list, tuple)):
        return [_shapes(v) for v in value]
    return repr(type(value))


class Session:
    """One task traced once for every pass list asked of it: each list starts from the stored state
    after the longest prefix already computed (e.g. the algebraic passes every variant shares), so
    tracing and shape propagation — slow for models whose meta-device forward is long, such as
    recurrent ones — are paid once, not once per variant."""

    def __init__(self, source: str) -> None:
        from cudal1.rewrite.graph.trace import TraceFailed, trace_task

        self.source = source
        self.error = ""
        self.traced = None
        self.states: dict[tuple[str, ...], tuple[Any, dict[str, Any]]] = {}  # passes run -> (gm, result so far)
        self.expected: Any = None  # the reference's output shapes on the meta device, once computed
        try:
            self.traced = trace_task(source)
        except TraceFailed as exc:
            self.error = str(exc)
            return
        self.states[()] = (self.traced.gm, {"applied": [], "notes": {}, "declined": {}})

    def run(self, passes: list[str]) -> dict[str, Any]:
        from cudal1.rewrite.graph.emit import EmitFailed, emit_class
        from cudal1.rewrite.registry import REWRITES

        result: dict[str, Any] = {"ok": False, "class_source": "", "applied": [], "notes": {}, "declined": {},
                                  "error": ""}
        unknown = [p for p in passes if p not in REWRITES]
        if unknown:
            result["error"] = f"unknown rewrite(s): {', '.join(unknown)}"
            return result
        if self.traced is None:
            result["error"] = self.error
            return result
        order = [p for p in REWRITES if p in passes]  # registry order
        done = max((k for k in self.states if tuple(order[:len(k)]) == k), key=len)
        gm, so_far = self.states[done]
        gm = copy.deepcopy(gm)
        result.update(copy.deepcopy(so_far))
        for i in range(len(done), len(order)):
            gm = self._apply(gm, order[i], result)
            self.states[tuple(order[:i + 1])] = (copy.deepcopy(gm), copy.deepcopy(
                {k: result[k] for k in ("applied", "notes", "declined")}))
        if not result["applied"]:
            result["error"] = "no rewrite applies"
            return result
        notes = [n for p in result["applied"] for n in result["notes"][p]]
        try:
            class_source = emit_class(gm, self.traced.module.__dict__, notes, result["applied"])
        except EmitFailed as exc:
            result["error"] = str(exc)
            return result
        problem = self.check(class_source)
        if problem:
            result["error"] = f"rewritten model failed its meta-device check: {problem}"
            return result
        result.update(ok=True, class_source=class_source)
        return result

    def _apply(self, gm: Any, name: str, result: dict[str, Any]) -> Any:
        """``gm`` after rewrite ``name`` (a copy when it rewrote something; ``gm`` itself when it
        declined or broke the graph, which is then recorded in ``result["declined"]``)."""
        from cudal1.rewrite.graph.trace import propagate_shapes
        from cudal1.rewrite.registry import REWRITES

        work = copy.deepcopy(gm)
        try:
            notes = REWRITES[name].run(work)
            if notes:  # a pass that declined left the graph as it was: no need to look again
                work.graph.lint()
                work.recompile()
                propagate_shapes(work, self.traced.inputs)
        except Exception as exc:  # noqa: BLE001 - a broken rewrite is declined, never emitted
            result["declined"][name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            return gm
        if not notes:
            result["declined"][name] = "pattern not present"
            return gm
        result["applied"].append(name)
        result["notes"][name] = notes
        return work

    def check(self, class_source: str) -> str:
        """Run reference and candidate on the meta device; '' when output shapes and dtypes agree."""
        import torch

        from cudal1.rewrite.graph.trace import load_task_module

        try:
            ref = load_task_module(self.source, "reference")
            cand = types.ModuleType("candidate")
            text = self.source + "\n\n" + class_source
            linecache.cache["<candidate>"] = (
                len(text), None, text.splitlines(True), "<candidate>",
            )  # @triton.jit reads it
            exec(compile(text, "<candidate>", "exec", dont_inherit=True), cand.__dict__)  # noqa: S102
            with torch.device("meta"):
                init = ref.get_init_inputs()
                inputs = ref.get_inputs()
                if self.expected is None:
                    self.expected = _shapes(ref.Model(*init)(*inputs))
                got = cand.ModelNew(*init)(*inputs)
                again = cand.ModelNew(*init)(*inputs)
        except Exception as exc:  # noqa: BLE001
            return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        if self.expected != _shapes(got) or _shapes(got) != _shapes(again):
            return f"outputs differ in shape/dtype: {self.expected} vs {_shapes(got)}"
        return ""


def run(source: str, passes: list[str]) -> dict[str, Any]:
    """One pass list on one task (see :class:`Session` for several)."""
    return Session(source).run(passes)


def main() -> None:
    warnings.simplefilter("ignore")
    request = json.loads(sys.stdin.read())
    outcomes = []
    session = Session(request["source"])
    for passes in request["variants"]:
        try:
            outcomes.append(session.run(list(passes)))
        except Exception as exc:  # noqa: BLE001 - always answer in JSON
            outcomes.append({"ok": False, "class_source": "", "applied": [], "notes": {}, "declined": {},
                             "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    sys.stdout.write(json.dumps({"outcomes": outcomes}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
