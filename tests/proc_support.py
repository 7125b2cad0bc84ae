"""Finding the processes a test's fixture started, by what is on their command line (helpers
started in sessions of their own are no child of the test), and waiting until they are gone."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from cudal1.harness.proctree import state_of


def live_processes_with(*markers: bytes) -> list[int]:
    """Live (not zombie) processes whose command line holds every one of ``markers``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if all(m in cmdline for m in markers) and state_of(int(entry)) not in ("", "Z"):
            found.append(int(entry))
    return found


def left_running(*markers: bytes, wait_s: float = 5.0) -> list[int]:
    """The processes with ``markers`` still running after ``wait_s`` (a killed process takes a
    moment to be gone); each is killed before this returns, so a failing test leaves none."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and live_processes_with(*markers):
        time.sleep(0.05)
    left = live_processes_with(*markers)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left
