"""The test tiers, each runnable alone:

    python -m pytest -m unit     in-process tests: parsing, prompts, metrics, config, scans (fast)
    python -m pytest -m cpu      tests that start processes: the real subprocess judge, the CLI,
                                 a local Ray cluster, training runs on the CPU
    python -m pytest -m gpu      tests that need a CUDA GPU (skipped without one)

A test is in the ``cpu`` or ``gpu`` tier when it (or its class or module: ``pytestmark``) carries
that marker; every other test is a ``unit`` test. A unit test runs in the pytest process only:
starting a child process (``subprocess``, ``os.fork``/``posix_spawn``/``system``,
``multiprocessing``) fails it, with a message saying to mark it ``cpu``, so the fast tier stays
fast without anyone keeping a list. ``tests/conftest.py`` wires these hooks in.
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import subprocess
from collections.abc import Iterator

import pytest

MARKED_TIERS = ("cpu", "gpu")
# one-line system probes libraries run on their own (ctypes.util.find_library, platform.processor,
# platform.architecture, distro): not the test starting processes
SYSTEM_PROBES = frozenset({"ldconfig", "uname", "file", "lsb_release"})


class ProcessInUnitTest(RuntimeError):
    """A unit test tried to start a child process."""


_started: dict[str, str] = {}  # nodeid -> what it tried to start


def _message(nodeid: str, what: str) -> str:
    return (f"{nodeid} started a child process ({what}); unit tests run in the pytest process only: "
            "mark it @pytest.mark.cpu (the CPU tier, see tests/tiers.py)")


def mark_tiers(items: list[pytest.Item]) -> None:
    """Give every test without a ``cpu`` or ``gpu`` marker the ``unit`` marker."""
    for item in items:
        if not any(item.get_closest_marker(name) for name in MARKED_TIERS):
            item.add_marker(pytest.mark.unit)


def _command(args: object) -> str:
    first = args if isinstance(args, (str, bytes, os.PathLike)) else next(iter(args), "")  # type: ignore[call-overload]
    return os.path.basename(os.fsdecode(first).split(" ")[0])


@contextlib.contextmanager
def _no_child_processes(nodeid: str) -> Iterator[None]:
    def refuse(what: str):
        def start(*args, **kwargs):
            _started.setdefault(nodeid, what)
            raise ProcessInUnitTest(_message(nodeid, what))
        return start

    execute_child = subprocess.Popen._execute_child

    def popen(self, args, *rest, **kwargs):
        if _command(args) in SYSTEM_PROBES:
            return execute_child(self, args, *rest, **kwargs)
        return refuse(f"subprocess {_command(args)}")()

    patches = [(subprocess.Popen, "_execute_child", popen),
               (multiprocessing.process.BaseProcess, "start", refuse("multiprocessing"))]
    patches += [(os, name, refuse(f"os.{name}")) for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp",
                                                              "system") if hasattr(os, name)]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for owner, name, replacement in patches:
            setattr(owner, name, replacement)
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if item.get_closest_marker("unit") is None:
        yield
        return
    with _no_child_processes(item.nodeid):  # setup (fixtures included), call and teardown
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    what = _started.get(item.nodeid)
    if what and report.when in ("setup", "call") and not report.skipped:
        # whatever the test made of the refusal (swallowed it, failed on a consequence), the cause is this
        report.outcome = "failed"
        report.longrepr = _message(item.nodeid, what)
