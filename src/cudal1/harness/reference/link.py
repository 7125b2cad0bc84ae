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
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from cudal1.flags import FLAGS
from cudal1.harness import compare as cmp
from cudal1.harness.proctree import CandidateTree
from cudal1.harness.reference.hostload import WindowWaits, thread_times
from cudal1.harness.reference.spans import Spans
from cudal1.harness.reference.verdict import Verdict
from cudal1.harness.slots import Slot, SlotError, SlotPool, dtype_of, view
from cudal1.harness.window import raw_bytes
from cudal1.harness.wire import WireError, decode_outputs, encode_inputs, output_targets, tensor_leaves

MAX_REPLY_BYTES = 32 * 1024 * 1024
_FAILURES = {"compile_error", "runtime_error", "incorrect", "rejected", "timeout"}
_perf = time.perf_counter
_perf_ns = time.perf_counter_ns


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


@dataclass
class TimedCall:
    """One timed call of the candidate as the clean side saw it: the candidate's own report
    (``row``: gpu, device, host ms, blocked, escaped) plus ``window_ms`` (key handed out → outputs'
    digest seen, on this process's clock), whether the call was ``blocked`` (no ``issued`` within
    the watchdog: this side opened the gate without it), the ``digest`` it published and its
    output description ``desc``."""

    row: list[Any]
    window_ms: float
    blocked: bool
    digest: int
    desc: Any
    snapshot: dict[int, torch.Tensor] | None = None  # CPU: the output slots' bytes when "done" arrived
    waited_ms: float = 0.0  # run-queue waits of the threads the window depends on (hostload.WindowWaits)
    threads_ns: tuple[int, int] | None = None  # CPU: the candidate's threads' (running, waiting) ns, key → done


class CandidateLink:
    def __init__(self, conn: Any, pool: SlotPool, device: torch.device, pid: int,
                 on_event: Callable[[str, dict[str, Any]], None], page: Any = None, tree: CandidateTree | None = None,
                 stager: Any = None) -> None:
        self.conn = conn
        self.pool = pool
        self.device = device
        self.pid = pid
        self.on_event = on_event
        self.page = page  # the window page shared with the candidate's process (cudal1.harness.window)
        self.tree = tree or CandidateTree(pid)
        self.stager = stager  # masks inputs into slots and digests output slots (window.Stager)
        self.spans = Spans()  # where a timed call's time goes (the timing phase hands in its own)
        self._seq = 0
        self.sealed = ""  # what the seal did, once done
        self.in_slots: list[Slot | None] = []
        self.out_slots: list[Slot | None] = []
        self.init_slots: list[Slot | None] = []
        self._told: set[int] = set()
        self.host_fallback = False  # slots moved to host memory (IPC handles could not be opened)
        self.fallback_reason = ""

    # ---- the wire ---------------------------------------------------------------------------
    def request(self, op: str, **payload: Any) -> dict[str, Any]:
        self.send(op, **payload)
        return self.read()

    def read(self) -> dict[str, Any]:
        """The next reply, after handing any events to ``on_event``."""
        while True:
            reply = self._next()
            if "event" in reply:
                self.on_event(str(reply["event"]), reply)
                continue
            return reply

    def _retrying(self, build: Callable[[], tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        """``request(*build())``, staged again in host memory if the candidate's process could not
        open an IPC handle (measured as the reason, never as the candidate's fault)."""
        try:
            op, payload = build()
            return self.request(op, **payload)
        except _HostFallback as why:
            self._to_host(why)
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
    def stage(self, inputs: list, slots: list[Slot | None] | None = None,
              key: tuple[int, int, int, int] | None = None) -> dict[str, Any]:
        """Copy ``inputs`` into slots (the candidate gets private copies of them); with ``key``,
        masked with it (a timed call: :mod:`cudal1.harness.window`)."""
        slots = self.in_slots if slots is None else slots
        put = None
        if key is not None:
            self.stager.set_key(key)

            def put(view: torch.Tensor, t: torch.Tensor, lane: int) -> None:
                self.stager.mask_into(view, t, lane, key)

        desc = encode_inputs(list(inputs), self.pool, slots, put=put)
        if self.device.type == "cuda":
            torch.cuda.synchronize()  # the candidate's process reads them from another context
        return desc

    def targets(self, ref_out: Any) -> list[dict[str, Any] | None]:
        return output_targets(ref_out, self.pool, self.out_slots)

    def outputs(self, desc: Any) -> Any:
        try:
            return decode_outputs(desc, self.pool)
        except (WireError, KeyError, TypeError, ValueError) as exc:
            raise Verdict(
                "rejected", f"the candidate's process described its output wrongly ({exc})", "tampering"
            ) from None

    def inputs_intact(self, inputs: list, key: tuple[int, int, int, int] | None = None) -> bool:
        """The input slots still hold ``inputs`` (masked with ``key`` for a timed call; the
        candidate's process only gets copies: a slot that changed was written through its mapping)."""
        tensors = tensor_leaves(list(inputs))
        views = [view(self.in_slots[i].raw, t.dtype, list(t.shape)).to(t.device)  # type: ignore[union-attr]
                 for i, t in enumerate(tensors)]
        if key is not None:
            self.stager.set_key(key)
            wanted = [torch.empty(list(t.shape), dtype=t.dtype, device=t.device) for t in tensors]
            for lane, (w, t) in enumerate(zip(wanted, tensors)):
                self.stager.mask_into(w, t, lane, key)
            tensors = wanted
        return cmp.tensors_equal(tensors, views)

    def outputs_held(self, timed: TimedCall) -> bool:
        """Whether the output slots the call's description names hold what they held when its
        window closed: on a GPU, their digest (computed here) is the one the call published; on
        the CPU, they equal this side's snapshot taken when ``done`` arrived."""
        views, ids = [], []
        for node in _tensor_nodes(timed.desc):
            sid = node.get("slot")
            if isinstance(sid, int) and sid in self.pool.slots:
                try:
                    views.append(view(self.pool.slots[sid].raw, dtype_of(str(node["dtype"])),
                                      [int(x) for x in node["shape"]]))
                except (SlotError, KeyError, TypeError, ValueError):
                    return False
                ids.append(sid)
        if timed.snapshot is None:
            return self.stager.digest(views) == timed.digest
        for sid, v in zip(ids, views):
            snap = timed.snapshot.get(sid)
            if snap is None or not torch.equal(raw_bytes(v), snap[:v.numel() * v.element_size()]):
                return False
        return True

    # ---- requests ---------------------------------------------------------------------------
    def construct(self, init: list, seed: int, watch: bool = False) -> dict[str, Any]:
        """``watch``: the candidate's process brackets it alone where a run-time chooser is on in it."""
        return self._retrying(lambda: ("construct", {"init": self.stage(init, self.init_slots), "seed": seed,
                                                     **({"watch": True} if watch else {})}))

    def call(self, inputs: list, ref_out: Any, where: str, full: bool = False,
             watch: bool = False) -> tuple[Any, float]:
        reply = self._retrying(lambda: ("call", {"inputs": self.stage(inputs), "targets": self.targets(ref_out),
                                                 "where": where, "full": full,
                                                 **({"watch": True} if watch else {})}))
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

    def time(self, inputs: list, ref_out: Any, key: tuple[int, int, int, int], where: str,
             watchdog_s: float) -> TimedCall:
        """One timed call in the candidate's process under the clean window: stage the inputs
        masked with ``key``, ask for the call, wait (``watchdog_s`` at most) until it is issued,
        hand out the key (the window opens), wait until its outputs' digest appears (the window
        closes), then read its report.  The candidate is never told which calls are re-checked."""
        try:
            return self._time(inputs, ref_out, key, where, watchdog_s)
        except _HostFallback as why:
            self._to_host(why)
            return self._time(inputs, ref_out, key, where, watchdog_s)

    def _time(self, inputs: list, ref_out: Any, key: tuple[int, int, int, int], where: str,
              watchdog_s: float) -> TimedCall:
        self._seq += 1
        seq = self._seq
        span = self.spans.span
        with span("cand_calls.stage"):
            desc = self.stage(inputs, key=key)
            targets = self.targets(ref_out)
        snapshot: dict[int, torch.Tensor] | None = None
        threads_ns: tuple[int, int] | None = None
        with span("cand_calls.issue"):
            self.send("time", inputs=desc, targets=targets, seq=seq, where=where)
            blocked = self._await("issued", watchdog_s) is None
        if self.device.type == "cuda" and not blocked:
            with span("cand_calls.started"):
                self.page.await_started(seq)  # the gate runs: its launch stays out of the window
        # CPU: the candidate's threads' counters, read before the window opens (not inside it: the
        # read would add to the candidate's slack and not to the reference's, see figures.window_check)
        before = thread_times(self.pid) if self.device.type != "cuda" else None
        waits = WindowWaits(0 if self.device.type == "cuda" else self.pid)  # on a GPU the candidate's host is done
        waits.start()
        t_open = _perf_ns()
        if self.device.type == "cuda":
            self.page.open(seq, key)
            t_done, early = self._await_page(seq)
            digest = self.page.digest
        else:  # a host has no gate: the key travels in a message; host slots are read here at once
            self.conn.send_bytes(json.dumps({"op": "go", "key": list(key)}).encode())
            self._await("done", None)
            t_done, early, digest = _perf_ns(), None, 0
            after = thread_times(self.pid)
            if before is not None and after is not None:
                threads_ns = (after[0] - before[0], after[1] - before[1])
            snapshot = {t["slot"]: self.pool.slots[t["slot"]].raw.clone() for t in targets if t}
        waited_ms = waits.stop()
        with span("cand_calls.reply"):
            reply = early if early is not None else self._final()
        if t_done is None:
            if self.page.done != (seq & 0xFFFFFFFF):
                raise Verdict("rejected", f"{where}: the call's end was never published", "timing_mismatch")
            t_done = _perf_ns()
        row = reply.get("timing")
        if not (isinstance(row, list) and len(row) == 5 and all(isinstance(x, (int, float, bool)) for x in row)):
            raise Verdict("rejected", "the candidate's process reported a malformed timing", "tampering")
        row = [float(row[0]), float(row[1]), float(row[2]), bool(row[3]) or blocked, bool(row[4])]
        if "out" not in reply:
            raise Verdict("rejected", f"{where}: the candidate's process described no output", "tampering")
        return TimedCall(row, (t_done - t_open) / 1e6, blocked, digest, reply["out"], snapshot, waited_ms, threads_ns)

    def send(self, op: str, **payload: Any) -> None:
        fresh = [s.describe() for sid, s in self.pool.slots.items() if sid not in self._told]
        self._told.update(d["id"] for d in fresh)
        try:
            self.conn.send_bytes(json.dumps({"op": op, "slots": fresh, **payload}).encode())
        except (OSError, EOFError, BrokenPipeError) as exc:
            raise CandidateGone(f"the candidate's process is gone ({exc})") from None

    def ack(self) -> None:
        """Answer an event the candidate's process waits on (torch.compile's, once the lease is as it needs)."""
        try:
            self.conn.send_bytes(b'{"op": "ack"}')
        except (OSError, EOFError, BrokenPipeError) as exc:
            raise CandidateGone(f"the candidate's process is gone ({exc})") from None

    def _next(self) -> dict[str, Any]:
        """The next message, whatever it is (a ``verdict`` raises, a slot error falls back)."""
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
        if "verdict" in reply:
            raise _verdict_from(reply["verdict"])
        if "slot_error" in reply:
            if self.pool.transport != "ipc":
                raise Verdict(
                    "runtime_error", f"the candidate's process cannot open its slots: {reply['slot_error']}"[:2000]
                )
            raise _HostFallback(str(reply["slot_error"]))
        return reply

    def _await(self, event: str, timeout_s: float | None) -> dict[str, Any] | None:
        """Read until ``event`` arrives (other events go to ``on_event``); None after ``timeout_s``."""
        deadline = None if timeout_s is None else _perf() + timeout_s
        while True:
            if deadline is not None and not self.conn.poll(max(0.0, deadline - _perf())):
                return None
            reply = self._next()
            if reply.get("event") == event:
                return reply
            if "event" in reply:
                self.on_event(str(reply["event"]), reply)
                continue
            raise Verdict("rejected", f"the candidate's process answered before its call was {event}", "tampering")

    def _await_page(self, seq: int) -> tuple[int | None, dict[str, Any] | None]:
        """Spin until the page says ``seq`` is done: (this clock's time then, None), or (None, the
        reply that came first: the call failed, or its process answered without publishing)."""
        page, want, poll = self.page, seq & 0xFFFFFFFF, self.conn.poll
        while True:
            for _ in range(4096):
                if page.done == want:
                    return _perf_ns(), None
            if poll(0):
                reply = self._next()
                if "event" in reply:
                    if reply["event"] != "issued":
                        self.on_event(str(reply["event"]), reply)
                    continue
                return None, reply

    def _final(self) -> dict[str, Any]:
        """The call's report (a late ``issued`` or ``done`` is skipped)."""
        while True:
            reply = self._next()
            if reply.get("event") in ("issued", "done"):
                continue
            if "event" in reply:
                self.on_event(str(reply["event"]), reply)
                continue
            return reply

    def _to_host(self, why: Any) -> None:
        print(f"cudal1: slots moved to host memory: the candidate's process could not open them ({why})",
              file=sys.stderr, flush=True)
        self.pool.use_host()
        self.in_slots, self.out_slots, self.init_slots = [], [], []
        self.host_fallback = True
        self.fallback_reason = str(why)

    def seal(self) -> str:
        """Warm-up is over: the candidate's process seals itself against new processes, and the
        set of processes it has (compile workers, helpers) is fixed for pausing and for the final
        count.  Returns what the seal did (``applied: ...`` / ``refused: ...``)."""
        if not self.sealed:
            reply = self.request("seal")
            self.tree.freeze()
            self.sealed = str(reply.get("sealed") or "refused: no answer")[:300]
        return self.sealed

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
        """Stop the candidate's process and everything it started, in any session or process
        group (:class:`~cudal1.harness.proctree.CandidateTree`), while the reference is timed: no
        thread of theirs can launch work then."""
        if self.pid > 0:
            self.tree.stop()

    def resume(self) -> None:
        if self.pid > 0:
            self.tree.cont()


def _tensor_nodes(desc: Any, depth: int = 0) -> list[dict[str, Any]]:
    """The tensor nodes of an output description, in order (malformed parts are skipped: the
    description is decoded, and judged, separately)."""
    if not isinstance(desc, dict) or depth > 16:
        return []
    if desc.get("t") == "tensor":
        return [desc]
    items = desc.get("items")
    if not isinstance(items, list):
        return []
    if desc.get("t") == "dict":
        return [
            n for pair in items if isinstance(pair, list) and len(pair) == 2 for n in _tensor_nodes(pair[1], depth + 1)
        ]
    return [n for x in items for n in _tensor_nodes(x, depth + 1)]


def described(desc: Any) -> bool:
    """Whether an output description holds a leaf the clean side did not receive as data."""
    if isinstance(desc, dict):
        if desc.get("t") == "obj" or (desc.get("t") == "tensor" and desc.get("slot") is None):
            return True
        items = desc.get("items")
        if isinstance(items, list):
            return any(described(p[1] if desc.get("t") == "dict" and isinstance(p, list) and len(p) == 2 else p)
                       for p in items)
    return False
