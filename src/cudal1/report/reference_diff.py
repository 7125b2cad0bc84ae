"""A candidate's code against its reference's, for technique labels: the operations each
performs, what the candidate still inherits, and how their matrix products nest.

Contract: :func:`reference_rules` adds ``algebraic_shortcut`` (a heavy operation of the
reference dropped with no custom kernel taking it over, or a chain of products nested the other
way) and ``pytorch_rewrite`` (different PyTorch operations) to an evidence collector
(anything with ``add(technique, line_or_text)``); evidence from the reference is prefixed
``reference:``.  Code identical to the reference's (the same top-level statement) is not the
candidate's own.  Also the small AST helpers the technique rules share (:func:`dotted`,
:func:`op_name`).  Static only; nothing runs.
"""

from __future__ import annotations

import ast
import functools
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

FUSED_CALLS = {"addmm", "baddbmm", "addbmm", "addmv", "addcmul", "addcdiv", "scaled_dot_product_attention"}


# operations whose removal relative to the reference signals an algebraic shortcut


_HEAVY_OPS = {"matmul", "mm", "bmm", "einsum", "diag", "diag_embed", "linear", "conv1d", "conv2d", "conv3d",
              "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "sum", "mean", "softmax", "log_softmax",
              "exp", "repeat", "expand", "clone", "transpose", "permute", "cumsum", "cumprod", "triu", "tril",
              "max", "min", "norm", "var", "std", "maxpool2d", "avgpool2d", "addmm", "baddbmm", "addbmm",
              "scaled_dot_product_attention"}


def dotted(node: ast.AST) -> str:
    """``torch.cuda.CUDAGraph`` for an attribute chain, ``x.sum`` for a method call on a name
    (the receiver kept), '' for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    elif isinstance(node, ast.Call):
        parts.append(dotted(node.func) + "()")
    else:
        parts.append("?")
    return ".".join(reversed(parts))


def op_name(call: ast.Call) -> str:
    """The operation a call performs, receiver dropped: ``torch.matmul`` → ``matmul``."""
    name = dotted(call.func)
    return name.rsplit(".", 1)[-1]


@functools.lru_cache(maxsize=8)


def walk(tree: ast.Module) -> tuple[ast.AST, ...]:
    """All nodes of ``tree`` (one walk shared by the rules; trees are cached by identity)."""
    return tuple(ast.walk(tree))


def parse_source(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def _node_key(node: ast.stmt) -> tuple:
    """Identity of a top-level statement for matching against the reference (cheap; the AST
    dump decides only between statements with equal keys)."""
    name = getattr(node, "name", None)
    if name is None and isinstance(node, ast.Assign):
        name = tuple(dotted(t) for t in node.targets)
    return (type(node).__name__, name)


@dataclass(frozen=True)


class _Reference:
    tree: ast.Module
    lines: tuple[str, ...]
    dumps: dict  # _node_key -> set of AST dumps of the reference's top-level statements
    ops: Counter
    where: dict
    class_ops: dict  # class name -> operations of its body


@functools.lru_cache(maxsize=256)


def reference_of(source: str) -> _Reference | None:
    tree = parse_source(source)
    if tree is None:
        return None
    dumps: dict[tuple, set[str]] = {}
    for n in tree.body:
        dumps.setdefault(_node_key(n), set()).add(ast.dump(n))
    ops, where = _forward_ops(tree)
    class_ops = {
        n.name: _forward_ops(ast.Module(body=[n], type_ignores=[]))[0] for n in tree.body if isinstance(n, ast.ClassDef)
    }
    return _Reference(tree, tuple(source.splitlines()), dumps, ops, where, class_ops)


def _shared_with(ref: _Reference) -> Callable[[ast.stmt], bool]:
    return lambda n: _node_key(n) in ref.dumps and ast.dump(n) in ref.dumps[_node_key(n)]


def _forward_ops(
    tree: ast.Module | None, skip: Callable[[ast.stmt], bool] = lambda n: False
) -> tuple[Counter, dict[str, int]]:
    """Operations the program performs (calls and ``@``), leaving out top-level statements for
    which ``skip`` holds (code shared with the reference); with the first line of each."""
    ops: Counter = Counter()
    where: dict[str, int] = {}
    if tree is None:
        return ops, where
    modules = _module_types(tree)
    for top in tree.body:
        if skip(top):
            continue
        for node in ast.walk(top):
            name = None
            if isinstance(node, ast.Call):
                name = op_name(node)
                target = dotted(node.func)
                if target.startswith("self.") and target.count(".") == 1:  # a submodule call: its type
                    name = modules.get(name, "module:" + name)
                elif name[:1].isupper():  # a constructor, not an operation
                    name = None
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                name = "matmul"
            if name:
                ops[name] += 1
                where.setdefault(name, node.lineno)
    return ops, where


def _module_types(tree: ast.Module) -> dict[str, str]:
    """``self.fc = nn.Linear(...)`` → {"fc": "linear"}: submodule calls are named by their type."""
    out = {}
    for node in walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            kind = op_name(node.value)
            for t in node.targets:
                if (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                    and kind[:1].isupper()
                ):
                    out[t.attr] = kind.lower()
    return out


def _inherited(tree: ast.Module | None, ref_tree: ast.Module | None) -> set[str]:
    """Reference classes whose forward a candidate class still runs: subclassed without
    overriding forward, or with a forward that calls ``super().forward`` / ``Base.forward``."""
    if tree is None or ref_tree is None:
        return set()
    ref_classes = {n.name for n in ref_tree.body if isinstance(n, ast.ClassDef)}
    out = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id in ref_classes:
            out.add(node.value.id)  # ModelNew = Model
        if isinstance(node, ast.ClassDef):
            overrides = any(isinstance(b, ast.FunctionDef) and b.name == "forward" for b in node.body)
            for base in node.bases:
                if not (isinstance(base, ast.Name) and base.id in ref_classes):
                    continue
                delegates = any(isinstance(n, ast.Attribute) and n.attr == "forward" and (
                    dotted(n.value) in ("super()", base.id)) for n in ast.walk(node))
                if not overrides or delegates:  # runs the base's forward (possibly compiled or captured)
                    out.add(base.id)
    return out


def _forward_of(tree: ast.Module | None, class_name: str) -> ast.FunctionDef | None:
    """The ``forward`` method defined in class ``class_name`` at module level (None if not there)."""
    for node in tree.body if tree is not None else []:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "forward":
                    return fn
    return None


def _is_matmul(node: ast.AST) -> bool:
    return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult)) or (
        isinstance(node, ast.Call) and op_name(node) in ("matmul", "mm", "bmm"))


def _matmul_operands(node: ast.AST) -> tuple[ast.AST, ast.AST] | None:
    if isinstance(node, ast.BinOp):
        return node.left, node.right
    args = getattr(node, "args", [])
    return (args[0], args[1]) if len(args) >= 2 else None


def _association(fn: ast.FunctionDef) -> tuple[Counter, dict[tuple[bool, bool], int]]:
    """How the products of a forward nest: for each matrix product, whether its left and right
    operands are themselves products (through local variables: ``t = a @ b; t @ x``), counted,
    with a line for each kind."""
    products: set[str] = set()  # local names holding a product
    shapes: Counter = Counter()
    where: dict[tuple[bool, bool], int] = {}

    def product(operand: ast.AST) -> bool:
        return _is_matmul(operand) or (isinstance(operand, ast.Name) and operand.id in products)

    for stmt in fn.body:
        for node in ast.walk(stmt):
            if _is_matmul(node) and (ops := _matmul_operands(node)) is not None:
                kind = (product(ops[0]), product(ops[1]))
                shapes[kind] += 1
                where.setdefault(kind, node.lineno)
        if isinstance(stmt, ast.Assign) and any(_is_matmul(n) for n in ast.walk(stmt.value)):
            products.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
    return shapes, where


def _reassociation(ev: Any, tree: ast.Module | None, ref: _Reference) -> None:
    """The same number of matrix products as the reference's forward, nested the other way
    (``(A @ B) @ X`` become ``A @ (B @ X)``): an algebraic shortcut by associativity."""
    mine, theirs = _forward_of(tree, "ModelNew"), _forward_of(ref.tree, "Model")
    if mine is None or theirs is None:
        return
    (own, own_where), (base, base_where) = _association(mine), _association(theirs)
    if sum(own.values()) < 2 or sum(own.values()) != sum(base.values()) or own == base:
        return
    for kind in base:
        if own[kind] < base[kind]:
            ev.add("algebraic_shortcut", "reference: " + ref.lines[base_where[kind] - 1].strip())
    for kind in own:
        if own[kind] > base[kind]:
            ev.add("algebraic_shortcut", own_where[kind])


def reference_rules(ev: Any, tree: ast.Module | None, ref_source: str, custom: bool) -> None:
    ref = reference_of(ref_source)
    if tree is None or ref is None or custom:  # a custom kernel takes over operations: nothing to infer
        return
    inherited = _inherited(tree, ref.tree)
    own_ops, own_where = _forward_ops(tree, _shared_with(ref))
    for name in inherited:  # a subclass still running the base's forward performs its operations
        own_ops.update(ref.class_ops.get(name, {}))
    heavy = lambda ops: sum(n for op, n in ops.items() if op in _HEAVY_OPS)  # noqa: E731
    dropped = [op for op in ref.ops if op in _HEAVY_OPS and own_ops[op] < ref.ops[op]]
    if dropped and heavy(own_ops) < heavy(ref.ops):
        for op in dropped:
            ev.add("algebraic_shortcut", "reference: " + ref.lines[ref.where[op] - 1].strip())
        for op, n in sorted(own_where.items(), key=lambda kv: kv[1]):
            if op in _HEAVY_OPS or op in FUSED_CALLS:
                ev.add("algebraic_shortcut", n)
    _reassociation(ev, tree, ref)
    changed = {op for op in set(ref.ops) | set(own_ops) if ref.ops[op] != own_ops[op]} - {
        "compile",
        "super",
        "__init__",
    }
    if changed and not inherited:
        for op in sorted(changed, key=lambda o: own_where.get(o, 1 << 30)):
            if op in own_where:
                ev.add("pytorch_rewrite", own_where[op])
