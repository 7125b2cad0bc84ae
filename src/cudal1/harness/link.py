"""The reference worker's end of the line to the candidate's process.

Contract: :class:`CandidateLink` sends requests (JSON) and reads replies (JSON only, size-bounded,
never unpickled).  Inputs go into the reference worker's own slots before a request; outputs come
back through its output slots and are cloned before anyone looks at them.  A reply may carry an
``event`` (the candidate finished importing, an extension build started or ended): it goes to
``on_event`` and the link keeps reading.  A reply carrying a ``verdict`` ends the protocol with
that verdict only if it is a failure: the candidate's process cannot declare itself ``ok``, and
anything malformed is ``tampering``.  The candidate's process going away (EOF) raises
:class:`CandidateGone`; the parent turns that into a verdict with the process's exit status.
Deadlines are the parent's: the link blocks as long as a phase lasts.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from typing import Any, Callable

import torch

from cudal1.flags import FLAGS
from cudal1.harness import compare as cmp
from cudal1.harness.slots import Slot, SlotPool, view
from cudal1.harness.verdict import Verdict
from cudal1.harness.wire import WireError, decode_outputs, encode_inputs, output_targets, tensor_leaves

MAX_REPLY_BYTES = 32 * 1024 * 1024
_FAILURES = {"compile_error", "runtime_error", "incorrect", "rejected", "timeout"}
_perf = time.perf_counter


class CandidateGone(Exception):
    """The candidate's process ended (or closed the line) before answering."""


class _HostFallback(Exception):
    """The candidate's process could not open a slot's IPC handle: slots move to host memory."""


def _verdict_from(data: Any) -> Verdict:
    """The candidate's own (failure) verdict, with only the fields the judge knows."""
    if not isinstance(data, dict) or data.get("status") not in _FAILURES:
        return Verdict("rejected", "the candidate's process sent a verdict the judge does not accept", "tampering")
    flags = [str(f) for f in data.get("flags") or [] if str(f) in FLAGS]
    extra = {k: data[k] for k in ("compile_log", "traceback") if isinstance(data.get(k), str)}
    if isinstance(data.get("build_s"), (int, float)):
        extra["build_s"] = float(data["build_s"])
    if isinstance(data.get("build_error"), bool):
        extra["build_error"] = data["build_error"]
    return Verdict(str(data["status"]), str(data.get("message") or "")[:8000], *flags, **extra)


class CandidateLink:
    def __init__(self, conn: Any, pool: SlotPool, device: torch.device, pid: int,
                 on_event: Callable[[str, dict[str, Any]], None]) -> None:
        self.conn = conn
        self.pool = pool
        self.device = device
        self.pid = pid
        self.on_event = on_event
        self.in_slots: list[Slot | None] = []
        self.out_slots: list[Slot | None] = []
        self.init_slots: list[Slot | None] = []
        self._told: set[int] = set()
        self.host_fallback = False  # slots moved to host memory (IPC handles could not be opened)
        self.fallback_reason = ""

    # ---- the wire ---------------------------------------------------------------------------
    def request(self, op: str, **payload: Any) -> dict[str, Any]:
        fresh = [s.describe() for sid, s in self.pool.slots.items() if sid not in self._told]
        self._told.update(d["id"] for d in fresh)
        try:
            self.conn.send_bytes(json.dumps({"op": op, "slots": fresh, **payload}).encode())
        except (OSError, EOFError, BrokenPipeError) as exc:
            raise CandidateGone(f"the candidate's process is gone ({exc})") from None
        return self.read()

    def read(self) -> dict[str, Any]:
        """The next reply, after handing any events to ``on_event``."""
        while True:
            try:
                raw = self.conn.recv_bytes(MAX_REPLY_BYTES)
            except (OSError, EOFError) as exc:
                raise CandidateGone("the candidate's process ended without answering") from exc
            try:
                reply = json.loads(raw)
            except ValueError:
                raise Verdict("rejected", "the candidate's process sent an undecodable reply", "tampering") from None
            if not isinstance(reply, dict):
                raise Verdict("rejected", "the candidate's process sent a malformed reply", "tampering")
            if "event" in reply:
                self.on_event(str(reply["event"]), reply)
                continue
            if "verdict" in reply:
                raise _verdict_from(reply["verdict"])
            if "slot_error" in reply:
                if self.pool.transport != "ipc":
                    raise Verdict("runtime_error", f"the candidate's process cannot open its slots: {reply['slot_error']}"[:2000])
                raise _HostFallback(str(reply["slot_error"]))
            return reply

    def _retrying(self, build: Callable[[], tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        """``request(*build())``, staged again in host memory if the candidate's process could not
        open an IPC handle (measured as the reason, never as the candidate's fault)."""
        try:
            op, payload = build()
            return self.request(op, **payload)
        except _HostFallback as why:
            print(f"cudal1: slots moved to host memory: the candidate's process could not open them ({why})",
                  file=sys.stderr, flush=True)
            self.pool.use_host()
            self.in_slots, self.out_slots, self.init_slots = [], [], []
            self.host_fallback = True
            self.fallback_reason = str(why)
            op, payload = build()
            return self.request(op, **payload)

    def transport(self) -> str:
        """How the slots crossed: ``cuda_ipc``, ``host_files`` (CPU), or ``host_files (...)`` with
        the reason the candidate's process could not open CUDA IPC handles."""
        if self.host_fallback:
            return f"host_files (CUDA IPC failed: {self.fallback_reason[:300]})"
        return "cuda_ipc" if self.pool.transport == "ipc" else "host_files"

    def close(self) -> None:
        try:
            self.conn.send_bytes(b'{"op": "exit"}')
        except (OSError, EOFError):
            pass

    # ---- inputs and outputs -----------------------------------------------------------------
    def stage(self, inputs: list, slots: list[Slot | None] | None = None) -> dict[str, Any]:
        """Copy ``inputs`` into slots (the candidate gets private copies of them)."""
        slots = self.in_slots if slots is None else slots
        desc = encode_inputs(list(inputs), self.pool, slots)
        if self.device.type == "cuda":
            torch.cuda.synchronize()  # the candidate's process reads them from another context
        return desc

    def targets(self, ref_out: Any) -> list[dict[str, Any] | None]:
        return output_targets(ref_out, self.pool, self.out_slots)

    def outputs(self, desc: Any) -> Any:
        try:
            return decode_outputs(desc, self.pool)
        except (WireError, KeyError, TypeError, ValueError) as exc:
            raise Verdict("rejected", f"the candidate's process described its output wrongly ({exc})", "tampering") from None

    def inputs_intact(self, inputs: list) -> bool:
        """The input slots still hold ``inputs`` (the candidate's process only gets copies; a slot
        that changed was written through its mapping)."""
        tensors = tensor_leaves(list(inputs))
        views = [view(self.in_slots[i].raw, t.dtype, list(t.shape)).to(t.device)  # type: ignore[union-attr]
                 for i, t in enumerate(tensors)]
        return cmp.tensors_equal(tensors, views)

    # ---- requests ---------------------------------------------------------------------------
    def construct(self, init: list, seed: int) -> dict[str, Any]:
        return self._retrying(lambda: ("construct", {"init": self.stage(init, self.init_slots), "seed": seed}))

    def call(self, inputs: list, ref_out: Any, where: str, full: bool = False) -> tuple[Any, float]:
        reply = self._retrying(lambda: ("call", {"inputs": self.stage(inputs), "targets": self.targets(ref_out),
                                                 "where": where, "full": full}))
        return self.outputs(reply.get("out")), float(reply.get("ms") or 0.0)

    def warmup(self, inputs: list, join: bool = False) -> tuple[list[float], list[float]]:
        """One untimed call: (the host's issue times, and with ``join`` the candidate's process's
        join probe; a malformed probe reads as none)."""
        reply = self._retrying(lambda: ("warmup", {"sets": [{"inputs": self.stage(inputs)}], "join": join}))
        probe = reply.get("join_ms")
        if not (isinstance(probe, list) and len(probe) <= 100 and
                all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in probe)):
            probe = []
        return [float(x) for x in reply.get("host_ms") or []], [float(x) for x in probe]

    def time(self, inputs: list, ref_out: Any, keep: bool, where: str) -> tuple[list[Any], Any, float]:
        """One timed call in the candidate's process: (timing row, output or None, the wall time
        of the exchange on this process's clock)."""
        t0 = _perf()
        reply = self._retrying(lambda: ("time", {"inputs": self.stage(inputs), "keep": keep, "where": where,
                                                 "targets": self.targets(ref_out) if keep else []}))
        wall_ms = (_perf() - t0) * 1e3
        row = reply.get("timing")
        if not (isinstance(row, list) and len(row) == 5 and all(isinstance(x, (int, float, bool)) for x in row)):
            raise Verdict("rejected", "the candidate's process reported a malformed timing", "tampering")
        out = self.outputs(reply["out"]) if keep and "out" in reply else None
        return [float(row[0]), float(row[1]), float(row[2]), bool(row[3]), bool(row[4])], out, wall_ms

    def reuse(self, first: list, second: list, ref_out: Any) -> Any:
        """The address-reuse probe (None when the inputs cannot be written in place)."""
        second_slots: list[Slot | None] = []

        def build() -> tuple[str, dict[str, Any]]:
            second_slots.clear()
            return "reuse", {"inputs": self.stage(first), "second": self.stage(second, second_slots),
                             "targets": self.targets(ref_out)}

        reply = self._retrying(build)
        if reply.get("skipped"):
            return None
        return self.outputs(reply.get("out"))

    # ---- the process ------------------------------------------------------------------------
    def pause(self) -> None:
        """Stop the candidate's process group while the reference is timed: no thread of its
        can launch GPU work then."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: int) -> None:
        if self.pid > 0:
            try:
                os.killpg(self.pid, sig)
            except (ProcessLookupError, PermissionError):
                try:
                    os.kill(self.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
