"""The reference's timed calls under the same window as the candidate's (:class:`RefWindow`), and
the tensor-tree helpers the timing phase shares with it.  Runs in the reference worker only
(:mod:`cudal1.harness.reference.measure` owns the phase)."""

from __future__ import annotations

import time
from typing import Any, Protocol

import torch

from cudal1.harness import window
from cudal1.harness.reference.hostload import WindowWaits
from cudal1.harness.timer import CallWindow, GateWait
from cudal1.harness.window import Stager
from cudal1.harness.wire import output_leaves, tensor_leaves


class WindowOwner(Protocol):
    """What the window needs of the timing phase that owns it (the reference worker's
    ``Measurement``): its device, and a sync that waits for the work it has issued."""

    device: torch.device

    def sync(self) -> None: ...


_perf_ns = time.perf_counter_ns


class RefWindow:
    """The reference's timed calls under the same window as the candidate's, in this process: its
    inputs masked into this process's own buffers (one per input lane, kept across calls) and
    unmasked in place after the gate, its outputs
    snapshotted into buffers shaped like the slots and digested, the gate opened by this process
    once the call is issued, and the window read on the same clock (so both sides' slack, window
    minus event span, holds the same work)."""

    def __init__(self, owner: WindowOwner, timer: Any, stager: Stager, page: Any, template: Any,
                 wait: GateWait) -> None:
        self.owner, self.timer, self.stager, self.page, self.wait = owner, timer, stager, page, wait
        self.device = owner.device
        self.targets = [torch.empty(tuple(x.shape), dtype=x.dtype, device=x.device)  # contiguous, like a slot view
                        for x in output_leaves(template) if isinstance(x, torch.Tensor)]
        self.buffers: list[torch.Tensor] = []

    def release(self) -> None:
        """Drop the output targets and masked-input buffers: they serve the timed calls only, and on
        a task of 6 GiB tensors they are 12 GiB that the address-reuse probe after them needs (an
        80 GB H100 ran out of memory there with them held, 2026-12-05)."""
        self.targets, self.buffers = [], []

    def _buffer(self, lane: int, nbytes: int) -> torch.Tensor:
        while len(self.buffers) <= lane:
            self.buffers.append(torch.empty(0, dtype=torch.uint8, device=self.device))
        if self.buffers[lane].numel() < nbytes:
            self.buffers[lane] = torch.empty(max(16, nbytes), dtype=torch.uint8, device=self.device)
        return self.buffers[lane]

    def time(self, ref_model: Any, inputs: list) -> list[Any]:
        """One call; its row ``[gpu, device, host, blocked, escaped, window]`` (ms)."""
        key = window.new_key()
        self.stager.set_key(key)
        masked_inputs: list[torch.Tensor] = []
        privates: list[torch.Tensor] = []
        for lane, x in enumerate(tensor_leaves(inputs)):
            nbytes = x.numel() * x.element_size()
            masked = self._buffer(lane, nbytes)[:nbytes]
            self.stager.mask_into(masked, x, lane, key)
            masked_inputs.append(masked)  # unmasked in place, as the candidate's process does its copy
            privates.append(masked.view(x.dtype).reshape(tuple(x.shape)))
        args = replace_tensors(inputs, iter(privates))
        seq = self.timer.next_seq()
        marks: dict[str, float] = {}
        waits = WindowWaits()

        def opened() -> None:
            waits.start()
            marks["open"] = _perf_ns()

        def closed() -> None:
            marks["done"] = _perf_ns()
            marks["waited"] = waits.stop()

        if self.device.type == "cuda":
            self.page.set_key(key)
            self.owner.sync()  # the masking above is done before the gate's clock matters
            win = CallWindow(self.page, seq, masked_inputs, self.targets,
                             issued=lambda _ms: self._open(seq, opened, closed), gate_timeout_s=self.wait.wait_s(),
                             own_targets=True)
        else:
            win = CallWindow(self.page, seq, masked_inputs, self.targets, issued=lambda _ms: opened(), key=lambda: key,
                             published=lambda _d: closed())
        ct, out = self.timer.time_call(ref_model, tuple(args), check_escape=False, window=win)
        self.wait.saw(ct.blocked)
        del out, args, privates
        return [ct.gpu_ms, ct.device_ms, ct.host_ms, ct.blocked, ct.escaped, (marks["done"] - marks["open"]) / 1e6,
                marks["waited"]]

    def _open(self, seq: int, opened: Any, closed: Any) -> None:
        """Open this process's own gate (once it runs) and watch its page until the call's digest
        is there."""
        self.page.await_started(seq)
        opened()
        self.page.open(seq)
        deadline = _perf_ns() + 120 * 10**9
        want = seq & 0xFFFFFFFF
        while self.page.done != want:
            if _perf_ns() > deadline:
                raise RuntimeError("the reference's timed call never completed on the device")
        closed()


def layout_only(tree: Any) -> Any:
    """``tree`` with each tensor leaf replaced by an empty one of its dtype and shape on the ``meta``
    device: what output slots are sized from (:func:`cudal1.harness.wire.output_targets`), holding
    no memory."""
    return replace_tensors(tree, iter([torch.empty(tuple(x.shape), dtype=x.dtype, device="meta")
                                        for x in tensor_leaves(tree)]))


def replace_tensors(tree: Any, fresh: Any) -> Any:
    """``tree`` with its tensor leaves replaced, in :func:`tensor_leaves` order, from ``fresh``."""
    if isinstance(tree, torch.Tensor):
        return next(fresh)
    if isinstance(tree, (list, tuple)):
        items = [replace_tensors(x, fresh) for x in tree]
        return items if isinstance(tree, list) else tuple(items)
    if isinstance(tree, dict):
        return {k: replace_tensors(v, fresh) for k, v in tree.items()}
    return tree
