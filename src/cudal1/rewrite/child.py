"""Child-process entry point: trace a task, apply graph passes, emit and check ``ModelNew``.

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


def run(source: str, passes: list[str]) -> dict[str, Any]:
    from cudal1.rewrite.emit import EmitFailed, emit_class
    from cudal1.rewrite.passes import GRAPH_PASSES
    from cudal1.rewrite.trace import TraceFailed, propagate_shapes, trace_task

    result: dict[str, Any] = {"ok": False, "class_source": "", "applied": [], "notes": {}, "declined": {}, "error": ""}
    unknown = [p for p in passes if p not in GRAPH_PASSES]
    if unknown:
        result["error"] = f"unknown graph pass(es): {', '.join(unknown)}"
        return result
    try:
        traced = trace_task(source)
    except TraceFailed as exc:
        result["error"] = str(exc)
        return result
    gm = traced.gm
    for name in [p for p in GRAPH_PASSES if p in passes]:  # registry order
        before = copy.deepcopy(gm)
        try:
            notes = GRAPH_PASSES[name].run(gm)
            gm.graph.lint()
            gm.recompile()
            propagate_shapes(gm, traced.inputs)
        except Exception as exc:  # noqa: BLE001 - a broken rewrite is declined, never emitted
            gm = before
            traced.gm = gm
            result["declined"][name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            continue
        if notes:
            result["applied"].append(name)
            result["notes"][name] = notes
        else:
            result["declined"][name] = "pattern not present"
            gm = before
            traced.gm = gm
    if not result["applied"]:
        result["error"] = "no graph pass applies"
        return result
    notes = [n for p in result["applied"] for n in result["notes"][p]]
    try:
        class_source = emit_class(gm, traced.module.__dict__, notes, result["applied"])
    except EmitFailed as exc:
        result["error"] = str(exc)
        return result
    problem = check_candidate(source, class_source)
    if problem:
        result["error"] = f"rewritten model failed its meta-device check: {problem}"
        return result
    result.update(ok=True, class_source=class_source)
    return result


def check_candidate(source: str, class_source: str) -> str:
    """Run reference and candidate on the meta device; '' when output shapes and dtypes agree."""
    import torch

    from cudal1.rewrite.trace import load_task_module

    try:
        ref = load_task_module(source, "reference")
        cand = types.ModuleType("candidate")
        text = source + "\n\n" + class_source
        linecache.cache["<candidate>"] = (len(text), None, text.splitlines(True), "<candidate>")  # @triton.jit reads it
        exec(compile(text, "<candidate>", "exec", dont_inherit=True), cand.__dict__)  # noqa: S102
        with torch.device("meta"):
            init = ref.get_init_inputs()
            inputs = ref.get_inputs()
            expected = ref.Model(*init)(*inputs)
            got = cand.ModelNew(*init)(*inputs)
            again = cand.ModelNew(*init)(*inputs)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    if _shapes(expected) != _shapes(got) or _shapes(got) != _shapes(again):
        return f"outputs differ in shape/dtype: {_shapes(expected)} vs {_shapes(got)}"
    return ""


def main() -> None:
    warnings.simplefilter("ignore")
    request = json.loads(sys.stdin.read())
    outcomes = []
    for passes in request["variants"]:
        try:
            outcomes.append(run(request["source"], list(passes)))
        except Exception as exc:  # noqa: BLE001 - always answer in JSON
            outcomes.append({"ok": False, "class_source": "", "applied": [], "notes": {}, "declined": {},
                             "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    sys.stdout.write(json.dumps({"outcomes": outcomes}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
