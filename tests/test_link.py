"""harness.reference.link, harness.wire, harness.slots: the reference worker's line to the candidate's process, without
processes (a scripted peer on a real pipe)."""

from __future__ import annotations

import json
import multiprocessing as mp

import pytest
import torch

from cudal1.harness.reference.link import CandidateLink
from cudal1.harness.reference.verdict import Verdict
from cudal1.harness.slots import SlotMap, SlotPool
from cudal1.harness.wire import Described, decode_outputs, encode_outputs


def _link(tmp_path, replies):
    """A link whose peer (a thread) answers each request with the next of ``replies`` (events are
    sent ahead of the reply they precede), recording what it was asked."""
    import threading

    mine, theirs = mp.Pipe(duplex=True)
    asked: list[dict] = []
    events: list[dict] = []
    link = CandidateLink(mine, SlotPool(torch.device("cpu"), tmp_path), torch.device("cpu"), 0,
                         lambda e, d: events.append(d))

    def peer():
        queue = list(replies)
        while queue:
            asked.append(json.loads(theirs.recv_bytes()))
            while queue:
                reply = queue.pop(0)
                theirs.send_bytes(json.dumps(reply).encode())
                if "event" not in reply:
                    break

    threading.Thread(target=peer, daemon=True).start()
    return link, asked, events


def test_the_candidate_cannot_declare_itself_ok(tmp_path):
    link, _, _ = _link(tmp_path, [{"verdict": {"status": "ok", "message": "trust me"}}])
    with pytest.raises(Verdict) as v:
        link.request("noop")
    assert v.value.status == "rejected" and "tampering" in v.value.flags


def test_failures_keep_only_known_flags(tmp_path):
    link, _, _ = _link(tmp_path, [{"verdict": {"status": "incorrect", "flags": ["value_mismatch", "made_up"],
                                               "compile_log": 3}}])
    with pytest.raises(Verdict) as v:
        link.request("noop")
    assert v.value.status == "incorrect" and v.value.flags == ["value_mismatch"] and "compile_log" not in v.value.extra


def test_events_are_handed_on_and_the_reply_returned(tmp_path):
    link, _, events = _link(tmp_path, [{"event": "building", "on": True}, {"event": "building", "on": False},
                                       {"imported": True}])
    assert link.request("noop") == {"imported": True}
    assert [e.get("on") for e in events] == [True, False]


def test_slots_move_to_host_memory_when_the_peer_cannot_open_them(tmp_path):
    """A slot the candidate's process cannot open (an IPC handle of another uid) is not the
    candidate's fault: the request is staged again in host memory and sent again."""
    link, asked, _ = _link(tmp_path, [{"slot_error": "CudaCallError: cudaIpcOpenMemHandle failed"},
                                      {"out": {"t": "py", "v": 1}, "ms": 0.5}])
    link.pool.transport = "ipc"  # as on a GPU
    out, ms = link.call([3], None, "trial 0")
    assert out == 1 and ms == 0.5 and link.host_fallback and link.pool.transport == "file"
    assert [a["op"] for a in asked] == ["call", "call"]
    # the verdict's environment.slots says so, with the reason
    assert link.transport() == "host_files (CUDA IPC failed: CudaCallError: cudaIpcOpenMemHandle failed)"


def test_a_second_slot_failure_is_a_runtime_error(tmp_path):
    link, _, _ = _link(tmp_path, [{"slot_error": "no"}])
    with pytest.raises(Verdict) as v:  # host slots failed too: nothing left to try
        link.call([3], None, "trial 0")
    assert v.value.status == "runtime_error"


def test_outputs_round_trip_through_slots_and_descriptions(tmp_path):
    pool = SlotPool(torch.device("cpu"), tmp_path)
    ref = (torch.ones(2, 3), torch.zeros(4))
    from cudal1.harness.wire import output_targets

    targets = output_targets(ref, pool, [])
    peer = SlotMap(torch.device("cpu"))
    peer.update([s.describe() for s in pool.slots.values()])
    desc = encode_outputs((torch.full((2, 3), 7.0), torch.zeros(5)), targets, peer, "cpu")
    out = decode_outputs(json.loads(json.dumps(desc)), pool)
    assert torch.equal(out[0], torch.full((2, 3), 7.0))
    assert isinstance(out[1], Described)  # another shape: judged from its description, no data sent
    assert out[1].problem("cpu", ref[1]) == ("shape_mismatch", "shape (5,), want (4,)")
    with pytest.raises(ValueError):
        decode_outputs({"t": "tensor", "slot": 99, "dtype": "float32", "shape": [1]}, pool)


def test_a_join_probe_is_read_only_when_well_formed(tmp_path):
    """The candidate's process reports its join probe with the first warm-up call; the verdict
    only shows it, and anything but a short list of finite numbers reads as no probe."""
    replies = [{"host_ms": [0.5], "join_ms": [0.02, 0.03]}, {"host_ms": [0.4], "join_ms": [1.0, float("inf")]},
               {"host_ms": [0.4], "join_ms": "fast"}, {"host_ms": [0.4], "join_ms": [True]},
               {"host_ms": [0.4], "join_ms": [0.01] * 101}]
    replies[1]["join_ms"] = [1.0, "Infinity"]  # JSON has no inf: a string is what could arrive
    link, asked, _ = _link(tmp_path, replies)
    x = torch.ones(4)
    assert link.warmup([x], join=True) == ([0.5], [0.02, 0.03])
    assert asked[0]["join"] is True
    for _ in range(4):
        assert link.warmup([x])[1] == []
    assert asked[1]["join"] is False


def test_the_timing_phase_sizes_output_slots_from_a_layout_that_holds_no_memory(tmp_path):
    """The timing phase keeps the reference's warm-up output only as a layout (``layout_only``:
    meta tensors of the same dtypes and shapes, the tree's structure kept): the candidate's output
    slots come out the same as from the real output, and no output-sized tensor stays alive through
    the timed calls (on level1/38, 8 GiB each: the reference worker held 72 GiB and a candidate ran
    out of memory beside it, H200, 2026-12-03)."""
    from cudal1.harness.reference.refwindow import layout_only
    from cudal1.harness.wire import output_targets

    real = {"y": (torch.ones(2, 3), torch.zeros(4, dtype=torch.float64)), "n": 3}
    layout = layout_only(real)
    assert layout["n"] == 3 and all(t.device.type == "meta" for t in layout["y"])
    assert [(t.dtype, t.shape) for t in layout["y"]] == [(t.dtype, t.shape) for t in real["y"]]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    from_real = output_targets(real, SlotPool(torch.device("cpu"), tmp_path / "a"), [])
    from_layout = output_targets(layout, SlotPool(torch.device("cpu"), tmp_path / "b"), [])
    assert [{k: v for k, v in t.items() if k != "slot"} for t in from_layout] == \
        [{k: v for k, v in t.items() if k != "slot"} for t in from_real]


def test_the_reference_window_lets_go_of_its_output_targets_and_input_buffers_when_released():
    """After the timed calls the reference window's output targets and masked-input buffers are
    dropped (``RefWindow.release``) before the address-reuse probe allocates its own: on an 80 GB
    H100 a baseline of level1/19 (6 GiB tensors) ran out of memory in that probe alone, the worker
    holding them (2026-12-05)."""
    import weakref

    from cudal1.harness.reference.refwindow import RefWindow

    class Owner:
        device = torch.device("cpu")

    refs = RefWindow(Owner(), None, None, None, {"y": torch.ones(64)}, None)
    buffer = refs._buffer(0, 256)
    held = [weakref.ref(refs.targets[0]), weakref.ref(buffer)]
    del buffer
    assert all(r() is not None for r in held)
    refs.release()
    assert refs.targets == [] and refs.buffers == []
    assert all(r() is None for r in held)
