"""harness.child.signing_hook, in a child interpreter (a hook cannot be removed once installed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cudal1.harness.channel import Message, Receiver

pytestmark = pytest.mark.cpu  # starts processes: the CPU tier (tests/tiers.py)

_AUDIT_SCRIPT = r'''
import os, sys, traceback
from cudal1.harness.child import signing_hook

CAND = "/nonexistent/cand_under_test.py"
scenario, fd = sys.argv[1], int(sys.argv[2])

def send(kind, payload):
    sys.audit("cudal1.channel", kind, payload)

def finish(status):
    send("result", '{"status": "%s"}' % status)

def env(name):
    send("phase" if scenario == "reference_kind" else "env", '{"name": "%s"}' % name)

def run():
    env("cpu")
    if scenario == "library_frames":  # the standard library reading frames for the judge or the candidate
        try:
            1 / 0
        except ZeroDivisionError:
            traceback.format_exc()
    if scenario == "inventory_no_leak":  # the inventory must not keep its callers' locals alive
        import gc, weakref
        gc.disable()
        class Big: pass
        def call():
            big = Big()
            INVENTORY[0]()
            return weakref.ref(big)
        refs = [call() for _ in range(3)]
        assert all(r() is None for r in refs), "the thread inventory kept a caller's locals alive"
    if scenario == "library_trace":  # the judge's own code: no call of it may install a hook either
        sys.settrace(None)
    if scenario in CANDIDATE:
        exec(compile(CANDIDATE[scenario], CAND, "exec"), {"finish": finish, "send": send, "sys": sys})
    finish("ok")
    if scenario == "twice":
        finish("ok")

CANDIDATE = {
    "forge_finish": "finish('ok')",
    "forge_event": "sys.audit('cudal1.channel', 'result', '{\"status\": \"ok\"}')",
    "tb_frame": "try:\n    1/0\nexcept Exception as e:\n    f = getattr(e.__traceback__, 'tb_' + 'frame')",
    "getframe": "getattr(sys, '_get' + 'frame')(0)",
    "inspect_stack": "import inspect\ngetattr(inspect, 'st' + 'ack')()",
    "gc": "import gc\ngc.get_referrers(sys)",
    "current_frames": "sys._current_frames()",
    "trace": "sys.setprofile(None)",
    "trace_via_library": "import bdb\nbdb.Bdb().set_trace()",
    "thread_forge": "import threading\nt = threading.Thread(target=finish, args=('ok',))\nt.start()\nt.join()",
}

INVENTORY = []

def entry():
    INVENTORY[:] = [signing_hook.install(b"k" * 32, fd, candidate_path=CAND, bottom=sys._getframe(), send=send,
                                         chain=[finish, env, run], register=entry)]
    run()

entry()
os._exit(0)
'''


def _audit_run(scenario: str) -> list[Message]:
    import os
    import struct

    r, w = os.pipe()
    try:
        proc = subprocess.run([sys.executable, "-c", _AUDIT_SCRIPT, scenario, str(w)], pass_fds=(w,), timeout=120,
                              capture_output=True, text=True)
        os.close(w)
        w = -1
        data = b""
        while chunk := os.read(r, 1 << 16):
            data += chunk
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
    rx, out, pos = Receiver(b"k" * 32), [], 0
    while pos < len(data):
        (n,) = struct.unpack("!i", data[pos:pos + 4])
        out.append(rx.decode(data[pos + 4:pos + 4 + n]))
        pos += 4 + n
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


class TestAuditGuard:
    def test_the_protocol_chain_signs(self):
        msgs = _audit_run("protocol")
        assert [(m.kind, m.data) for m in msgs] == [("env", {"name": "cpu"}), ("result", {"status": "ok"})]

    def test_only_the_candidate_process_kinds_are_signed(self):
        """Phases and verdicts are the reference worker's: the candidate's process cannot send one."""
        (msg,) = _audit_run("reference_kind")
        assert msg.kind == "tamper" and "outside the judge's protocol" in msg.data["reason"]

    def test_library_code_may_read_frames(self):
        assert [m.kind for m in _audit_run("library_frames")] == ["env", "result"]

    def test_one_verdict_only(self):
        assert [m.kind for m in _audit_run("twice")] == ["env", "result"]

    def test_thread_inventory_keeps_no_frames_alive(self):
        assert [m.kind for m in _audit_run("inventory_no_leak")] == ["env", "result"]

    @pytest.mark.parametrize("scenario, reason", [
        ("forge_finish", "outside the judge's protocol"),
        ("forge_event", "outside the judge's protocol"),
        ("thread_forge", "another thread"),
        ("tb_frame", "tb_frame"),
        ("getframe", "sys._getframe"),
        ("inspect_stack", "sys._getframe"),
        ("gc", "gc.get_referrers"),
        ("current_frames", "sys._current_frames"),
        ("trace", "trace/profile hook (sys.setprofile)"),
        ("trace_via_library", "trace/profile hook (sys.settrace)"),
        ("library_trace", "trace/profile hook (sys.settrace)"),
    ])
    def test_candidate_reaching_for_the_judge_ends_the_worker(self, scenario, reason):
        if reason == "sys._getframe" and sys.version_info < (3, 11):
            pytest.skip("sys._getframe is an audit event from Python 3.11 on")
        msgs = _audit_run(scenario)
        assert [m.kind for m in msgs] == ["env", "tamper"], msgs
        assert reason in msgs[-1].data["reason"]
