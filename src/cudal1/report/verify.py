"""``cudal1 verify``'s logic: re-judge a published kernel set and compare with its claimed speedups.

Input records: CUDA-L1's release format (``level_id``, ``task_id``, ``ref_code``,
``custom_code``, ``score_*``; ``custom_code`` may be null or the string "None"; a record of a
user's own task, as ``cudal1 export`` writes it, has ``level_id`` null and the task's name in
``task_name``) or plain (``task``, ``code``) lines resolved against a task list.  Each record is classified as
``verified``, ``slower_than_claimed``, ``incorrect``, ``failed`` (compile/runtime/timeout),
``rejected``, ``degenerate_task`` or ``missing_code``.  The judge does the measuring; this module
only reads records, classifies and summarises.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cudal1.jsonl import JsonlError, iter_jsonl
from cudal1.report.metrics import describe
from cudal1.types import Candidate, EvalResult, Status, Task

CLASSES = ("verified", "slower_than_claimed", "incorrect", "failed", "rejected", "degenerate_task", "missing_code")


class VerifyError(ValueError):
    """Unreadable or malformed input records."""


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


def _release_task(rec: dict[str, Any], origin: str) -> Task:
    """The task of a release record: ``level{L}/{id}`` for KernelBench records, the record's
    ``task_name`` (else ``task_id``) for a user's own task (``level_id`` null)."""
    if not isinstance(rec["ref_code"], str) or not rec["ref_code"].strip():
        raise VerifyError(f"{origin}: ref_code must be the reference's source text")
    level, tid = rec.get("level_id"), rec.get("task_id")
    if isinstance(level, int) and isinstance(tid, int):
        return Task(name=str(rec.get("task_name") or f"level{level}_{tid}"), source=rec["ref_code"], level=level,
                    problem_id=tid, origin=origin)
    name = rec.get("task_name") or tid
    if not name:
        raise VerifyError(f"{origin}: a record without level_id and integer task_id needs task_name")
    return Task(name=str(name), source=rec["ref_code"], origin=origin)


def read_records(path: str | Path, tasks: list[Task] | None = None) -> list[Record]:
    """Parse a JSONL of CUDA-L1 release records or (task, code) lines."""
    from cudal1.tasks import find_task

    records = []
    try:
        lines = list(iter_jsonl(path))
    except JsonlError as exc:
        raise VerifyError(str(exc)) from None
    for n, rec in lines:
        if "ref_code" in rec:
            task = _release_task(rec, f"{path}:{n}")
            claims = {k[len("score_"):]: float(v) for k, v in rec.items() if k.startswith("score_") and isinstance(v, (int, float))}
            records.append(Record(task.task_id, task.level, task, None if _missing(rec.get("custom_code")) else rec["custom_code"],
                                  claims.get("default"), claims))
        elif "task" in rec:
            if tasks is None:
                raise VerifyError(f"{path}:{n}: a (task, code) record needs --suite to resolve its task")
            task = find_task(tasks, str(rec["task"]))
            claimed = rec.get("claimed_speedup", rec.get("speedup"))
            records.append(Record(task.task_id, task.level, task, None if _missing(rec.get("code")) else rec["code"],
                                  float(claimed) if isinstance(claimed, (int, float)) else None))
        else:
            raise VerifyError(f"{path}:{n}: expected CUDA-L1 fields (ref_code, custom_code) or (task, code)")
    if not records:
        raise VerifyError(f"{path}: no records")
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


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    per_level: dict[str, Counter] = defaultdict(Counter)
    for row in rows:
        per_level[f"level{row['level']}" if row["level"] is not None else "other"][row["class"]] += 1
    both = [r for r in rows if r["measured"] is not None and r["claimed"] is not None]
    return {
        "records": len(rows),
        "classes": dict(Counter(r["class"] for r in rows)),
        "per_level": {k: dict(v) for k, v in sorted(per_level.items())},
        "claimed": describe([r["claimed"] for r in both if r["claimed"] > 0]),
        "measured": describe([r["measured"] for r in both if r["measured"] > 0]),
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


def verify_report(records: list[Record], results: dict[int, EvalResult], slack: float, config: dict[str, Any],
                  file: str) -> dict[str, Any]:
    """The document ``cudal1 verify`` writes to ``verify_report.json``: summary, one row per record,
    the environment of the first verdict and the judge configuration."""
    import dataclasses

    rows = audit_rows(records, results, slack)
    env = next(iter(results.values()), None)
    return {"summary": summarize(rows), "records": rows,
            "environment": dataclasses.asdict(env.environment) if env else None, "config": config, "file": file}
