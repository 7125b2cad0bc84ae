"""Argument and output trees on the wire between the reference worker and the candidate's process.

Contract: trees are nested lists/tuples/dicts whose leaves are tensors or plain values.  Tensors
never travel in messages: the side that owns the memory puts them in slots
(:mod:`cudal1.harness.slots`) and the message carries their layout.  Inputs go clean → candidate
(:func:`encode_inputs` / :func:`decode_inputs`; an unusual non-tensor init argument may travel
pickled, which is safe in that direction only).  Outputs go candidate → clean as JSON only
(:func:`encode_outputs` / :func:`decode_outputs`): the clean side validates the description's
shape and size, never unpickles, and clones every tensor out of its slot before it looks at it.
An output leaf that does not fit the reference's slot (another shape or dtype, not a plain
tensor, another device) travels as its description only, enough for the verdict to say why.
"""

from __future__ import annotations

import base64
import pickle
from typing import Any, Callable

import torch

from cudal1.harness.slots import Slot, SlotMap, SlotPool, dtype_name, dtype_of, layout, nbytes_of, view

MAX_LEAVES = 4096
MAX_DEPTH = 12
_PLAIN = (int, float, bool, str, type(None))


class WireError(ValueError):
    """A malformed tree description."""


# ---- clean side -> candidate -----------------------------------------------------------------
def encode_inputs(obj: Any, pool: SlotPool, slots: list[Slot | None], index: list[int] | None = None,
                  put: Callable[[torch.Tensor, torch.Tensor, int], None] | None = None) -> dict[str, Any]:
    """Describe ``obj``, copying each tensor leaf into its slot (``slots[i]`` for the i-th tensor
    leaf, grown or allocated as needed; ``put(slot_view, tensor, i)`` instead of a plain copy: a
    timed call's masking).  The copies are queued on the current stream: the caller synchronizes
    before the candidate reads them."""
    index = index if index is not None else [0]
    if isinstance(obj, torch.Tensor):
        i = index[0]
        index[0] += 1
        while len(slots) <= i:
            slots.append(None)
        slot = slots[i] = pool.fitting(slots[i], nbytes_of(obj))
        target = view(slot.raw, obj.dtype, list(obj.shape))
        if put is None:
            target.copy_(obj)
        else:
            put(target, obj, i)
        return {"t": "tensor", **layout(slot.id, obj)}
    if isinstance(obj, (list, tuple)):
        return {"t": type(obj).__name__ if type(obj) in (list, tuple) else "tuple",
                "items": [encode_inputs(x, pool, slots, index, put) for x in obj]}
    if isinstance(obj, dict):
        return {"t": "dict", "items": [[str(k), encode_inputs(v, pool, slots, index, put)] for k, v in obj.items()]}
    if isinstance(obj, _PLAIN):
        return {"t": "py", "v": obj}
    return {"t": "pickle", "v": base64.b64encode(pickle.dumps(obj)).decode()}


def tensor_leaves(obj: Any) -> list[torch.Tensor]:
    """The tensor leaves of an input tree in :func:`encode_inputs`' order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in tensor_leaves(x)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in tensor_leaves(x)]
    return []


def decode_inputs(desc: dict[str, Any], slots: SlotMap, make: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Rebuild inputs in the candidate's process; ``make`` turns a slot view into the tensor the
    candidate gets (a private copy)."""
    kind = desc["t"]
    if kind == "tensor":
        return make(slots.tensor(desc))
    if kind in ("list", "tuple"):
        items = [decode_inputs(x, slots, make) for x in desc["items"]]
        return items if kind == "list" else tuple(items)
    if kind == "dict":
        return {k: decode_inputs(v, slots, make) for k, v in desc["items"]}
    if kind == "py":
        return desc["v"]
    if kind == "pickle":
        return pickle.loads(base64.b64decode(desc["v"]))
    raise WireError(f"unknown input node {kind!r}")


# ---- candidate -> clean side -----------------------------------------------------------------
def storage_order(t: torch.Tensor) -> torch.Tensor | None:
    """A dense tensor's elements as a flat view in the order they lie in memory (a contiguous
    tensor's own order; a channels-last one's, ...), or None for a tensor that is not dense and
    non-overlapping (an expanded or sliced view: it must be copied element by element)."""
    if t.is_contiguous():
        return t.reshape(-1)
    if not dense(list(t.shape), list(t.stride())):
        return None
    return t.as_strided((t.numel(),), (1,), t.storage_offset())


def dense(shape: list[int], strides: list[int]) -> bool:
    """Whether ``strides`` lay ``shape`` out densely without overlap (a permutation of a
    contiguous layout; dimensions of size 1 may have any stride)."""
    if len(shape) != len(strides):
        return False
    expected = 1
    for size, stride in sorted(((n, s) for n, s in zip(shape, strides) if n != 1), key=lambda p: p[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def output_leaves(out: Any) -> list[Any]:
    """The output's tensor(-like) leaves in the order output slots are assigned (dict keys sorted,
    as :func:`encode_outputs` and :func:`output_targets` walk them)."""
    from cudal1.harness.compare import leaves

    return [x for _, x in leaves(out) if isinstance(x, torch.Tensor) or hasattr(x, "__torch_function__")]


def encode_outputs(out: Any, targets: list[dict[str, Any]], slots: SlotMap, device_type: str,
                   copy: bool = True) -> dict[str, Any]:
    """Describe the candidate's output, copying each plain tensor leaf that fits the reference's
    slot for that leaf (``targets[i]``, in leaf order) into it (``copy=False``: the timer already
    put it there, see :func:`cudal1.harness.timer._fits`; the same rule decides what fits)."""
    counter = [0]

    def walk(obj: Any, depth: int) -> dict[str, Any]:
        if depth > MAX_DEPTH:
            return {"t": "obj", "type": "too deep"}
        if isinstance(obj, torch.Tensor) or hasattr(obj, "__torch_function__"):
            i = counter[0]
            counter[0] += 1
            if not isinstance(obj, torch.Tensor):
                return {"t": "obj", "type": f"{type(obj).__module__}.{type(obj).__qualname__}"}
            node = {"t": "tensor", "slot": None, "dtype": dtype_name(obj.dtype), "shape": list(obj.shape),
                    "device": "meta" if obj.is_meta else obj.device.type,
                    "type": f"{type(obj).__module__}.{type(obj).__qualname__}",
                    "strided": obj.layout is torch.strided}
            target = targets[i] if i < len(targets) else None
            fits = (type(obj) is torch.Tensor and not obj.is_meta and obj.device.type == device_type
                    and obj.layout is torch.strided and target is not None
                    and target["dtype"] == node["dtype"] and list(target["shape"]) == node["shape"])
            if fits:
                flat = storage_order(obj.detach())
                if copy and flat is None:
                    slots.tensor(target).copy_(obj.detach())
                elif copy:
                    slots.tensor(target).reshape(-1).copy_(flat)
                node["slot"] = target["slot"]
                if flat is not None and not obj.is_contiguous():
                    node["strides"] = list(obj.stride())  # the slot holds its storage order
            return node
        if isinstance(obj, (list, tuple)):
            return {"t": "tuple" if isinstance(obj, tuple) else "list", "items": [walk(x, depth + 1) for x in obj]}
        if isinstance(obj, dict):
            return {"t": "dict", "items": [[str(k), walk(obj[k], depth + 1)] for k in sorted(obj, key=str)]}
        if isinstance(obj, _PLAIN):
            return {"t": "py", "v": obj}
        return {"t": "obj", "type": f"{type(obj).__module__}.{type(obj).__qualname__}"}

    return walk(out, 0)


class Described:
    """An output leaf the clean side did not receive as data: what the candidate said it was."""

    def __init__(self, node: dict[str, Any]) -> None:
        self.node = node

    def problem(self, device_type: str, want: Any) -> tuple[str, str]:
        """(flag, detail) for this leaf against the reference's leaf ``want``."""
        n = self.node
        if n["t"] == "obj":
            return "lazy_output", f"type {n.get('type')} is not torch.Tensor"
        if n.get("type") != "torch.Tensor":
            return "lazy_output", f"type {n.get('type')} is not torch.Tensor"
        if n.get("device") != device_type:
            return "lazy_output", f"tensor on device {n.get('device')}, expected {device_type}"
        if not n.get("strided", True):
            return "lazy_output", "layout is not strided"
        if not isinstance(want, torch.Tensor):
            return "shape_mismatch", f"got Tensor, want {type(want).__name__}"
        if tuple(n.get("shape") or ()) != tuple(want.shape):
            return "shape_mismatch", f"shape {tuple(n.get('shape') or ())}, want {tuple(want.shape)}"
        return "shape_mismatch", f"dtype torch.{n.get('dtype')}, want {want.dtype}"


def decode_outputs(desc: Any, pool: SlotPool) -> Any:
    """Rebuild the candidate's output on the clean side: tensors cloned out of the pool's slots,
    plain values as sent, everything else as :class:`Described`.  Raises :class:`WireError` for a
    description that is not a well-formed tree."""
    count = [0]

    def walk(node: Any, depth: int) -> Any:
        if not isinstance(node, dict) or depth > MAX_DEPTH + 1:
            raise WireError("malformed output description")
        count[0] += 1
        if count[0] > MAX_LEAVES:
            raise WireError("output description too large")
        kind = node.get("t")
        if kind == "tensor":
            sid = node.get("slot")
            if sid is None:
                return Described(node)
            slot = pool.slots.get(int(sid)) if isinstance(sid, int) else None
            if slot is None:
                raise WireError(f"unknown slot {sid!r}")
            shape = [int(s) for s in node["shape"]]
            data = view(slot.raw, dtype_of(str(node["dtype"])), shape)
            if node.get("strides") is not None:
                data = _strided(data, shape, node["strides"])
            return data.contiguous().clone().to(pool.device)
        if kind in ("list", "tuple"):
            items = node.get("items")
            if not isinstance(items, list):
                raise WireError("malformed output description")
            built = [walk(x, depth + 1) for x in items]
            return built if kind == "list" else tuple(built)
        if kind == "dict":
            items = node.get("items")
            if not isinstance(items, list) or not all(isinstance(p, list) and len(p) == 2 for p in items):
                raise WireError("malformed output description")
            return {str(k): walk(v, depth + 1) for k, v in items}
        if kind == "py":
            value = node.get("v")
            if not isinstance(value, _PLAIN):
                raise WireError("malformed output description")
            return value
        if kind == "obj":
            return Described(node)
        raise WireError(f"unknown output node {kind!r}")

    return walk(desc, 0)


def _strided(data: torch.Tensor, shape: list[int], strides: Any) -> torch.Tensor:
    """The slot's elements (in storage order) seen with the candidate's strides, which must
    describe a dense, non-overlapping layout of exactly those elements."""
    if not (
        isinstance(strides, list) and len(strides) == len(shape) and all(type(s) is int and s > 0 for s in strides)
    ):
        raise WireError("malformed strides")
    flat = data.reshape(-1)
    if flat.numel() == 0:
        return data
    if not dense(shape, strides):
        raise WireError("strides of an overlapping or sparse layout")
    return flat.as_strided(shape, strides)


def output_targets(ref_out: Any, pool: SlotPool, slots: list[Slot | None]) -> list[dict[str, Any] | None]:
    """One output slot per tensor leaf of the reference's output (same dtype and shape), in leaf
    order; ``slots`` is the worker's list, grown as needed."""
    from cudal1.harness.compare import leaves

    targets: list[dict[str, Any] | None] = []
    i = 0
    for _, leaf in leaves(ref_out):
        if isinstance(leaf, torch.Tensor):
            while len(slots) <= i:
                slots.append(None)
            slot = slots[i] = pool.fitting(slots[i], nbytes_of(leaf))
            targets.append(layout(slot.id, leaf))
            i += 1
    return targets
