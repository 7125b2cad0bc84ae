"""Turn a rewritten fx graph into a readable ``ModelNew(Model)`` class.

Contract: :func:`emit_class` returns Python source for a subclass of the task's ``Model`` whose
``forward`` is the rewritten graph's code (``torch.fx`` codegen: one statement per operation,
named after the operation), so the reference's ``__init__``, parameters and submodules are reused
unchanged.  Values that depend only on parameters and buffers (folded weights, pre-multiplied
matrices) are *hoisted*: computed by ``_cudal1_fold`` under ``no_grad`` (in float64, then cast back
to the parameters' dtype, so folding adds no rounding of its own) and recomputed whenever a
parameter they come from is moved, cast or updated in place (keyed on ``data_ptr`` and the
tensor's version counter), never on the inputs.  The module imports nothing from cudal1.
Raises :class:`EmitFailed` when the code needs a global it cannot import by name.
"""

from __future__ import annotations

import ast
import builtins
import keyword
import math
import re
import textwrap
from typing import Any

import torch
import torch.fx as fx

from cudal1.rewrite.graph.patterns import CHEAP, is_inplace, module_of, op_name
from cudal1.rewrite.graph.trace import dtype, is_constant, reset_constant_memo


class EmitFailed(Exception):
    """The rewritten graph cannot be written as standalone source."""


# Globals torch.fx codegen may reference, and how the generated module gets them.
_KNOWN_GLOBALS = {
    "torch": "import torch",
    "inf": "from math import inf",
    "nan": "from math import nan",
    "NoneType": "NoneType = type(None)",
    "device": "from torch import device",
    "fx_pytree": "import torch.fx._pytree as fx_pytree",
    "pytree": "import torch.utils._pytree as pytree",
    "operator": "import operator",
    "math": "import math",
}
_BUILTIN_NAMES = {"getattr", "len", "slice", "int", "float", "bool", "range", "tuple", "list", "abs", "min", "max"}


def _removable(node: fx.Node) -> bool:
    if node.users or is_inplace(node):
        return False
    if node.op in ("call_function", "call_method", "get_attr"):
        return True
    if node.op == "call_module":  # stateless modules only (BatchNorm's running stats are buffers)
        mod = module_of(node)
        return not any(True for _ in mod.buffers()) and not getattr(mod, "inplace", False)
    return False


def eliminate_dead_code(graph: fx.Graph) -> None:
    """Remove unused pure nodes (never in-place operations or stateful module calls)."""
    changed = True
    while changed:
        changed = False
        for node in reversed(list(graph.nodes)):
            if _removable(node):
                graph.erase_node(node)
                changed = True
    reset_constant_memo(graph)


def attr_expr(root: str, target: str) -> str:
    expr = root
    for atom in target.split("."):
        expr = f"{expr}.{atom}" if atom.isidentifier() and not keyword.iskeyword(atom) else f"getattr({expr}, {atom!r})"
    return expr


def _hoist_frontier(graph: fx.Graph) -> list[fx.Node]:
    """Constant nodes feeding the input-dependent part, whose constant subgraph does real work."""
    reset_constant_memo(graph)
    frontier = []
    for node in graph.nodes:
        if node.op == "get_attr" or not is_constant(node):
            continue
        if not any(not is_constant(u) or u.op == "output" for u in node.users):
            continue
        if _does_work(node):
            frontier.append(node)
    return frontier


def _does_work(node: fx.Node, seen: set | None = None) -> bool:
    seen = set() if seen is None else seen
    if node in seen or node.op == "get_attr":
        return False
    seen.add(node)
    if op_name(node) not in CHEAP:
        return True
    return any(_does_work(a, seen) for a in node.all_input_nodes)


def _imports(globals_: dict[str, Any], task_globals: dict[str, Any], defined: frozenset = frozenset()) -> list[str]:
    lines = []
    for name, obj in globals_.items():
        if name in _BUILTIN_NAMES and getattr(builtins, name, None) is obj:
            continue
        if name in defined:
            continue  # defined by the prelude
        if task_globals.get(name) is obj:
            continue  # defined or imported by the task source, which the candidate includes
        if name in _KNOWN_GLOBALS:
            lines.append(_KNOWN_GLOBALS[name])
        elif isinstance(obj, float) and (math.isinf(obj) or math.isnan(obj)):
            lines.append(f"{name} = float({str(obj)!r})")
        else:
            mod, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
            if not mod or not qual or "<" in qual or mod.startswith("task"):
                raise EmitFailed(f"generated code needs {name!r} ({obj!r}), which cannot be imported by name")
            lines.append(f"from {mod} import {qual} as {name}" if "." not in qual else f"import {mod}")
    return sorted(set(lines))


# fx spells some functions by their C binding; write the public names a person would.
_READABLE = {
    "torch._C._nn.linear(": "torch.nn.functional.linear(",
    "torch._C._nn.scaled_dot_product_attention(": "torch.nn.functional.scaled_dot_product_attention(",
}


def _readable(code: str) -> str:
    for old, new in _READABLE.items():
        code = code.replace(old, new)
    return code


def _split_def(code: str) -> tuple[str, list[str]]:
    """("def forward(...):", body lines) without fx's wrap() prologue or blank trailing lines."""
    lines = [ln.rstrip() for ln in _readable(code).splitlines()]
    lines = [ln for ln in lines if ln.strip() and not ln.strip().startswith("torch.fx._symbolic_trace.wrap(")]
    start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("def "))
    return lines[start].strip(), lines[start + 1:]


def _function_body(code: str) -> list[str]:
    return _split_def(code)[1]


def _prelude_names(prelude: list[str]) -> frozenset:
    """Top-level names the prelude sources (``gm.meta["cudal1_prelude"]``) define or import."""
    names = set()
    for node in (n for src in prelude for n in ast.parse(src).body):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return frozenset(names)


def _used(globals_: dict[str, Any], text: str) -> dict[str, Any]:
    return {k: v for k, v in globals_.items() if re.search(rf"(?<![\w.]){re.escape(k)}\b", text)}


def emit_class(gm: fx.GraphModule, task_globals: dict[str, Any], notes: list[str], passes: list[str]) -> str:
    graph = gm.graph
    frontier = _hoist_frontier(graph)
    fold_src, sources = "", []
    if frontier:
        fold = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        param_dtype = None  # the parameters' dtype *now* (the model may have been cast since tracing)
        for node in graph.nodes:  # copy the constant subgraph feeding the frontier, in order
            if is_constant(node) and node.op != "output" and _feeds(node, frontier):
                env[node] = fold.node_copy(node, lambda n: env[n])
                if node.op == "get_attr" and _narrow_float(node):  # fold in float64: no extra rounding
                    if param_dtype is None:
                        param_dtype = fold.call_function(builtins.getattr, (env[node], "dtype"))
                    env[node] = fold.call_method("double", (env[node],))
        outs = [fold.call_method("to", (env[n], param_dtype)) if _narrow_float(n) and param_dtype is not None
                else env[n] for n in frontier]
        fold.output(tuple(outs))
        # the refresh key: every parameter or buffer the folded values come from, plus the ones a
        # pass names (``cudal1_refresh_keys``: e.g. a BatchNorm's batch counter, whose in-place
        # increment marks a running-statistics update that leaves their own version counters alone)
        extra = [k for k in getattr(gm, "meta", {}).get("cudal1_refresh_keys", []) if _has_attr(gm, k)]
        sources = sorted({n.target for n in fold.nodes if n.op == "get_attr"} | set(extra))
        fold_code = fold.python_code(root_module="self")
        fold_globals = dict(fold_code.globals)
        fold_src = "\n".join(_function_body(fold_code.src))
        for i, node in enumerate(frontier):
            with graph.inserting_before(node):
                ref = graph.get_attr(f"_cudal1_c{i}")
            node.replace_all_uses_with(ref)
        eliminate_dead_code(graph)
    else:
        fold_globals = {}
    code = graph.python_code(root_module="self")
    signature, body = _split_def(code.src)
    # Prelude (module-level source from passes, e.g. Triton kernels): fx names a prelude function
    # after its module; call it by the name the prelude defines.
    prelude = list(getattr(gm, "meta", {}).get("cudal1_prelude", []))
    defined = _prelude_names(prelude)
    for name, obj in code.globals.items():
        own = getattr(obj, "__name__", None)
        if name not in defined and own in defined and callable(obj):
            body = [re.sub(rf"(?<![\w.]){re.escape(name)}\b", own, ln) for ln in body]
    guards = list(getattr(gm, "meta", {}).get("cudal1_eval_guards", []))
    if guards:  # rewrites valid in eval mode only (folded BatchNorm): training mode runs the reference
        params = ", ".join(str(n.target) for n in graph.nodes if n.op == "placeholder")
        cond = " or ".join(f"{attr_expr('self', g)}.training" for g in guards)
        body = [f"    if {cond}:", f"        return super().forward({params})"] + body
    text = signature + "\n" + "\n".join(body) + "\n" + fold_src  # annotations in the signature need imports too
    imports = _imports(_used({**fold_globals, **code.globals}, text), task_globals, defined)
    imports = [ln for ln in imports if not any(ln in src.splitlines() for src in prelude)]

    doc = [f"Graph rewrite of Model.forward (cudal1 builtin: {', '.join(passes)})."]
    doc += [""] + [f"- {n}" for n in notes]
    if frontier:
        doc += ["", "Weights derived from parameters are computed once (``_cudal1_fold``) and again",
                "whenever a parameter they come from is moved, cast or updated in place."]
    out = ["class ModelNew(Model):", '    """' + doc[0]]
    out += [("    " + d) if d else "" for d in doc[1:]]
    out += ['    """', ""]
    if frontier:
        names = ", ".join(f"self._cudal1_c{i}" for i in range(len(frontier))) + ("," if len(frontier) == 1 else "")
        key = ", ".join(f"{attr_expr('self', s)}.data_ptr(), {attr_expr('self', s)}._version" for s in sources)
        out += [
            "    def _cudal1_fold(self):",
            '        """Parameter-only values the forward uses (no inputs involved)."""',
        ]
        out += ["    " + ln for ln in fold_src.splitlines()]
        out += ["", "    def _cudal1_refresh(self):",
                "        key = (" + key + ("," if len(sources) == 1 else "") + ")",
                '        if getattr(self, "_cudal1_key", None) != key:',
                "            with torch.no_grad():",
                f"                {names} = self._cudal1_fold()",
                "            self._cudal1_key = key", ""]
        at = 2 if guards else 0  # the eval-mode guard first: training mode needs no folded weights
        body = body[:at] + ["    self._cudal1_refresh()"] + body[at:]
    out += ["    " + signature] + ["    " + ln for ln in body]
    top = imports + ([""] if imports else [])
    for src in prelude:
        top += [src, "", ""]
    return "\n".join(top + out) + "\n"


def _has_attr(gm: fx.GraphModule, target: str) -> bool:
    obj = gm
    for atom in target.split("."):
        obj = getattr(obj, atom, None)
    return isinstance(obj, torch.Tensor)


def _narrow_float(node: fx.Node) -> bool:
    d = dtype(node)
    return d is not None and d.is_floating_point and d != torch.float64


def _feeds(node: fx.Node, frontier: list[fx.Node]) -> bool:
    """Whether ``node`` is (an ancestor of) a frontier node."""
    targets = set(frontier)
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if n in targets:
            return True
        if n in seen:
            continue
        seen.add(n)
        stack.extend(u for u in n.users if is_constant(u))
    return False


def indent(text: str, n: int = 4) -> str:
    return textwrap.indent(text, " " * n)
