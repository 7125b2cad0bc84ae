"""Read finished (or running) runs for reporting: read-only, typed, whole.

Contract: :func:`load_runs` takes run directories (holding ``cudal1.sqlite``) or store files and
returns a :class:`RunData`.  The store is opened read-only (``mode=ro``; a store that cannot get
its WAL index there, e.g. a copy in a read-only folder, as an immutable snapshot): reporting never
creates, migrates or writes a store, so a missing path is an error rather than a new empty file.  Several
runs are merged per task (by task hash); a candidate judged under several judge configurations
keeps its most recent verdict.  The reference anchor of an optimize run (``ModelNew = Model``,
label ``reference``) is kept apart from the candidates.  A run directory's
``verify_report.json`` (written by ``cudal1 verify``) and ``evaluation.json`` (written by
``cudal1 evaluate``: its rates and pass@k) are read too.

Errors (:class:`ReportError`, one line): a path that does not exist, a file that is not a run
store or has an unknown schema version, runs without any judged candidate (a store holding only
baselines, as ``cudal1 baseline`` writes, is fine beside a run with verdicts).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from cudal1.types import EvalResult, Task

STORE_NAME = "cudal1.sqlite"
EVALUATION_NAME = (
    "evaluation.json"  # what ``cudal1 evaluate`` writes beside its store (cudal1.train.evaluation.evaluate.SUMMARY)
)
SCHEMA_VERSION = "1"  # the run store's schema this reader understands (cudal1.store.SCHEMA_VERSION)


class ReportError(ValueError):
    """Unusable report input (missing run, empty store, unreadable file)."""


@dataclass
class CandidateRecord:
    hash: str
    source: str
    label: str = ""
    meta: dict[str, Any] = field(default_factory=dict)  # policy, round, model, builtin passes ...
    result: EvalResult | None = None  # latest verdict; None while not judged
    analysis: str = ""  # the model's Performance Analysis, when a response produced this candidate

    @property
    def round(self) -> int | None:
        r = self.meta.get("round")
        return int(r) if isinstance(r, int) else None

    @property
    def passes(self) -> list[str]:
        """The builtin policy's pass chain (empty for other policies)."""
        inner = self.meta.get("meta")
        return list(inner.get("passes") or []) if isinstance(inner, dict) else []


@dataclass
class TaskRecord:
    task: Task
    reference: EvalResult | None = None  # the anchor's verdict (ModelNew = Model), when judged
    candidates: list[CandidateRecord] = field(default_factory=list)
    baselines: dict[str, EvalResult] = field(default_factory=dict)  # mode -> latest baseline verdict
    run: str = ""  # the run it was read from (first one when merged)


@dataclass
class RunData:
    paths: list[str]
    tasks: list[TaskRecord]
    environments: list[dict[str, Any]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)  # kind, status, config of each recorded run
    audit: dict[str, Any] | None = None  # a verify run's verify_report.json
    evaluations: list[dict[str, Any]] = field(
        default_factory=list
    )  # each ``cudal1 evaluate`` run's evaluation.json, with "run"


def store_path(path: str | Path) -> Path:
    """The store file of a run directory or store path (ReportError when there is none)."""
    p = Path(path)
    if p.is_dir():
        p = p / STORE_NAME
    if not p.exists():
        raise ReportError(f"no run at {path} (expected a run directory with {STORE_NAME}, or a store file)")
    return p


def _open(path: Path, immutable: bool) -> tuple[sqlite3.Connection, Any]:
    uri = f"file:{quote(str(path.resolve()))}?mode=ro" + ("&immutable=1" if immutable else "")
    conn = sqlite3.connect(uri, uri=True)
    try:
        return conn, conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except BaseException:
        conn.close()
        raise


def _connect(path: Path) -> sqlite3.Connection:
    try:
        try:
            conn, version = _open(path, immutable=False)
        except sqlite3.OperationalError:
            # a WAL-mode store copied where it cannot be written (fetched results, a read-only
            # mount) cannot get its -shm file: read it as an immutable snapshot instead
            conn, version = _open(path, immutable=True)
    except sqlite3.DatabaseError as exc:
        raise ReportError(f"cannot read run store {path}: {exc}") from None
    if version is None or str(version[0]) != SCHEMA_VERSION:
        conn.close()
        raise ReportError(
            f"run store {path} has schema version {version and version[0]!r}; this reader knows {SCHEMA_VERSION}"
        )
    return conn


def _anchor_hash(task: Task) -> str:
    from cudal1.types import reference_candidate

    return reference_candidate(task).hash


def _read_store(path: Path, into: dict[str, TaskRecord], data: RunData, baselines: list) -> int:
    """Merge one store into ``into`` (task hash -> record) and ``baselines`` ((task hash, mode,
    verdict), attached once every store is read: a baseline store holds no task rows); returns
    the number of verdicts read."""
    conn = _connect(path)
    try:
        for name, source, level, pid, origin, h in conn.execute(
                "SELECT name, source, level, problem_id, origin, hash FROM tasks ORDER BY added_at, rowid"):
            if h not in into:
                into[h] = TaskRecord(
                    Task(name=name, source=source, level=level, problem_id=pid, origin=origin), run=str(path)
                )
        verdicts: dict[tuple[str, str], EvalResult] = {}
        for th, ch, blob in conn.execute(
            "SELECT task_hash, candidate_hash, result_json FROM evaluations ORDER BY created_at, id"
        ):
            verdicts[(th, ch)] = EvalResult.from_dict(json.loads(blob))
        analyses = {ch: text for ch, text in conn.execute(
            "SELECT candidate_hash, analysis FROM responses WHERE candidate_hash IS NOT NULL ORDER BY id")}
        anchors = {th: _anchor_hash(rec.task) for th, rec in into.items()}
        for h, th, source, label, meta in conn.execute(
                "SELECT hash, task_hash, source, label, meta_json FROM candidates ORDER BY added_at, rowid"):
            rec = into.get(th)
            if rec is None:
                continue
            result = verdicts.get((th, h))
            if h == anchors[th]:
                rec.reference = result or rec.reference
                continue
            known = next((c for c in rec.candidates if c.hash == h), None)
            if known is None:
                rec.candidates.append(
                    CandidateRecord(h, source, label, json.loads(meta or "{}"), result, analyses.get(h, ""))
                )
            elif result is not None:
                known.result = result
        for th, mode, blob in conn.execute("SELECT task_hash, mode, result_json FROM baselines ORDER BY created_at"):
            baselines.append((th, mode, EvalResult.from_dict(json.loads(blob))))
        for (blob,) in conn.execute("SELECT json FROM environments"):
            env = json.loads(blob)
            if env not in data.environments:
                data.environments.append(env)
        for kind, config, status in conn.execute("SELECT kind, config_json, status FROM runs ORDER BY id"):
            data.runs.append({"store": str(path), "kind": kind, "status": status, "config": json.loads(config)})
        return len(verdicts)
    except sqlite3.DatabaseError as exc:
        raise ReportError(f"cannot read run store {path}: {exc}") from None
    finally:
        conn.close()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ReportError(f"cannot read {path}: {exc}") from None
    if not isinstance(doc, dict):
        raise ReportError(f"cannot read {path}: not a JSON object")
    return doc


def load_runs(paths: list[str | Path]) -> RunData:
    """Read and merge the runs at ``paths`` (see the module docstring)."""
    if not paths:
        raise ReportError("no run given")
    data = RunData([str(p) for p in paths], [])
    into: dict[str, TaskRecord] = {}
    verdicts, baselines = 0, []
    for p in paths:
        store = store_path(p)
        verdicts += _read_store(store, into, data, baselines)  # a baselines-only store adds baselines
        audit = store.parent / "verify_report.json"
        if audit.exists():
            data.audit = _read_json(audit)
        evaluation = store.parent / EVALUATION_NAME
        if evaluation.exists():
            data.evaluations.append(_read_json(evaluation) | {"run": str(store.parent)})
    for th, mode, result in baselines:  # in recording order: the latest measurement of a mode wins
        if th in into:
            into[th].baselines[mode] = result
    if verdicts == 0:
        where = f"run store {store_path(paths[0])} holds" if len(paths) == 1 else "these runs hold"
        raise ReportError(f"{where} no judged candidate")
    data.tasks = sorted(into.values(), key=lambda r: (r.task.level is None, r.task.level or 0,
                                                      r.task.problem_id or 0, r.task.task_id))
    return data
