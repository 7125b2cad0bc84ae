"""What the subcommands print: one JSON line for machines, aligned tables for people, where a
batch's time went, and verdict messages that name the user's files."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from cudal1.tables import fmt, table  # noqa: F401 - the CLI's cells and tables (re-exported)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def retry_warning(retries: int, quiet: bool) -> None:
    """One stderr line for the endpoint's retried requests (each retry is an INFO log line: -v)."""
    if retries and not quiet:
        print(
            f"cudal1: warning: {retries} request(s) to the endpoint were retried (-v shows each retry)", file=sys.stderr
        )


def batch_summary(stats: list[Any]) -> dict[str, Any] | None:
    """The ``BatchStats`` of a command's batches, totalled, as JSON (None when nothing was judged)."""
    from cudal1.harness.parent.batchstats import total

    merged = total(stats)
    return None if merged is None else merged.to_dict()


def batch_line(batch: dict[str, Any] | None) -> str:
    """One line for people: where the judging time went."""
    if not batch:
        return "time: nothing judged (all from the run store)"
    idle, gpu_idle = batch.get("idle_share"), batch.get("gpu_idle_share")
    return (
        f"time ({batch['backend']}): {batch['wall_s']:.1f} s wall; {batch['builds']} builds "
        f"({batch['builds_shared']} shared, {batch['builds_cached']} cached; queue {batch['build_queue_s']:.1f} s, "
        f"build {batch['build_s']:.1f} s, {batch['build_workers']} x MAX_JOBS {batch['max_jobs']}); "
        f"judging {batch['judge_s']:.1f} s, of which in-worker imports/builds {batch.get('lane_build_s', 0.0):.1f} s; "
        f"lanes idle {'-' if idle is None else f'{100 * idle:.0f}%'} after their first job, "
        f"GPUs idle {'-' if gpu_idle is None else f'{100 * gpu_idle:.0f}%'} (no worker in a GPU phase)"
    )


_BUILD_COPY = re.compile(r"(?:[\w./-]*/)?cand_[0-9a-f]{8,}\w*\.py")


def as_user_file(result: Any, label: str) -> Any:
    """``result`` with the judge's copy of the candidate (``cand_<hash>_eval.py`` in the build
    cache) named as the user knows it (``label``: their file, or ``FILE.jsonl:LINE``) in its
    message and compile log, so an error points at what the user can open."""
    if label:
        result.message = _BUILD_COPY.sub(label, result.message or "")
        if getattr(result, "compile_log", None):
            result.compile_log = _BUILD_COPY.sub(label, result.compile_log)
    return result
