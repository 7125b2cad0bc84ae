"""Algebraic graph rewrites for the builtin policy (torch.fx on the meta device).

Contract: :func:`rewrite_task` returns a :class:`RewriteOutcome` for a task source and a list of
graph-pass names (see :data:`~cudal1.rewrite.passes.GRAPH_PASSES`): the ``ModelNew``
class source that applies every pass that matched, or an ``error`` saying why nothing was
produced.  Tracing executes the task's code, so it always happens in a child process (the judge's
rule: untrusted code never runs in the calling process) with no GPU visible, bounded by
``timeout_s``.  The outcome is plain data; nothing here imports the judge.

Outcomes are cached on disk (``$CUDAL1_CACHE_DIR/rewrites``, default ``~/.cache/cudal1``), keyed
by the task source, the passes, the torch version and a digest of this package's code, so a
resumed or repeated run does not trace again; ``cache=False`` bypasses it.  Timeouts and child
crashes are not cached.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ALGEBRAIC_PASSES = ("simplify", "diag-broadcast", "matmul-chain", "fold-linear", "reduce-through-linear", "sdpa")
GRAPH_PASS_NAMES = ALGEBRAIC_PASSES + ("triton-fusion",)


@dataclass
class RewriteOutcome:
    class_source: str = ""  # the ModelNew class (and any imports it needs); "" when nothing applied
    applied: list[str] = field(default_factory=list)  # graph passes that rewrote something, in order
    notes: dict[str, list[str]] = field(default_factory=dict)  # per pass: one line per rewrite
    declined: dict[str, str] = field(default_factory=dict)  # per pass: why it did not apply
    error: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.class_source)


def rewrite_task(source: str, passes: list[str] | tuple[str, ...] = ALGEBRAIC_PASSES, timeout_s: float = 180.0,
                 cache: bool = True) -> RewriteOutcome:
    """Trace ``source`` in a child process and apply ``passes`` (see module docstring)."""
    unknown = [p for p in passes if p not in GRAPH_PASS_NAMES]
    if unknown:
        raise ValueError(f"unknown graph pass(es) {', '.join(unknown)}; known: {', '.join(GRAPH_PASS_NAMES)}")
    path = _cache_path(source, passes) if cache else None
    if path is not None and path.is_file():
        try:
            return RewriteOutcome(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            pass  # unreadable entry: trace again and overwrite it
    outcome, cacheable = _run_child(source, passes, timeout_s)
    if path is not None and cacheable:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(dataclasses.asdict(outcome)))
            os.replace(tmp, path)  # atomic: concurrent runs never read half an entry
        except OSError:
            pass  # a read-only cache only costs a re-trace
    return outcome


def _run_child(source: str, passes: list[str] | tuple[str, ...], timeout_s: float) -> tuple[RewriteOutcome, bool]:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONWARNINGS="ignore")
    try:
        proc = subprocess.run([sys.executable, "-m", "cudal1.rewrite.child"],
                              input=json.dumps({"source": source, "passes": list(passes)}),
                              capture_output=True, text=True, timeout=timeout_s, env=env, start_new_session=True)
    except subprocess.TimeoutExpired:
        return RewriteOutcome(error=f"graph rewrite timed out after {timeout_s:.0f} s"), False
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        return RewriteOutcome(error=f"graph rewrite child failed: {tail[0][:300]}"), False
    return RewriteOutcome(class_source=data.get("class_source", ""), applied=data.get("applied", []),
                          notes=data.get("notes", {}), declined=data.get("declined", {}),
                          error=data.get("error", "")), True


@functools.lru_cache(maxsize=1)
def _code_key() -> str:
    """torch version + digest of this package's sources (a code change invalidates the cache)."""
    import importlib.metadata

    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "none"
    digest = hashlib.sha256(torch_version.encode())
    for f in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(f.name.encode() + f.read_bytes())
    return digest.hexdigest()


def _cache_path(source: str, passes: list[str] | tuple[str, ...]) -> Path:
    root = Path(os.environ.get("CUDAL1_CACHE_DIR") or "~/.cache/cudal1").expanduser()
    key = hashlib.sha256("\0".join([_code_key(), ",".join(passes), source]).encode()).hexdigest()
    return root / "rewrites" / f"{key[:40]}.json"
