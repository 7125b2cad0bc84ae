"""Embedded SQLite run store: tasks, candidates, verdicts, baselines, environments and runs.

Contract
--------
* One file, stdlib :mod:`sqlite3` only (no ORM, no torch).  :class:`RunStore` opens or
  creates it (parent directories included) in WAL mode with ``synchronous=NORMAL``,
  ``foreign_keys=ON`` and a 30 s busy timeout, so several processes may read while one writes.
* Every write method is its own transaction (``BEGIN IMMEDIATE`` … commit).  Once a method
  returns, its row survives the process being killed (SIGKILL included); a write interrupted
  half-way leaves nothing behind.  An OS crash or power loss may lose the last few commits
  (the price of ``synchronous=NORMAL`` in WAL mode) but never corrupts the file.
* Verdicts are :class:`~cudal1.types.EvalResult` values stored whole as JSON
  (``EvalResult.to_dict``) and read back with ``EvalResult.from_dict``; ``status`` and
  ``speedup`` are copied into columns for querying.  An evaluation is identified by
  ``(task_hash, candidate_hash, config_hash)``; recording it again replaces the verdict
  (upsert), which is what makes resuming a run (``has_evaluation``) cheap and idempotent.
* Baselines (reference timings) are keyed by ``(task_hash, mode, env_key, config_hash)`` so a
  number measured on one GPU / torch / CUDA combination is never reused on another.
* The file carries ``schema_version`` in table ``meta``; a file written by an unknown (e.g.
  newer) schema version is refused with :class:`StoreError` rather than misread.
* Thread-safe: one connection opened with ``check_same_thread=False``; every operation holds
  the store's lock, so the evaluator may record from several scheduler threads.

Limits
------
* Rows reference each other by hash only; no foreign-key constraints are declared, so a
  verdict may be recorded before (or without) its task or candidate row.
* No migrations exist yet: schema version 1 is the only one this code reads.
* Timestamps are Unix seconds (float, from :func:`time.time`).
* WAL needs a local filesystem; on filesystems without shared memory (some network mounts)
  SQLite may fall back to another journal mode.
* ``best`` ignores verdicts whose speedup is ``None`` or NaN.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from .store_schema import SCHEMA, SCHEMA_VERSION
from .types import Candidate, EvalResult, Status, Task

__all__ = ["SCHEMA_VERSION", "RunStore", "StoreError"]

BUSY_TIMEOUT_MS = 30_000


class StoreError(RuntimeError):
    """The store file cannot be used (unknown schema version, not a database, ...)."""


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, allow_nan=True, default=str)


def _result_json(result: EvalResult) -> str:
    return _dumps(result.to_dict())


def _load_result(text: str) -> EvalResult:
    return EvalResult.from_dict(json.loads(text))


def _status_value(status: Status | str) -> str:
    return status.value if isinstance(status, Status) else Status(status).value


def _speedup_column(speedup: float | None) -> float | None:
    if speedup is None:
        return None
    value = float(speedup)
    return None if math.isnan(value) else value


class VerdictSpan(NamedTuple):
    """When one recorded verdict ran (:meth:`RunStore.verdict_spans`; wall-clock seconds): its
    task, its kind (``candidate``, or a baseline's mode) and whether it was judged again alone."""

    start: float
    end: float
    task_hash: str
    kind: str
    rejudged_alone: bool


@dataclasses.dataclass(frozen=True)
class RecordedJob:
    """One recorded verdict's footprint (:meth:`RunStore.recorded_jobs`): its task, its kind
    (``candidate``, or a baseline's mode), its wall seconds and GPU memory (MiB, its two processes;
    0: not measured), whether it was judged again alone (out of memory beside other workers,
    contended, or its timed calls blocked beside them) and, where it was for blocked calls
    (``figures["rejudged_alone"]``), that; and an ``ok`` verdict's blocked timed calls
    (``figures["blocked_calls"]``; None otherwise)."""

    task_hash: str
    kind: str
    wall_s: float
    gpu_memory_mib: int
    rejudged_alone: bool
    rejudged_for_blocked_calls: bool = False
    blocked_calls: dict[str, Any] | None = None


class RunStore:
    """The SQLite run store at ``path`` (see the module docstring for the contract)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        memory = str(path) == ":memory:"
        if not memory:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        # isolation_level=None: no implicit transactions; every write opens its own with
        # BEGIN IMMEDIATE (see _tx), so the write lock is taken up front, never upgraded.
        self._conn = sqlite3.connect(
            ":memory:" if memory else str(self.path),
            timeout=BUSY_TIMEOUT_MS / 1000,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            self._init()
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            raise StoreError(f"cannot open run store {self.path}: {exc}") from None
        except BaseException:
            self._conn.close()
            raise

    # -- lifecycle -----------------------------------------------------------------------------

    def _init(self) -> None:
        conn = self._conn
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA foreign_keys = ON")
        self._check_version()
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        with self._tx():
            for statement in SCHEMA:
                conn.execute(statement)
            conn.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
        self._check_version()

    def _check_version(self) -> None:
        has_meta = self._conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
        ).fetchone()
        if not has_meta:
            return
        row = self._conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            return
        if str(row[0]) != str(SCHEMA_VERSION):
            raise StoreError(
                f"run store {self.path} has schema version {row[0]!r}; this cudal1 reads "
                f"version {SCHEMA_VERSION} only (use a newer cudal1 or a new store file)"
            )

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> "RunStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: lock held, BEGIN IMMEDIATE, commit (rollback on error)."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            with self._conn:  # commits on success, rolls back on an exception
                yield self._conn

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    def _journal_mode(self) -> str:
        return str(self._query("PRAGMA journal_mode")[0][0]).lower()

    # -- tasks and candidates ------------------------------------------------------------------

    def add_task(self, task: Task) -> str:
        """Record ``task`` (content-addressed; re-adding is a no-op).  Returns its hash."""
        with self._tx() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO tasks (hash, name, task_id, level, problem_id, source,"
                " origin, added_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (task.hash, task.name, task.task_id, task.level, task.problem_id, task.source,
                 task.origin, time.time()),
            )
        return task.hash

    def get_task(self, task_hash: str) -> Task | None:
        rows = self._query(
            "SELECT name, source, level, problem_id, origin FROM tasks WHERE hash = ?",
            (task_hash,),
        )
        if not rows:
            return None
        name, source, level, problem_id, origin = rows[0]
        return Task(name=name, source=source, level=level, problem_id=problem_id, origin=origin)

    def add_candidate(
        self, candidate: Candidate, task_hash: str, meta: dict[str, Any] | None = None
    ) -> str:
        """Record ``candidate`` as proposed for ``task_hash`` (the same source may be proposed
        for several tasks; re-adding a pair is a no-op).  Returns the candidate hash."""
        with self._tx() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO candidates (hash, task_hash, source, label, meta_json,"
                " added_at) VALUES (?, ?, ?, ?, ?, ?)",
                (candidate.hash, task_hash, candidate.source, candidate.label,
                 _dumps(meta or {}), time.time()),
            )
        return candidate.hash

    def candidates(self, task_hash: str) -> list[Candidate]:
        """Candidates proposed for ``task_hash``, oldest first."""
        rows = self._query(
            "SELECT source, task_hash, label FROM candidates WHERE task_hash = ?"
            " ORDER BY added_at, rowid",
            (task_hash,),
        )
        return [Candidate(source=s, task_hash=t, label=lbl) for s, t, lbl in rows]

    # -- optimizer responses -------------------------------------------------------------------

    def record_response(self, task_hash: str, round_: int, policy: str, prompt: dict[str, Any], response: str,
                        analysis: str, candidate_hash: str | None, problem: str = "", error: str = "",
                        usage: dict[str, Any] | None = None) -> int:
        """Record one policy response (the exact prompt sent, the text, its parse)."""
        with self._tx() as conn:
            cur = conn.execute(
                "INSERT INTO responses (task_hash, round, policy, prompt_json, response, analysis,"
                " candidate_hash, problem, error, usage_json, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (task_hash, round_, policy, _dumps(prompt), response, analysis, candidate_hash,
                 problem, error, _dumps(usage or {}), time.time()),
            )
            return int(cur.lastrowid)

    def responses(self, task_hash: str | None = None) -> list[dict[str, Any]]:
        """Recorded responses (oldest first) as dicts with the columns above."""
        cols = ("id", "task_hash", "round", "policy", "prompt_json", "response", "analysis",
                "candidate_hash", "problem", "error", "usage_json", "created_at")
        sql = f"SELECT {', '.join(cols)} FROM responses"
        rows = self._query(sql + (" WHERE task_hash = ?" if task_hash else "") + " ORDER BY id",
                           (task_hash,) if task_hash else ())
        out = []
        for row in rows:
            d = dict(zip(cols, row))
            d["prompt"] = json.loads(d.pop("prompt_json"))
            d["usage"] = json.loads(d.pop("usage_json"))
            out.append(d)
        return out

    def round_counts(self, task_hash: str) -> dict[int, tuple[int, int]]:
        """Per optimizer round of ``task_hash``: (responses answered, generations failed).  A
        response is answered when the policy returned one (with or without usable code); it
        failed when ``error`` is set (the request failed after retries)."""
        rows = self._query(
            "SELECT round, SUM(error = ''), SUM(error != '') FROM responses WHERE task_hash = ? GROUP BY round",
            (task_hash,),
        )
        return {int(r): (int(a or 0), int(f or 0)) for r, a, f in rows}

    def last_round(self, task_hash: str) -> int:
        """Highest optimizer round with a recorded response for ``task_hash`` (-1 if none)."""
        rows = self._query("SELECT MAX(round) FROM responses WHERE task_hash = ?", (task_hash,))
        return -1 if not rows or rows[0][0] is None else int(rows[0][0])

    # -- evaluations ---------------------------------------------------------------------------

    def _put_environment(self, conn: sqlite3.Connection, result: EvalResult) -> None:
        env = result.environment
        conn.execute(
            "INSERT OR REPLACE INTO environments (key, json) VALUES (?, ?)",
            (env.key(), _dumps(dataclasses.asdict(env))),
        )

    def record_evaluation(self, result: EvalResult) -> int:
        """Upsert ``result`` under ``(task_hash, candidate_hash, config_hash)`` and store its
        environment.  Returns the evaluation's row id (stable across upserts)."""
        if not result.task_hash or not result.candidate_hash:
            raise ValueError("record_evaluation needs result.task_hash and result.candidate_hash")
        with self._tx() as conn:
            self._put_environment(conn, result)
            conn.execute(
                "INSERT INTO evaluations (task_hash, candidate_hash, config_hash, status,"
                " speedup, result_json, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (task_hash, candidate_hash, config_hash) DO UPDATE SET"
                " status = excluded.status, speedup = excluded.speedup,"
                " result_json = excluded.result_json, created_at = excluded.created_at",
                (result.task_hash, result.candidate_hash, result.config_hash,
                 result.status.value, _speedup_column(result.speedup), _result_json(result),
                 time.time()),
            )
            row = conn.execute(
                "SELECT id FROM evaluations WHERE task_hash = ? AND candidate_hash = ?"
                " AND config_hash = ?",
                (result.task_hash, result.candidate_hash, result.config_hash),
            ).fetchone()
        return int(row[0])

    def get_evaluation(
        self, task_hash: str, candidate_hash: str, config_hash: str
    ) -> EvalResult | None:
        rows = self._query(
            "SELECT result_json FROM evaluations WHERE task_hash = ? AND candidate_hash = ?"
            " AND config_hash = ?",
            (task_hash, candidate_hash, config_hash),
        )
        return _load_result(rows[0][0]) if rows else None

    def has_evaluation(self, task_hash: str, candidate_hash: str, config_hash: str) -> bool:
        return bool(
            self._query(
                "SELECT 1 FROM evaluations WHERE task_hash = ? AND candidate_hash = ?"
                " AND config_hash = ?",
                (task_hash, candidate_hash, config_hash),
            )
        )

    def evaluations(
        self, task_hash: str | None = None, status: Status | str | None = None
    ) -> list[EvalResult]:
        """Recorded verdicts, optionally filtered, in the order first recorded."""
        where, params = [], []
        if task_hash is not None:
            where.append("task_hash = ?")
            params.append(task_hash)
        if status is not None:
            where.append("status = ?")
            params.append(_status_value(status))
        sql = "SELECT result_json FROM evaluations"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = self._query(sql + " ORDER BY id", tuple(params))
        return [_load_result(r[0]) for r in rows]

    def _recorded_under(self, config_hash: str) -> Iterator[tuple[str, str, dict[str, Any], float]]:
        """``(task hash, kind, result as a dict, recording time)`` of every verdict (kind
        ``candidate``) and baseline (kind: its mode) recorded under ``config_hash``."""
        for table, kind in (("evaluations", "'candidate'"), ("baselines", "mode")):
            sql = f"SELECT task_hash, {kind}, result_json, created_at FROM {table} WHERE config_hash = ?"
            for task_hash, job_kind, result_json, at in self._query(sql, (config_hash,)):
                yield task_hash, job_kind, json.loads(result_json), float(at)

    def verdict_spans(self, config_hash: str) -> list[VerdictSpan]:
        """When every verdict and baseline recorded under ``config_hash`` ran (:class:`VerdictSpan`,
        by start): its recording time, and its ``wall_s`` before it (a verdict recorded again, as a
        reviewer's flag is, carries the later time; one without ``wall_s`` is left out)."""
        spans = []
        for task_hash, kind, data, at in self._recorded_under(config_hash):
            wall = data.get("wall_s")
            if isinstance(wall, (int, float)) and wall >= 0:
                spans.append(VerdictSpan(at - wall, at, task_hash, kind,
                                         "rejudged_alone" in (data.get("flags") or [])))
        return sorted(spans)

    def recorded_jobs(self, config_hash: str) -> list[RecordedJob]:
        """What each verdict and baseline recorded under ``config_hash`` took (:class:`RecordedJob`;
        one with neither a wall time nor a memory figure is left out): an earlier process's jobs,
        to size and place this one's."""
        rows = []
        for task_hash, kind, data, _ in self._recorded_under(config_hash):
            figures = data.get("figures") or {}
            wall, mib, blocked = data.get("wall_s"), figures.get("gpu_memory_mib"), figures.get("blocked_calls")
            job = RecordedJob(task_hash, kind,
                              float(wall) if isinstance(wall, (int, float)) and wall > 0 else 0.0,
                              int(mib) if isinstance(mib, (int, float)) and mib > 0 else 0,
                              "rejudged_alone" in (data.get("flags") or []),
                              isinstance(figures.get("rejudged_alone"), dict),
                              blocked if data.get("status") == "ok" and isinstance(blocked, dict) else None)
            if job.wall_s or job.gpu_memory_mib or job.rejudged_alone:
                rows.append(job)
        return rows

    def best(self, task_hash: str) -> EvalResult | None:
        """The ``ok`` verdict with the highest speedup for ``task_hash`` (earliest on ties)."""
        rows = self._query(
            "SELECT result_json FROM evaluations WHERE task_hash = ? AND status = ?"
            " AND speedup IS NOT NULL ORDER BY speedup DESC, id ASC LIMIT 1",
            (task_hash, Status.OK.value),
        )
        return _load_result(rows[0][0]) if rows else None

    def counts(self, task_hash: str | None = None) -> dict[str, int]:
        """Number of verdicts per status value (statuses with none are absent)."""
        if task_hash is None:
            rows = self._query("SELECT status, COUNT(*) FROM evaluations GROUP BY status")
        else:
            rows = self._query(
                "SELECT status, COUNT(*) FROM evaluations WHERE task_hash = ? GROUP BY status",
                (task_hash,),
            )
        return {str(s): int(n) for s, n in rows}

    def take_verdicts(self, task_hash: str, config_hash: str,
                      keep: Callable[[dict[str, list[dict[str, Any]]]], None] | None = None,
                      baseline_modes: Sequence[str] | None = None) -> dict[str, list[dict[str, Any]]]:
        """Remove ``task_hash``'s verdicts and baselines recorded under ``config_hash`` and return
        them, ``{"evaluations": [...], "baselines": [...]}``, each row a dict of its columns with
        ``result`` parsed, in the order recorded: for judging the same programs again (a search
        re-judges the task's recorded candidates that have no verdict).  With ``baseline_modes``,
        only the baselines of those modes (``{"baselines": [...]}``): for timing them again.  Its
        task, candidates, responses and other configurations' rows stay.  ``keep`` (e.g. a write
        of the rows elsewhere) is called with them before they are deleted, inside the same
        transaction: if it raises, nothing is deleted; a kill leaves all of them or none."""
        taken: dict[str, list[dict[str, Any]]] = {}
        evaluations = ("evaluations", ("candidate_hash", "status", "speedup", "result_json", "created_at"), "id")
        baselines = ("baselines", ("mode", "env_key", "result_json", "created_at"), "created_at")
        key, params = "WHERE task_hash = ? AND config_hash = ?", (task_hash, config_hash)
        if baseline_modes is None:
            tables = [(*evaluations, key, params), (*baselines, key, params)]
        else:
            modes = tuple(baseline_modes)
            tables = [(*baselines, f"{key} AND mode IN ({', '.join('?' * len(modes))})", (*params, *modes))]
        with self._tx() as conn:
            for table, columns, order, where, params in tables:
                rows = conn.execute(f"SELECT {', '.join(columns)} FROM {table} {where} ORDER BY {order}",
                                    params).fetchall()
                taken[table] = [{("result" if c == "result_json" else c): (json.loads(v) if c == "result_json" else v)
                                 for c, v in zip(columns, row)} for row in rows]
            if keep is not None:
                keep(taken)
            for table, _, _, where, params in tables:
                conn.execute(f"DELETE FROM {table} {where}", params)
        return taken

    # -- baselines -----------------------------------------------------------------------------

    def record_baseline(
        self, task_hash: str, mode: str, env_key: str, config_hash: str, result: EvalResult
    ) -> None:
        """Upsert the reference measurement of ``task_hash`` in ``mode`` on ``env_key``."""
        with self._tx() as conn:
            self._put_environment(conn, result)
            conn.execute(
                "INSERT OR REPLACE INTO baselines (task_hash, mode, env_key, config_hash,"
                " result_json, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                (task_hash, mode, env_key, config_hash, _result_json(result), time.time()),
            )

    def get_baseline(
        self, task_hash: str, mode: str, env_key: str, config_hash: str
    ) -> EvalResult | None:
        rows = self._query(
            "SELECT result_json FROM baselines WHERE task_hash = ? AND mode = ? AND env_key = ?"
            " AND config_hash = ?",
            (task_hash, mode, env_key, config_hash),
        )
        return _load_result(rows[0][0]) if rows else None

    def get_environment(self, key: str) -> dict[str, Any] | None:
        """The environment stored under ``key`` (``Environment.key()``) as a dict."""
        rows = self._query("SELECT json FROM environments WHERE key = ?", (key,))
        return json.loads(rows[0][0]) if rows else None

    def environments(self) -> list[dict[str, Any]]:
        """Every environment a verdict or baseline was recorded under, as dicts."""
        return [json.loads(blob) for (blob,) in self._query("SELECT json FROM environments")]

    # -- runs ----------------------------------------------------------------------------------

    def start_run(self, kind: str, config: dict[str, Any]) -> int:
        """Record the start of a run (status ``running``).  Returns its id."""
        with self._tx() as conn:
            cur = conn.execute(
                "INSERT INTO runs (kind, config_json, started_at, finished_at, status)"
                " VALUES (?, ?, ?, NULL, 'running')",
                (kind, _dumps(config), time.time()),
            )
            return int(cur.lastrowid)

    def finish_run(self, run_id: int, status: str = "done") -> None:
        """Mark run ``run_id`` finished with ``status``."""
        with self._tx() as conn:
            cur = conn.execute(
                "UPDATE runs SET finished_at = ?, status = ? WHERE id = ?",
                (time.time(), status, run_id),
            )
            if cur.rowcount != 1:
                raise StoreError(f"no run with id {run_id} in {self.path}")

    def get_run(self, run_id: int) -> dict[str, Any] | None:
        rows = self._query(
            "SELECT id, kind, config_json, started_at, finished_at, status FROM runs"
            " WHERE id = ?",
            (run_id,),
        )
        if not rows:
            return None
        rid, kind, config_json, started, finished, status = rows[0]
        return {"id": rid, "kind": kind, "config": json.loads(config_json),
                "started_at": started, "finished_at": finished, "status": status}
