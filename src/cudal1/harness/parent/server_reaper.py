"""Imported only by the workers' forkserver, as the last module of its preload
(:data:`cudal1.harness.parent.launcher.PRELOAD`): it makes the forkserver a child subreaper.

Why: the candidate's process is a subreaper itself (:func:`cudal1.harness.proctree.become_subreaper`),
so what it starts stays in its tree while it lives.  When it dies first (it exits, crashes, or a
seal ends it), the kernel re-parents its children to the nearest living subreaper above it, and
without this one that is ``init``: a helper in a session of its own would outlive the job (seen
on the CPU judge; on a GPU it would load the device for later jobs).  With the forkserver as the
subreaper such a helper becomes the server's child, where the judging process finds and kills it
(:func:`cudal1.harness.parent.sandbox.kill_orphans`).  The server reaps them like its own children;
the warning it would print for each unexpected pid is silenced here.
"""

from __future__ import annotations

import warnings

from cudal1.harness.proctree import become_subreaper

SUBREAPER = become_subreaper()
warnings.filterwarnings("ignore", message="forkserver: waitpid returned unexpected pid")
