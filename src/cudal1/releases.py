"""Published kernel sets: read CUDA-L1's release format, or (``task``, ``code``) lines, into
records of (task, code, claimed speedups).  Shared by ``cudal1 verify`` (report), ``cudal1
collect --from`` (train) and ``cudal1 compare``; it judges and classifies nothing.

Release records carry ``level_id``, ``task_id``, ``ref_code``, ``custom_code`` and ``score_*``
(``custom_code`` may be null or the string "None"); a record of a user's own task, as ``cudal1
export`` writes it, has ``level_id`` null and the task's name in ``task_name``.  (``task``,
``code``) lines are resolved against a task list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cudal1.jsonl import JsonlError, iter_jsonl
from cudal1.types import Candidate, Task


class ReleaseError(ValueError):
    """Unreadable or malformed input records."""


@dataclass
class Record:
    key: str  # "level1/48" or the record's task key
    level: int | None
    task: Task | None
    code: str | None
    claimed: float | None
    claims: dict[str, float] = field(default_factory=dict)


def missing_code(code: Any) -> bool:
    """A record's code field that holds no code (null, not text, empty, "None" or "null")."""
    return code is None or not isinstance(code, str) or code.strip() in ("", "None", "null")


def _release_task(rec: dict[str, Any], origin: str) -> Task:
    """The task of a release record: ``level{L}/{id}`` for KernelBench records, the record's
    ``task_name`` (else ``task_id``) for a user's own task (``level_id`` null)."""
    if not isinstance(rec["ref_code"], str) or not rec["ref_code"].strip():
        raise ReleaseError(f"{origin}: ref_code must be the reference's source text")
    level, tid = rec.get("level_id"), rec.get("task_id")
    if isinstance(level, int) and isinstance(tid, int):
        return Task(name=str(rec.get("task_name") or f"level{level}_{tid}"), source=rec["ref_code"], level=level,
                    problem_id=tid, origin=origin)
    name = rec.get("task_name") or tid
    if not name:
        raise ReleaseError(f"{origin}: a record without level_id and integer task_id needs task_name")
    return Task(name=str(name), source=rec["ref_code"], origin=origin)


def read_records(path: str | Path, tasks: list[Task] | None = None) -> list[Record]:
    """Parse a JSONL of CUDA-L1 release records or (task, code) lines."""
    from cudal1.tasks import find_task

    records = []
    try:
        lines = list(iter_jsonl(path))
    except JsonlError as exc:
        raise ReleaseError(str(exc)) from None
    for n, rec in lines:
        if "ref_code" in rec:
            task = _release_task(rec, f"{path}:{n}")
            claims = {
                k[len("score_") :]: float(v)
                for k, v in rec.items()
                if k.startswith("score_") and isinstance(v, (int, float))
            }
            records.append(
                Record(
                    task.task_id,
                    task.level,
                    task,
                    None if missing_code(rec.get("custom_code")) else rec["custom_code"],
                    claims.get("default"),
                    claims,
                )
            )
        elif "task" in rec:
            if tasks is None:
                raise ReleaseError(f"{path}:{n}: a (task, code) record needs --suite to resolve its task")
            task = find_task(tasks, str(rec["task"]))
            claimed = rec.get("claimed_speedup", rec.get("speedup"))
            records.append(
                Record(
                    task.task_id, task.level, task, None if missing_code(rec.get("code")) else rec["code"],
                    float(claimed) if isinstance(claimed, (int, float)) else None,
                )
            )
        else:
            raise ReleaseError(f"{path}:{n}: expected CUDA-L1 fields (ref_code, custom_code) or (task, code)")
    if not records:
        raise ReleaseError(f"{path}: no records")
    return records


def candidates_of(records: list[Record]) -> list[tuple[int, Task, Candidate]]:
    return [(i, r.task, Candidate(r.code, task_hash=r.task.hash, label=r.key))
            for i, r in enumerate(records) if r.code is not None and r.task is not None]
