"""Algebraic graph rewrites for the builtin policy (torch.fx on the meta device).

Contract: :func:`rewrite_task` returns a :class:`RewriteOutcome` for a task source and a list of
graph-pass names (see :data:`~cudal1.rewrite.registry.REWRITES`): the ``ModelNew``
class source that applies every pass that matched, or an ``error`` saying why nothing was
produced.  Tracing executes the task's code, so it always happens in a child process (the judge's
rule: untrusted code never runs in the calling process) with no GPU visible, bounded by
``timeout_s``.  The outcome is plain data; nothing here imports the judge.

Outcomes are cached on disk (``cache_dir``, default ``$CUDAL1_CACHE_DIR/rewrites``, i.e.
``~/.cache/cudal1/rewrites``), one JSON file per (task source, pass list, digest of this package's
code), so a resumed or repeated run does not trace again and a cache built on a CPU machine serves
a GPU run; ``cache=False`` bypasses it.  A timeout is cached (a task that slow to trace declines in
every later run of the same code); a child crash is not.
:func:`rewrite_variants` computes several pass lists for one task in one child process.
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

ALGEBRAIC_REWRITES = (
    "simplify", "diag-broadcast", "matmul-chain", "fold-batchnorm", "fold-linear", "reduce-through-linear",
    "sdpa",
)
REWRITE_NAMES = ALGEBRAIC_REWRITES + ("triton-fusion", "gemm-3xtf32", "triton-reduce")


@dataclass
class RewriteOutcome:
    class_source: str = ""  # the ModelNew class (and any imports it needs); "" when nothing applied
    applied: list[str] = field(default_factory=list)  # rewrites that changed something, in order
    notes: dict[str, list[str]] = field(default_factory=dict)  # per pass: one line per rewrite
    declined: dict[str, str] = field(default_factory=dict)  # per pass: why it did not apply
    error: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.class_source)


def rewrite_task(source: str, passes: list[str] | tuple[str, ...] = ALGEBRAIC_REWRITES, timeout_s: float = 180.0,
                 cache: bool = True, cache_dir: str | os.PathLike[str] | None = None) -> RewriteOutcome:
    """Trace ``source`` in a child process and apply ``passes`` (see module docstring)."""
    return rewrite_variants(source, [tuple(passes)], timeout_s, cache, cache_dir)[0]


def rewrite_variants(source: str, variants: list[tuple[str, ...]], timeout_s: float = 180.0, cache: bool = True,
                     cache_dir: str | os.PathLike[str] | None = None) -> list[RewriteOutcome]:
    """One outcome per pass list in ``variants`` (in order), each as :func:`rewrite_task` would give
    it; the variants not in the cache are computed by one child process (the task is executed and
    torch imported once), which may take ``timeout_s`` per variant."""
    for passes in variants:
        unknown = [p for p in passes if p not in REWRITE_NAMES]
        if unknown:
            raise ValueError(f"unknown rewrite(s) {', '.join(unknown)}; known: {', '.join(REWRITE_NAMES)}")
    paths = [_cache_path(source, passes, cache_dir) if cache else None for passes in variants]
    outcomes: list[RewriteOutcome | None] = [_read(path) for path in paths]
    todo = [i for i, o in enumerate(outcomes) if o is None]
    if todo:
        fresh = _run_child(source, [tuple(variants[i]) for i in todo], timeout_s * len(todo))
        for i, (outcome, cacheable) in zip(todo, fresh):
            outcomes[i] = outcome
            if paths[i] is not None and cacheable:
                _write(paths[i], outcome)
    return [o for o in outcomes if o is not None]


def _read(path: Path | None) -> RewriteOutcome | None:
    if path is None or not path.is_file():
        return None
    try:
        return RewriteOutcome(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None  # unreadable entry: trace again and overwrite it


def _write(path: Path, outcome: RewriteOutcome) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(outcome), indent=0, sort_keys=True))
        os.replace(tmp, path)  # atomic: concurrent runs never read half an entry
    except OSError:
        pass  # a read-only cache only costs a re-trace


def _run_child(source: str, variants: list[tuple[str, ...]], timeout_s: float) -> list[tuple[RewriteOutcome, bool]]:
    """(outcome, cacheable) per variant; a timeout or a crash fails every variant (a crash uncached)."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONWARNINGS="ignore")
    try:
        proc = subprocess.run([sys.executable, "-m", "cudal1.rewrite.tracing_process"],
                              input=json.dumps({"source": source, "variants": [list(v) for v in variants]}),
                              capture_output=True, text=True, timeout=timeout_s, env=env, start_new_session=True)
    except subprocess.TimeoutExpired:  # cached: a task this slow to trace is not traced again by every run
        return [(RewriteOutcome(error=f"graph rewrite timed out after {timeout_s:.0f} s"), True)] * len(variants)
    try:
        answers = json.loads(proc.stdout)["outcomes"]
    except (json.JSONDecodeError, KeyError, TypeError):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        return [(RewriteOutcome(error=f"graph rewrite child failed: {tail[0][:300]}"), False)] * len(variants)
    return [(RewriteOutcome(class_source=d.get("class_source", ""), applied=d.get("applied", []),
                            notes=d.get("notes", {}), declined=d.get("declined", {}), error=d.get("error", "")), True)
            for d in answers]


@functools.lru_cache(maxsize=1)
def _code_key() -> str:
    """Digest of this package's sources: a change to any pass invalidates the cache.  The torch
    version is not part of the key, so a cache built on one machine (e.g. a CPU one preparing a GPU
    run) serves another: a rewrite is verified by the judge wherever it runs, so an entry made
    under another torch can cost a candidate (a failed verdict), never a wrong verdict."""
    digest = hashlib.sha256()
    for f in sorted(Path(__file__).parent.rglob("*.py")):
        digest.update(f.name.encode() + f.read_bytes())
    return digest.hexdigest()


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where outcomes are cached: ``cache_dir``, else ``$CUDAL1_CACHE_DIR/rewrites`` (default
    ``~/.cache/cudal1/rewrites``)."""
    if cache_dir:
        return Path(cache_dir)
    return Path(os.environ.get("CUDAL1_CACHE_DIR") or "~/.cache/cudal1").expanduser() / "rewrites"


def _cache_path(source: str, passes: tuple[str, ...] | list[str], cache_dir: str | os.PathLike[str] | None) -> Path:
    key = hashlib.sha256("\0".join([_code_key(), ",".join(passes), source]).encode()).hexdigest()
    return cache_root(cache_dir) / f"{key[:40]}.json"
