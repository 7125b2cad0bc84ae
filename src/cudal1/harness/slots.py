"""Shared tensors between the clean reference worker and the candidate's process.

Contract: the reference worker *owns* every slot (``SlotPool``): it allocates them, writes the
inputs the candidate gets and reads back what the candidate wrote into the output slots.  The
candidate's process only *opens* slots it is told about (``SlotMap``).  A slot is ``nbytes`` of
raw memory, viewed as any dtype and shape that fits: on CUDA a ``cudaMalloc`` block shared through
its IPC handle (so the caching allocator's free lists, which a candidate can walk, never hold
it); on the CPU (and on a GPU whose IPC handles the candidate's process cannot open) a file mapped
shared in the job's slot directory, which each side copies to and from its device.  Descriptions cross processes
as JSON-safe dicts (``{"id", "nbytes", "kind", "ref"}``); tensor layouts as ``{"slot", "dtype",
"shape"}``.  Nothing here trusts what the other side wrote: readers clone before checking.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

_DTYPES = {str(d).replace("torch.", ""): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.int8,
    torch.uint8, torch.bool, torch.complex64, torch.complex128)}
for _name in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"):
    if hasattr(torch, _name):
        _DTYPES[_name] = getattr(torch, _name)


class SlotError(ValueError):
    """A slot description that cannot be honoured (unknown dtype, does not fit, unknown id)."""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def dtype_of(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise SlotError(f"unsupported dtype {name!r}") from None


def layout(slot_id: int, t: torch.Tensor) -> dict[str, Any]:
    return {"slot": slot_id, "dtype": dtype_name(t.dtype), "shape": list(t.shape)}


def nbytes_of(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def view(raw: torch.Tensor, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    """``raw`` (uint8) seen as ``dtype`` x ``shape`` from its start."""
    numel = 1
    for s in shape:
        if int(s) < 0:
            raise SlotError(f"negative dimension in {shape}")
        numel *= int(s)
    need = numel * torch.empty((), dtype=dtype).element_size()
    if need > raw.numel():
        raise SlotError(f"{need} bytes do not fit a slot of {raw.numel()}")
    if need == 0:
        return torch.empty([int(s) for s in shape], dtype=dtype, device=raw.device)
    return raw[:need].view(dtype).reshape([int(s) for s in shape])


@dataclass
class Slot:
    id: int
    nbytes: int
    raw: torch.Tensor  # uint8, nbytes long
    kind: str  # cuda | file
    ref: str  # IPC handle (hex) or file path
    ptr: int = 0  # cudaMalloc'd address (cuda only)

    def describe(self) -> dict[str, Any]:
        return {"id": self.id, "nbytes": self.nbytes, "kind": self.kind, "ref": self.ref}


class SlotPool:
    """The reference worker's slots.  ``directory`` holds CPU slot files (readable and writable
    by the candidate's uid: the caller creates it with the right owner and mode)."""

    def __init__(self, device: torch.device, directory: str | os.PathLike[str]) -> None:
        self.device = device
        self.directory = Path(directory)
        self.slots: dict[int, Slot] = {}
        self._next = 0
        self.transport = "ipc" if device.type == "cuda" else "file"  # file: host memory, on any device

    def use_host(self) -> None:
        """From now on slots are shared host files, also for a GPU (the candidate's process could
        not open an IPC handle: another uid, say); existing slots are dropped."""
        self.close()
        self.transport = "file"

    def allocate(self, nbytes: int) -> Slot:
        nbytes = max(16, int(nbytes))
        sid, self._next = self._next, self._next + 1
        if self.transport == "ipc":
            from cudal1.harness import cuda_api

            ptr = cuda_api.malloc(nbytes)
            slot = Slot(sid, nbytes, cuda_api.byte_tensor(ptr, nbytes), "cuda", cuda_api.ipc_handle(ptr), ptr)
        else:
            path = self.directory / f"slot{sid}.bin"
            with open(path, "wb") as f:
                f.truncate(nbytes)
            os.chmod(path, 0o666)
            raw = torch.from_file(str(path), shared=True, size=nbytes, dtype=torch.uint8)
            slot = Slot(sid, nbytes, raw, "file", str(path))
        self.slots[sid] = slot
        return slot

    def fitting(self, current: Slot | None, nbytes: int) -> Slot:
        """``current`` when ``nbytes`` fit in it, else a new slot."""
        return current if current is not None and current.nbytes >= nbytes else self.allocate(nbytes)

    def close(self) -> None:
        for slot in self.slots.values():
            if slot.kind == "cuda":
                from cudal1.harness import cuda_api

                slot.raw = None  # type: ignore[assignment]
                cuda_api.free(slot.ptr)
        self.slots.clear()


class SlotMap:
    """The candidate's side: slots opened from their descriptions, by id."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.opened: dict[int, torch.Tensor] = {}
        self._ptrs: list[int] = []

    def update(self, descriptions: list[dict[str, Any]]) -> None:
        """Open the slots described (an IPC handle that cannot be opened raises ``CudaCallError``)."""
        for d in descriptions:
            sid, nbytes, kind, ref = int(d["id"]), int(d["nbytes"]), str(d["kind"]), str(d["ref"])
            if sid in self.opened:
                continue
            if kind == "cuda":
                from cudal1.harness import cuda_api

                ptr = cuda_api.ipc_open(ref)
                self._ptrs.append(ptr)
                self.opened[sid] = cuda_api.byte_tensor(ptr, nbytes)
            elif kind == "file":
                self.opened[sid] = torch.from_file(ref, shared=True, size=nbytes, dtype=torch.uint8)
            else:
                raise SlotError(f"unknown slot kind {kind!r}")

    def tensor(self, lay: dict[str, Any]) -> torch.Tensor:
        try:
            raw = self.opened[int(lay["slot"])]
        except KeyError:
            raise SlotError(f"unknown slot {lay.get('slot')!r}") from None
        return view(raw, dtype_of(str(lay["dtype"])), list(lay["shape"]))
