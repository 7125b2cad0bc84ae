"""Load a task's source and trace its ``Model`` with torch.fx, on the meta device.

Contract: :func:`trace_task` executes the task source (untrusted code: call it only in a child
process, see :mod:`cudal1.rewrite.tracing_process`), builds ``Model(*get_init_inputs())`` and the
inputs of ``get_inputs()`` under ``torch.device("meta")`` (no memory, no compute), traces the
model symbolically (buffers become graph nodes) and records every node's shape and dtype in
``node.meta["tensor_meta"]``.  Raises :class:`TraceFailed` with a one-line reason when the model
cannot be traced (data-dependent control flow, ``.item()``, missing modules).
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch.fx.passes.shape_prop import ShapeProp


class TraceFailed(Exception):
    """The task cannot be traced or shape-propagated (the reason is the message)."""


class _Tracer(fx.Tracer):
    proxy_buffer_attributes = True  # buffers (masks, running stats) become get_attr nodes


@dataclass
class Traced:
    module: types.ModuleType  # the executed task module
    model: torch.nn.Module  # on the meta device
    gm: fx.GraphModule
    inputs: list[Any]  # meta tensors (and plain values) from get_inputs()


def load_task_module(source: str, name: str = "task") -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__file__ = f"<{name}>"
    exec(compile(source, f"<{name}>", "exec", dont_inherit=True), mod.__dict__)  # noqa: S102 - child process only
    for attr in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(mod, attr):
            raise TraceFailed(f"the task defines no {attr}")
    return mod


def propagate_shapes(gm: fx.GraphModule, inputs: list[Any]) -> None:
    """(Re)compute ``tensor_meta`` for every node of ``gm`` on the given meta inputs."""
    for node in gm.graph.nodes:
        node.meta.pop("tensor_meta", None)
    try:
        ShapeProp(gm).propagate(*inputs)
    except Exception as exc:  # noqa: BLE001 - any failure means "cannot reason about shapes"
        raise TraceFailed(f"shape propagation failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}") from None


def trace_task(source: str) -> Traced:
    try:
        mod = load_task_module(source)
        with torch.device("meta"):
            model = mod.Model(*mod.get_init_inputs())
            inputs = list(mod.get_inputs())
    except TraceFailed:
        raise
    except Exception as exc:  # noqa: BLE001
        raise TraceFailed(f"task failed to load on the meta device: {type(exc).__name__}: {str(exc)[:160]}") from None
    try:
        graph = _Tracer().trace(model)
    except Exception as exc:  # noqa: BLE001
        raise TraceFailed(
            f"torch.fx cannot trace the model: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        ) from None
    gm = fx.GraphModule(model, graph)
    propagate_shapes(gm, inputs)
    return Traced(mod, model, gm, inputs)


# ---- node facts ---------------------------------------------------------------------------------

def shape(node: Any) -> tuple[int, ...] | None:
    tm = node.meta.get("tensor_meta") if isinstance(node, fx.Node) else None
    return tuple(tm.shape) if tm is not None and hasattr(tm, "shape") else None


def dtype(node: Any) -> torch.dtype | None:
    tm = node.meta.get("tensor_meta") if isinstance(node, fx.Node) else None
    return tm.dtype if tm is not None and hasattr(tm, "dtype") else None


def ndim(node: Any) -> int | None:
    s = shape(node)
    return len(s) if s is not None else None


def is_floating(node: Any) -> bool:
    d = dtype(node)
    return d is not None and d.is_floating_point


def is_constant(node: Any, _memo: dict | None = None) -> bool:
    """True when ``node`` depends only on parameters/buffers and literals (not on inputs) and
    involves no random or stateful operation."""
    if not isinstance(node, fx.Node):
        return True
    memo = node.graph.__dict__.setdefault("_cudal1_const_memo", {}) if _memo is None else _memo
    if node in memo:
        return memo[node]
    if node.op == "get_attr":
        result = True
    elif node.op in ("placeholder", "output", "call_module"):
        result = False
    else:
        name = getattr(node.target, "__name__", str(node.target))
        if any(r in name for r in ("rand", "dropout", "normal", "bernoulli", "multinomial")):
            result = False
        else:
            result = all(is_constant(a, memo) for a in node.all_input_nodes)
    memo[node] = result
    return result


def reset_constant_memo(graph: fx.Graph) -> None:
    graph.__dict__.pop("_cudal1_const_memo", None)
