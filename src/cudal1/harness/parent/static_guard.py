"""Static guard: named AST checks over a candidate's source, run before it is ever imported.

Contract: ``run_static_guards(source, names)`` parses the source (never executes it) and returns
:class:`Finding` objects; a finding with ``reject=True`` makes the verdict ``rejected`` with its
flag.  Checks are a registry (``CHECKS``); asking for an unknown name raises ``KeyError``.

Checks look at *what code does to the judge's world* (assigning to ``torch.cuda.synchronize``,
walking ``gc`` or frames, flipping TF32) — not at regexes over text, and not at style.  They are
cheap and certain for the patterns they name and blind to everything else (``getattr`` with a
computed string, ``exec`` of an encoded payload, native code): the runtime guards in the worker
are the second layer.  A check that rejects honest code is a bug: keep each one narrow.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Callable, Iterator

# Dotted names whose rebinding changes how the judge measures or compares.
GUARDED_NAMES = {
    "time.time", "time.perf_counter", "time.perf_counter_ns", "time.monotonic", "time.monotonic_ns",
    "time.process_time", "time.sleep",
    "torch.cuda.synchronize", "torch.cuda.Event", "torch.cuda.Stream", "torch.cuda.current_stream",
    "torch.cuda.default_stream", "torch.cuda.Event.elapsed_time", "torch.cuda.Event.record",
    "torch.allclose", "torch.equal", "torch.isclose", "torch.isnan", "torch.isinf", "torch.testing.assert_close",
    "torch.manual_seed", "torch.cuda.manual_seed", "torch.cuda.manual_seed_all", "torch.seed",
    "torch.randn", "torch.rand", "torch.randint", "torch.empty", "torch.empty_like", "torch.zeros", "torch.clone",
    "torch.Tensor.clone", "torch.Tensor.copy_", "torch.Tensor.__eq__", "torch.Tensor.__sub__", "torch.Tensor.abs",
    "torch.Tensor.to", "torch.Tensor.cuda", "torch.Tensor.cpu", "torch.Tensor.item", "torch.nn.Module.__call__",
    "random.seed", "random.random", "numpy.random.seed",
    "builtins.print", "os._exit", "sys.exit",
}
PRECISION_NAMES = {
    "torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32",
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
    "torch.backends.fp32_precision", "torch.backends.cuda.matmul.fp32_precision", "torch.backends.cudnn.fp32_precision",
}
PRECISION_CALLS = {"torch.set_float32_matmul_precision"}
INTROSPECTION_CALLS = {
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._getframe", "inspect.currentframe",
    "inspect.stack", "inspect.getouterframes", "inspect.trace", "sys.settrace", "sys.setprofile",
    "threading.settrace", "sys.addaudithook",
}
# Attributes that only matter to code walking the interpreter's frames and closures (the judge's
# state lives in the frames below ``forward``), and calls that hand out frames or run code with
# someone else's frame.  Honest kernels never touch them (none in the KernelBench references or
# the CUDA-L1 sample).
FRAME_ATTRS = {
    "f_back", "f_locals", "f_globals", "f_builtins", "tb_frame", "tb_next", "gi_frame", "cr_frame", "ag_frame",
    "gi_yieldfrom", "cell_contents", "__closure__",
}
FRAME_CALLS = {
    "sys._current_frames", "sys._current_exceptions", "traceback.walk_stack", "traceback.walk_tb",
    "inspect.getinnerframes", "logging.currentframe", "signal.signal", "multiprocessing.current_process",
}
FRAME_NAMES = {"ctypes.pythonapi"}


@dataclass(frozen=True)
class Finding:
    check: str
    flag: str
    line: int
    message: str
    reject: bool = True


def dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """``a.b.c`` for an attribute chain, with import aliases resolved (``np`` → ``numpy``)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def import_aliases(tree: ast.AST) -> dict[str, str]:
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


def _assign_targets(tree: ast.AST) -> Iterator[tuple[ast.AST, ast.AST]]:
    """(statement, target) for every assignment, augmented assignment and ``del`` target."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                yield node, t
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            yield node, node.target
        elif isinstance(node, ast.Delete):
            for t in node.targets:
                yield node, t


def _calls(tree: ast.AST, aliases: dict[str, str]) -> Iterator[tuple[ast.Call, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = dotted(node.func, aliases)
            if name:
                yield node, name


def check_timer_tampering(tree: ast.AST, aliases: dict[str, str]) -> list[Finding]:
    out = []
    for stmt, target in _assign_targets(tree):
        name = dotted(target, aliases)
        if name in GUARDED_NAMES:
            out.append(Finding("timer_tampering", "tampering", stmt.lineno, f"rebinds {name}"))
    for call, name in _calls(tree, aliases):
        if name in ("setattr", "builtins.setattr", "object.__setattr__") and len(call.args) >= 2:
            obj = dotted(call.args[0], aliases)
            attr = call.args[1].value if isinstance(call.args[1], ast.Constant) else None
            if obj and isinstance(attr, str) and f"{obj}.{attr}" in GUARDED_NAMES | PRECISION_NAMES:
                out.append(Finding("timer_tampering", "tampering", call.lineno, f"setattr on {obj}.{attr}"))
    return out


def check_introspection(tree: ast.AST, aliases: dict[str, str]) -> list[Finding]:
    out = []
    for call, name in _calls(tree, aliases):
        if name in INTROSPECTION_CALLS:
            out.append(
                Finding(
                    "introspection",
                    "tampering",
                    call.lineno,
                    f"calls {name} (reaching into the judge's objects or frames)",
                )
            )
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.startswith(("cudal1.", "cudal1_candidate", "cudal1_reference"))
        ):
            out.append(Finding("introspection", "tampering", node.lineno, f"names the judge's module {node.value!r}"))
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] + (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            )
            if any(m.split(".")[0] == "cudal1" for m in mods):
                out.append(Finding("introspection", "tampering", node.lineno, "imports the judge (cudal1)"))
    return out


def check_frames(tree: ast.AST, aliases: dict[str, str]) -> list[Finding]:
    """Frame, traceback and closure walking (``exc.__traceback__.tb_frame.f_back.f_locals``),
    thread-frame and signal-handler access, ``ctypes.pythonapi``.  A computed ``getattr`` name
    gets past this check; the worker's audit hook (signing_hook) is the runtime layer."""
    out = []
    for node in ast.walk(tree):
        attr = None
        if isinstance(node, ast.Attribute) and node.attr in FRAME_ATTRS:
            attr = node.attr
        elif (
            isinstance(node, ast.Call)
            and dotted(node.func, aliases) in ("getattr", "builtins.getattr", "setattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in FRAME_ATTRS
        ):
            attr = node.args[1].value
        if attr:
            out.append(Finding("frames", "tampering", node.lineno, f"walks frames or closures ({attr})"))
        elif isinstance(node, ast.Attribute) and dotted(node, aliases) in FRAME_NAMES:
            out.append(Finding("frames", "tampering", node.lineno, f"uses {dotted(node, aliases)}"))
    for call, name in _calls(tree, aliases):
        if name in FRAME_CALLS:
            out.append(
                Finding("frames", "tampering", call.lineno, f"calls {name} (frames of the judge or of other threads)")
            )
    return out


def check_precision(tree: ast.AST, aliases: dict[str, str]) -> list[Finding]:
    out = []
    for stmt, target in _assign_targets(tree):
        name = dotted(target, aliases)
        if name in PRECISION_NAMES:
            out.append(Finding("precision", "precision_downgrade", stmt.lineno, f"sets {name}"))
    for call, name in _calls(tree, aliases):
        if name in PRECISION_CALLS:
            out.append(Finding("precision", "precision_downgrade", call.lineno, f"calls {name}"))
    return out


def check_pytorch_fallback(tree: ast.AST, aliases: dict[str, str]) -> list[Finding]:
    """Informational: an extension build inside ``try`` whose handler swallows the failure
    (the module then silently runs PyTorch instead of its kernel)."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try) or not node.handlers:
            continue
        calls = {dotted(c.func, aliases) or "" for b in node.body for c in ast.walk(b) if isinstance(c, ast.Call)}
        builds = any(n.endswith("load_inline") or n.endswith("cpp_extension.load") for n in calls)
        reraises = any(isinstance(x, ast.Raise) for h in node.handlers for x in ast.walk(h))
        if builds and not reraises:
            out.append(Finding("pytorch_fallback", "pytorch_fallback", node.lineno,
                               "extension build inside try/except that swallows failures", reject=False))
    return out


def _init_of(tree: ast.AST | None, class_name: str) -> tuple[ast.ClassDef | None, ast.FunctionDef | None]:
    for node in getattr(tree, "body", []):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            init = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
            return node, init
    return None, None


def _used_names(fn: ast.FunctionDef) -> set[str]:
    return {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def check_hyperparameters(tree: ast.AST, aliases: dict[str, str], reference: ast.AST | None = None) -> list[Finding]:
    """``ModelNew.__init__`` must use every constructor argument that ``Model.__init__`` uses
    (arguments are passed by position, KernelBench's convention).  A ModelNew that inherits
    ``Model.__init__``, forwards ``*args``, or calls ``locals()`` is not judged here; one whose
    outputs change with an ignored argument is caught by correctness anyway — this check exists
    for arguments that are ignored *and* happen to equal the hard-coded value."""
    if reference is None:
        return []
    _, ref_init = _init_of(reference, "Model")
    cls, init = _init_of(tree, "ModelNew")
    if ref_init is None or cls is None or init is None or init.args.vararg is not None:
        return []
    used = _used_names(init)
    if "locals" in used or "vars" in used:
        return []
    ref_params = [a.arg for a in ref_init.args.args[1:]]
    ref_used = _used_names(ref_init)
    params = [a.arg for a in init.args.args[1:]]
    out = []
    for i, ref_name in enumerate(ref_params):
        if ref_name not in ref_used:
            continue  # the reference ignores it too
        if i >= len(params):
            if init.args.kwarg is None:
                out.append(Finding("hyperparameters", "hyperparameter_ignored", init.lineno,
                                   f"ModelNew.__init__ takes no argument in position {i + 1} ({ref_name!r})"))
        elif params[i] not in used:
            out.append(Finding("hyperparameters", "hyperparameter_ignored", init.lineno,
                               f"ModelNew.__init__ ignores its argument {params[i]!r} (the reference's {ref_name!r})"))
    return out


CHECKS: dict[str, Callable[..., list[Finding]]] = {
    "timer_tampering": check_timer_tampering,
    "introspection": check_introspection,
    "frames": check_frames,
    "precision": check_precision,
    "pytorch_fallback": check_pytorch_fallback,
    "hyperparameters": check_hyperparameters,
}
_NEEDS_REFERENCE = {"hyperparameters"}


def run_static_guards(source: str, names: list[str] | None = None, reference: str | None = None) -> list[Finding]:
    """Run the named checks (all by default).  A SyntaxError yields no findings: the import
    phase reports it as a compile error with the interpreter's own message."""
    selected = list(CHECKS) if names is None else names
    for name in selected:
        if name not in CHECKS:
            raise KeyError(f"unknown static guard {name!r}; known: {', '.join(CHECKS)}")
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    aliases = import_aliases(tree)
    try:
        ref_tree = ast.parse(reference) if reference else None
    except SyntaxError:
        ref_tree = None
    findings: list[Finding] = []
    for name in selected:
        if name in _NEEDS_REFERENCE:
            findings.extend(CHECKS[name](tree, aliases, ref_tree))
        else:
            findings.extend(CHECKS[name](tree, aliases))
    return findings
