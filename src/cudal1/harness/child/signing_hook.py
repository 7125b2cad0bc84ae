"""The candidate's process's audit hook: sole holder of its channel key, guard on frames, thread
inventory.

Where it stands.  A job is two processes (docs/harness.md): the clean reference worker decides the
verdict and signs it on its own channel; the candidate's process sends the parent only its
environment (with what confined it), its build report, a pre-build's one ``result`` and, from
this hook, ``tamper`` reports.  Nothing it sends can make a verdict ``ok`` (the parent takes
phases and verdicts from the reference worker alone), so this hook is the second line that names
a cheat, not what a verdict rests on.

Why a ``sys.addaudithook`` hook.  Candidate code runs on the same call stack as the process's
protocol code, so anything kept in a Python object (the channel key, the process's own state) is
reachable by walking frames (``exc.__traceback__.tb_frame.f_back.f_locals``), ``gc`` or
``sys.modules``.  An audit hook is the one Python object nothing in Python refers to (hooks
cannot be listed or removed), and the interpreter calls it *synchronously* whenever code obtains
a frame (``sys._getframe``, ``tb_frame``, ``gi_frame`` ...), walks ``gc``, installs a trace hook,
and so on.  So:

1. **Signing.**  :func:`install` runs in ``candidate_entry`` before any task or candidate code;
   the key is turned into SHA-256 inner/outer states that live only in the hook's closure (the key
   bytes are dropped, the process's ``_args`` cleared, the pipe descriptor duplicated).  The
   process sends by raising the audit event ``cudal1.channel`` (kind, JSON payload); the hook signs
   and writes the message only if the caller of ``sys.audit`` is ``CandidateProcess.send`` and
   every frame from there down to ``candidate_entry``'s own frame, on the main thread, is one of
   the protocol functions in ``chain`` (``setup``, ``import_candidate``, ``finish``, ``run``,
   ``serve``).  Candidate code calling ``send``/``finish``, or raising the event itself, has its
   own frames on that chain: the hook reports ``tamper`` and ends the process.  After a ``result``
   the hook signs nothing else (one-shot).
2. **Frame guard.**  When code from the candidate's file (or running in the candidate module's
   globals, registered once through the event ``cudal1.candidate``) obtains a frame —
   ``sys._getframe``, ``tb_frame``, ``gi_frame``, ``cr_frame``, ``ag_frame``,
   ``inspect.currentframe``/``stack``/``trace``, ``traceback.walk_stack``/``walk_tb``,
   ``logging.currentframe`` — looks up a Python C-API symbol through ``ctypes``, replaces a
   function's ``__code__`` or adds an audit hook, the hook reports ``tamper`` before the frame is
   handed over, then ends the process (raising instead would put the hook's own frame into the
   candidate's traceback).  Always refused, whoever asks: ``gc``'s object-graph walkers,
   ``sys._current_exceptions``, ``sys._current_frames`` (except the inventory below),
   trace/profile/monitoring hooks (none is excepted: the judge's profiler, torch.profiler
   without ``with_stack``, installs none, and an exception for the judge's profiled call would
   also cover the candidate code that call runs).  Library code reading
   frames for its own purposes (Dynamo, ``warnings``, ``traceback.print_exc``, ``enum``) or adding
   its own audit hook (``filelock``) is not candidate code and is left alone.
3. **Thread inventory** (:func:`escaped_threads`, returned by :func:`install`): the only licence
   to call ``sys._current_frames``.  A thread other than the main thread that is running a
   candidate frame, running a C callable directly as a thread/pool target, or holding a pending
   ``threading.Timer`` is work that escaped the call (``side_stream``).

The hook runs no code the candidate could have replaced: every callable it uses is bound in
:func:`install` before candidate code exists, it performs no global or builtin name lookups, it
compares only exact ``str``/``int``/identity values (a ``str`` subclass could run Python code in
``__eq__``), and it disables the cyclic GC while it runs (a finalizer would run on top of the
hook's frame).

What it cannot prevent (docs/harness.md): native code and ``ctypes`` memory reads; code compiled
under another file name with fresh globals (not attributed to the candidate, so it may walk
frames; it still cannot sign); a Python signal handler that fires while the hook itself runs (it
receives the hook's frame); library helpers that read the caller's frame on its behalf (e.g.
``torch.jit``'s resolution callbacks).  Each of these reaches only the candidate's own verdict.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

# Events the hook looks at; everything else returns after one dict lookup.
R_FRAME, R_ALWAYS, R_CURRENT_FRAMES, R_TRACE, R_CHANNEL, R_CANDIDATE, R_GETATTR, R_SETATTR, R_DLSYM = range(9)
_RULES = {
    "sys._getframe": R_FRAME,
    "object.__getattr__": R_GETATTR,
    "object.__setattr__": R_SETATTR,
    "ctypes.dlsym": R_DLSYM,
    "ctypes.dlsym/handle": R_DLSYM,
    "gc.get_objects": R_ALWAYS,
    "gc.get_referrers": R_ALWAYS,
    "gc.get_referents": R_ALWAYS,
    "sys._current_exceptions": R_ALWAYS,
    "sys.addaudithook": R_FRAME,  # libraries add their own (filelock, under torch.compile); they cannot remove ours
    "sys._current_frames": R_CURRENT_FRAMES,
    "sys.settrace": R_TRACE,
    "sys.setprofile": R_TRACE,
    "sys._settraceallthreads": R_TRACE,
    "sys._setprofileallthreads": R_TRACE,
    "sys.monitoring.register_callback": R_TRACE,
    "cudal1.channel": R_CHANNEL,
    "cudal1.candidate": R_CANDIDATE,
}
_FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
_KINDS = ("env", "built", "result", "tamper")  # what the candidate's process sends the parent


def _helper_codes() -> set[int]:
    """Standard-library functions that hand frames to their caller: a candidate calling one of
    them directly is treated as obtaining the frame itself."""
    import inspect
    import logging
    import traceback

    fns: list[Any] = [inspect.currentframe, inspect.stack, inspect.trace, inspect.getouterframes,
                      inspect.getinnerframes, traceback.walk_stack, traceback.walk_tb, logging.currentframe]
    walk = getattr(traceback, "_walk_tb_with_full_positions", None)
    if walk is not None:
        fns.append(walk)
    return {id(fn.__code__) for fn in fns if hasattr(fn, "__code__")}


def _hmac_states(key: bytes) -> tuple[Any, Any]:
    """HMAC-SHA256 inner/outer hash states (C objects): signing needs them, not the key."""
    import hashlib

    block = 64
    if len(key) > block:
        key = hashlib.sha256(key).digest()
    key = key.ljust(block, b"\0")
    inner = hashlib.sha256(bytes(b ^ 0x36 for b in key))
    outer = hashlib.sha256(bytes(b ^ 0x5C for b in key))
    return inner, outer


def install(key: bytes, fd: int, *, candidate_path: str | None, bottom: Any, send: Any, chain: list[Any],
            register: Any) -> Callable[[], list[tuple[int, str]]]:
    """Install the hook (once per process).  ``fd``: the channel's write end (the hook owns it from
    now on); ``bottom``: ``candidate_entry``'s frame; ``send``, ``chain``, ``register``:
    the process's functions whose frames may (respectively) raise ``cudal1.channel``, sit between
    it and ``bottom``, or register the candidate module.  Returns :func:`escaped_threads`."""
    import _thread
    import gc
    import os
    import struct
    import threading
    from concurrent.futures import thread as futures_thread

    # ---- everything the hook touches, bound now (no global/builtin lookups in the hook) ----
    (_FRAME, _ALWAYS, _CURRENT_FRAMES, _TRACE, _CHANNEL, _CANDIDATE, _GETATTR, _SETATTR, _DLSYM) = (
        R_FRAME, R_ALWAYS, R_CURRENT_FRAMES, R_TRACE, R_CHANNEL, R_CANDIDATE, R_GETATTR, R_SETATTR, R_DLSYM)
    _type, _id, _len, _str, _dict, _BaseException = type, id, len, str, dict, BaseException
    _getframe, _current_frames, _get_ident = sys._getframe, sys._current_frames, _thread.get_ident
    _write, _exit = os.write, os._exit
    _pack = struct.Struct("!i").pack  # multiprocessing.Connection framing
    _gc_isenabled, _gc_disable, _gc_enable = gc.isenabled, gc.disable, gc.enable
    lock = _thread.allocate_lock()
    _acquire, _release = lock.acquire, lock.release
    rules_get = dict(_RULES).get  # a private copy: the module's table is reachable by anyone
    frame_attrs = _FRAME_ATTRS
    kind_json = {k: '"' + k + '"' for k in _KINDS}
    kind_json_get = kind_json.get
    helper_ids = frozenset(_helper_codes())
    send_id, register_id = id(send.__code__), id(register.__code__)
    chain_ids = frozenset(id(fn.__code__) for fn in chain)
    cand_path = str(candidate_path) if candidate_path else None
    cand_globals: list[Any] = [None]
    main_tid = _get_ident()
    busy: set[int] = set()
    busy_add, busy_discard = busy.add, busy.discard
    seq = [0]
    done = [False]
    inner, outer = _hmac_states(key)
    del key
    inner_copy, outer_copy = inner.copy, outer.copy

    def write(kind: str, payload: str) -> bool:
        _acquire()
        try:
            if done[0]:
                return False
            body = ('{"seq": %d, "kind": %s, "data": %s}' % (seq[0], kind_json[kind], payload)).encode()
            h = inner_copy()
            h.update(seq[0].to_bytes(8, "little") + body)
            o = outer_copy()
            o.update(h.digest())
            msg = o.digest() + body
            frame = _pack(_len(msg)) + msg
            sent = 0
            while sent < _len(frame):
                sent += _write(fd, frame[sent:])
            seq[0] += 1
            if kind == "result" or kind == "tamper":
                done[0] = True
            return True
        finally:
            _release()

    def die(reason: str) -> None:
        try:
            write("tamper", '{"reason": "' + reason + '"}')
        finally:
            _exit(0)

    def from_candidate(f: Any) -> bool:
        while f is not None and _id(f.f_code) in helper_ids:
            f = f.f_back
        if f is None:
            return False
        filename = f.f_code.co_filename
        if _type(filename) is not _str:
            return True
        if cand_path is not None and filename == cand_path:
            return True
        return cand_globals[0] is not None and f.f_globals is cand_globals[0]

    def judge_chain(f: Any) -> bool:
        """Every frame from ``f`` down to ``bottom`` is one of the process's protocol functions."""
        while f is not None:
            if f is bottom:
                return True
            if _id(f.f_code) not in chain_ids:
                return False
            f = f.f_back
        return False

    def decide(rule: int, event: str, args: tuple, caller: Any, tid: int) -> str:
        """'' when the event may proceed, else the reason for a tamper report."""
        if rule == _FRAME or rule == _GETATTR or rule == _SETATTR or rule == _DLSYM:
            if not from_candidate(caller):
                return ""
            if rule == _DLSYM:
                return "candidate code looked up a Python C-API symbol through ctypes"
            return "candidate code used " + event + ("" if rule == _FRAME else " " + args[1])
        if rule == _ALWAYS:
            return "called " + event + " (walking the judge's objects or hooks)"
        if rule == _CURRENT_FRAMES:
            return "" if caller is not None and _id(caller.f_code) == inventory_id else "called " + event
        if rule == _TRACE:
            return "installed a trace/profile hook (" + event + ")"
        if tid != main_tid or caller is None:
            return "sent on the verdict channel from another thread"
        if rule == _CANDIDATE:
            if (_id(caller.f_code) != register_id or cand_globals[0] is not None or _len(args) != 1
                    or _type(args[0]) is not _dict or not judge_chain(caller.f_back)):
                return "registered a candidate module"
            cand_globals[0] = args[0]
            return ""
        # _CHANNEL
        if _len(args) != 2 or _type(args[0]) is not _str or _type(args[1]) is not _str:
            return "malformed message for the verdict channel"
        kind, payload = args
        if (
            _id(caller.f_code) != send_id
            or kind_json_get(kind) is None
            or kind == "tamper"
            or not judge_chain(caller.f_back)
        ):
            return "sent a message on the verdict channel from outside the judge's protocol"
        if not write(kind, payload):
            return "sent a message after the verdict"
        return ""

    def hook(event: Any, args: Any) -> None:
        if _type(event) is not _str:
            return
        rule = rules_get(event)
        if rule is None:
            return
        if rule == _GETATTR or rule == _SETATTR:
            if _len(args) < 2 or _type(args[1]) is not _str:
                return
            name = args[1]
            if (rule == _GETATTR and name not in frame_attrs) or (rule == _SETATTR and name != "__code__"):
                return
        elif rule == _DLSYM:
            if _len(args) < 2 or _type(args[1]) is not _str or not (args[1][:2] == "Py" or args[1][:3] == "_Py"):
                return
        tid = _get_ident()
        if tid in busy:  # the hook's own frame/code reads
            return
        busy_add(tid)
        gc_on = _gc_isenabled()
        _gc_disable()
        try:
            caller = _getframe(1)
            reason = decide(rule, event, args, caller, tid)
        except _BaseException:
            reason = "the audit guard failed while checking " + event
        finally:
            caller = None
            if gc_on:
                _gc_enable()
            busy_discard(tid)
        if reason:
            die(reason)

    # ---- thread inventory ---------------------------------------------------------------
    run_ids = frozenset({id(threading.Thread.run.__code__), id(futures_thread._WorkItem.run.__code__)})
    boot_ids = frozenset({id(threading.Thread._bootstrap.__code__), id(threading.Thread._bootstrap_inner.__code__)})
    timer_id = id(threading.Timer.run.__code__)

    def escaped_threads() -> list[tuple[int, str]]:
        """Threads (other than the main thread) doing work the call did not wait for:
        running a candidate frame, running a C callable directly as a thread or pool target,
        holding a pending ``threading.Timer``, or still starting/ending (a thread the call
        started may not have reached its target yet).  (ident, description) pairs; the caller
        gives transient states a short grace."""
        found = []
        globs = cand_globals[0]
        frames = _current_frames()
        # Drop the main thread's entry at once: it is this very frame, and binding it to a local
        # would make a frame<->locals cycle that keeps every caller's locals (the outputs of the
        # timed calls) alive until the cyclic GC happens to run.
        frames.pop(main_tid, None)
        for tid, top in frames.items():
            what = ""
            if top is not None and _id(top.f_code) in run_ids:
                what = "a C callable run as a thread/pool target"
            elif top is not None and _id(top.f_code) in boot_ids:
                what = "a thread starting or ending"
            f = top
            while f is not None and not what:
                if globs is not None and f.f_globals is globs:
                    what = f"candidate code ({f.f_code.co_name}, line {f.f_lineno})"
                elif _id(f.f_code) == timer_id:
                    what = "a pending threading.Timer"
                f = f.f_back
            if what:
                found.append((tid, what))
        top = f = frames = None
        return found

    inventory_id = id(escaped_threads.__code__)
    sys.addaudithook(hook)
    return escaped_threads


def clear_process_args() -> None:
    """Drop the references ``multiprocessing`` keeps to the job's arguments (the channel key
    and the job travel as ``Process._args``; ``current_process()`` would hand them to anyone)."""
    import multiprocessing

    proc = multiprocessing.current_process()
    for attr, empty in (("_args", ()), ("_kwargs", {}), ("_target", None)):
        if hasattr(proc, attr):
            setattr(proc, attr, empty)
