"""Audit of a published kernel set: re-judge every record and compare with its claimed speedup.

Input records: CUDA-L1's release format (``level_id``, ``task_id``, ``ref_code``,
``custom_code``, ``score_*``; ``custom_code`` may be null or the string "None") or plain
(``task``, ``code``) lines resolved against a task list.  Each record is classified as
``verified``, ``slower_than_claimed``, ``incorrect``, ``failed`` (compile/runtime/timeout),
``rejected``, ``degenerate_task`` or ``missing_code``.  The judge does the measuring; this module
only reads records, classifies and summarises.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cudal1.jsonl import JsonlError, iter_jsonl
from cudal1.types import Candidate, EvalResult, Status, Task

CLASSES = ("verified", "slower_than_claimed", "incorrect", "failed", "rejected", "degenerate_task", "missing_code")


class AuditError(ValueError):
    """Unreadable or malformed audit input."""


@dataclass
class Record:
    key: str  # "level1/48" or the record's task key
    level: int | None
    task: Task | None
    code: str | None
    claimed: float | None
    claims: dict[str, float] = field(default_factory=dict)


def _missing(code: Any) -> bool:
    return code is None or not isinstance(code, str) or code.strip() in ("", "None", "null")


def read_records(path: str | Path, tasks: list[Task] | None = None) -> list[Record]:
    """Parse a JSONL of CUDA-L1 release records or (task, code) lines."""
    from cudal1.tasks import find_task

    records = []
    try:
        lines = list(iter_jsonl(path))
    except JsonlError as exc:
        raise AuditError(str(exc)) from None
    for n, rec in lines:
        if "ref_code" in rec:
            level, tid = rec.get("level_id"), rec.get("task_id")
            task = Task(name=f"level{level}_{tid}", source=rec["ref_code"], level=level, problem_id=tid, origin=f"{path}:{n}")
            claims = {k[len("score_"):]: float(v) for k, v in rec.items() if k.startswith("score_") and isinstance(v, (int, float))}
            records.append(Record(task.task_id, level, task, None if _missing(rec.get("custom_code")) else rec["custom_code"],
                                  claims.get("default"), claims))
        elif "task" in rec:
            if tasks is None:
                raise AuditError(f"{path}:{n}: a (task, code) record needs --suite to resolve its task")
            task = find_task(tasks, str(rec["task"]))
            claimed = rec.get("claimed_speedup", rec.get("speedup"))
            records.append(Record(task.task_id, task.level, task, None if _missing(rec.get("code")) else rec["code"],
                                  float(claimed) if isinstance(claimed, (int, float)) else None))
        else:
            raise AuditError(f"{path}:{n}: expected CUDA-L1 fields (ref_code, custom_code) or (task, code)")
    if not records:
        raise AuditError(f"{path}: no records")
    return records


def classify(record: Record, result: EvalResult | None, slack: float = 0.8) -> str:
    """The audit class of one record (``slack``: measured ≥ slack × claimed counts as verified)."""
    if record.code is None or result is None:
        return "missing_code"
    if "degenerate_task" in result.flags:
        return "degenerate_task"
    if result.status is Status.REJECTED:
        return "rejected"
    if result.status is Status.INCORRECT:
        return "incorrect"
    if result.status is not Status.OK:
        return "failed"
    if record.claimed is not None and result.speedup is not None and result.speedup < slack * record.claimed:
        return "slower_than_claimed"
    return "verified"


def _stats(values: list[float]) -> dict[str, float | None]:
    vals = [v for v in values if v is not None and v > 0]
    if not vals:
        return {"mean": None, "median": None, "geomean": None}
    return {"mean": statistics.fmean(vals), "median": statistics.median(vals),
            "geomean": math.exp(statistics.fmean(math.log(v) for v in vals))}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    per_level: dict[str, Counter] = defaultdict(Counter)
    for row in rows:
        per_level[f"level{row['level']}"][row["class"]] += 1
    both = [r for r in rows if r["measured"] is not None and r["claimed"] is not None]
    return {
        "records": len(rows),
        "classes": dict(Counter(r["class"] for r in rows)),
        "per_level": {k: dict(v) for k, v in sorted(per_level.items())},
        "claimed": _stats([r["claimed"] for r in both]),
        "measured": _stats([r["measured"] for r in both]),
    }


def audit_rows(records: list[Record], results: dict[int, EvalResult], slack: float = 0.8) -> list[dict[str, Any]]:
    rows = []
    for i, rec in enumerate(records):
        res = results.get(i)
        rows.append({
            "task": rec.key, "level": rec.level, "class": classify(rec, res, slack),
            "claimed": rec.claimed, "measured": res.speedup if res else None,
            "speedup_ci": list(res.speedup_ci) if res and res.speedup_ci else None,
            "status": res.status.value if res else None, "flags": res.flags if res else [],
            "message": (res.message.splitlines()[0][:300] if res and res.message else ""),
            "claims": rec.claims,
        })
    return rows


def candidates_of(records: list[Record]) -> list[tuple[int, Task, Candidate]]:
    return [(i, r.task, Candidate(r.code, task_hash=r.task.hash, label=r.key))
            for i, r in enumerate(records) if r.code is not None and r.task is not None]
