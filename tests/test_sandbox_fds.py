"""The worker's descriptor hygiene must not hand other files' descriptors to multiprocessing.

A judge worker (forked from the forkserver) closes every inherited descriptor, including the
resource tracker's pipe.  If multiprocessing still believes that pipe is open, the first
semaphore the worker creates (torch.compile's compile pool creates some) probes the old number,
finds it "dead" and closes it, although that number now belongs to another file; on the H200 it
was the CUDA driver's, and compiled candidates failed at random with cudaErrorOperatingSystem.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.cpu  # starts processes: the CPU tier (tests/tiers.py)

SCRIPT = textwrap.dedent('''
    import json, os, sys, warnings
    import multiprocessing as mp
    from cudal1.harness.parent import sandbox

    def child(path, forget):
        sandbox._close_inherited_fds([])
        if forget:
            sandbox._forget_inherited_helpers()
        opened = [os.open(os.devnull, os.O_RDONLY) for _ in range(64)]  # e.g. the CUDA driver's files
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mp.get_context("forkserver").Lock()  # registers a semaphore with the resource tracker
        closed = [fd for fd in opened if not os.path.exists(f"/proc/self/fd/{fd}")]
        with open(path, "w") as f:
            json.dump({"closed": closed, "warnings": [str(w.message) for w in caught]}, f)

    if __name__ == "__main__":
        from multiprocessing import resource_tracker
        resource_tracker.ensure_running()  # as the judge's forkserver has one
        ctx = sandbox.get_context()
        out = {}
        for forget in (False, True):
            path = sys.argv[1] + str(forget)
            p = ctx.Process(target=child, args=(path, forget))
            p.start()
            p.join(60)
            out[str(forget)] = json.load(open(path))
        print(json.dumps(out))
''')


def test_worker_never_lets_multiprocessing_close_a_reused_descriptor(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    fixed = out["True"]
    assert fixed["closed"] == [] and not any("died unexpectedly" in w for w in fixed["warnings"]), fixed
    # The control shows the hazard the fix removes (multiprocessing's behaviour on this Python).
    hazard = out["False"]
    assert hazard["closed"] or any("died unexpectedly" in w for w in hazard["warnings"]), hazard
