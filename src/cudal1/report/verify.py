"""``cudal1 verify``'s logic: re-judge a published kernel set and compare with its claimed speedups.

Input records are read by :mod:`cudal1.releases` (CUDA-L1's release format, or (``task``,
``code``) lines; re-exported here with ``VerifyError`` as this app's name for its error).  Each record is classified as
``verified``, ``slower_than_claimed``, ``incorrect``, ``failed`` (compile/runtime/timeout),
``rejected``, ``degenerate_task`` or ``missing_code``.  The judge does the measuring; this module
only reads records, classifies and summarises.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from cudal1.releases import Record, candidates_of, read_records  # noqa: F401 - re-exported for the app
from cudal1.releases import ReleaseError as VerifyError  # noqa: F401 - the verify app's name for it
from cudal1.report.aggregate import describe
from cudal1.types import EvalResult, Status

DEFAULT_SLACK = 0.8  # measured >= DEFAULT_SLACK x claimed counts as verified (cudal1 verify --slack)
CLASSES = ("verified", "slower_than_claimed", "incorrect", "failed", "rejected", "degenerate_task", "missing_code")


def classify(record: Record, result: EvalResult | None, slack: float = DEFAULT_SLACK) -> str:
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


def audit_rows(
    records: list[Record], results: dict[int, EvalResult], slack: float = DEFAULT_SLACK
) -> list[dict[str, Any]]:
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


def verify_report(records: list[Record], results: dict[int, EvalResult], slack: float, config: dict[str, Any],
                  file: str) -> dict[str, Any]:
    """The document ``cudal1 verify`` writes to ``verify_report.json``: summary, one row per record,
    the ``slack`` the classes used, the environment of the first verdict and the judge configuration."""
    import dataclasses

    rows = audit_rows(records, results, slack)
    env = next(iter(results.values()), None)
    return {"summary": summarize(rows), "records": rows, "slack": slack,
            "environment": dataclasses.asdict(env.environment) if env else None, "config": config, "file": file}
