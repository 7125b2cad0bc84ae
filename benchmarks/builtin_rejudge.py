"""``benchmarks/builtin_kernelbench.py --rejudge TASK``: judge a task's recorded programs again.

A run's verdicts are keyed by the judge's config hash, which names the judge's settings, not its
code; a fix to the judge leaves the verdicts it would change in place.  For a task whose verdicts
a since-fixed judge problem decided (level1/63's candidates `rejected` when the candidate's
window steps ran through IPC-opened slots), this takes everything the run holds for the task
under the current configuration out of the run: its verdicts and baselines (the store), its
re-timings (``confirm.json``), its baseline skips and its place in ``baselines_done.json``.  The
next call then judges the task's recorded candidates again (a search re-judges recorded
candidates without a verdict), times its baselines and re-times its winner, with the current
judge.  Its responses and candidates stay: the same programs are judged, not a new search.

``TASK:MODE`` (e.g. ``level3/23:compile-max-autotune-no-cudagraphs``) times one baseline again
instead: only that mode's baseline leaves the store, with the task's re-timings and finished mark
(its best compile mode may change), so the next call times that mode and re-times the task; its
verdicts and other baselines stay.  For a baseline a judge limit cut short (a compile past the
120 s call limit before torch.compile's compiling got the build deadline).  ``TASK:baselines``
times every baseline of the task again the same way (its verdicts stay: a search's own
``compile-default`` verdict, where it stands in for that baseline, is not a baseline and stays);
``all`` for TASK (``all:baselines``, ``all:MODE``, ``all``) names every task of the run: for
measuring what the baselines and re-timings cost under a changed judge, the search's verdicts
kept.

Nothing is lost: each entry's removed rows are appended as one JSON line to ``OUT/rejudged.jsonl``
(task, mode where one was named, time, config hash, reason, and the rows) before the files are
rewritten and the store's deletion is committed.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import builtin_baseline_plan as plan
from cudal1.store import RunStore

LOG = "rejudged.jsonl"
BASELINES = "baselines"  # TASK:baselines: every baseline of the task timed again
ALL = "all"  # every task of the run


def rejudge(out: Path, tasks: list, task_ids: list[str], config_hash: str, reason: str = "") -> list[dict[str, Any]]:
    """Take ``task_ids`` (of the run's ``tasks``; ``TASK:MODE`` for one baseline) out of the run
    under ``config_hash``, as the module docstring says; returns the log entries written.  An id
    the run does not hold, or a mode that is not a baseline mode, is a ValueError, raised before
    anything is changed."""
    from cudal1.compile_modes import COMPILE_MODES, CUDA_GRAPH

    by_id = {t.task_id: t for t in tasks}
    wanted = [tuple(i.split(":", 1)) if ":" in i else (i, "") for i in task_ids]
    unknown = [i for i, _ in wanted if i not in by_id and i != ALL]
    if unknown:
        raise ValueError(f"--rejudge: not a task of this run: {', '.join(unknown)}")
    modes = (*COMPILE_MODES, CUDA_GRAPH)
    bad = [m for _, m in wanted if m and m not in modes and m != BASELINES]
    if bad:
        raise ValueError(f"--rejudge: not a baseline mode: {', '.join(bad)} (known: {', '.join(modes)}, {BASELINES})")
    wanted = [(t.task_id, m) for i, m in wanted for t in (tasks if i == ALL else [by_id[i]])]
    store_path = out / "cudal1.sqlite"
    confirm_path = out / "confirm.json"
    entries = []
    store = RunStore(store_path)
    try:
        for task_id, mode in dict.fromkeys(wanted):
            confirm = json.loads(confirm_path.read_text()) if confirm_path.exists() else {}
            skips, done = plan.load_skips(out), plan.load_done(out)
            entry = {"task": task_id, **({"mode": mode} if mode else {}),
                     "at": dt.datetime.now().isoformat(timespec="seconds"), "config_hash": config_hash,
                     "reason": reason,
                     "confirm": {k: v for k, v in confirm.items() if k.split("|", 1)[0] == task_id},
                     "baseline_skips": skips.get(task_id, {}) if mode else skips.pop(task_id, {}),
                     "baselines_done": task_id in done}
            kept_confirm = {k: v for k, v in confirm.items() if k not in entry["confirm"]}

            def keep(taken: dict[str, list[dict[str, Any]]], entry: dict[str, Any] = entry,
                     kept_confirm: dict[str, Any] = kept_confirm, skips: dict[str, Any] = skips,
                     done: set[str] = done) -> None:
                """Inside the store's transaction, before it deletes: the log first, then the files
                (a kill before the commit leaves the verdicts, so the worst case is a re-timing
                again, never a stale one kept)."""
                entry.update(taken)
                with open(out / LOG, "a") as f:
                    f.write(json.dumps(entry) + "\n")
                plan.write_whole(confirm_path, json.dumps(kept_confirm, indent=1))
                plan.write_whole(out / plan.SKIPS, json.dumps(skips, indent=1, sort_keys=True))
                plan.write_whole(out / plan.DONE, json.dumps(sorted(done - {entry["task"]}), indent=0))

            which = list(modes) if mode == BASELINES else [mode] if mode else None
            store.take_verdicts(by_id[task_id].hash, config_hash, keep=keep, baseline_modes=which)
            entries.append(entry)
    finally:
        store.close()
    return entries


def summary(entry: dict[str, Any]) -> str:
    """One line per re-judged task (or baseline) for the call's log."""
    if entry.get("mode"):
        statuses = ", ".join(str(b["result"].get("status")) for b in entry["baselines"]) or "none"
        what = "baselines" if entry["mode"] == BASELINES else f"{entry['mode']} baseline"
        return (f"timing {entry['task']}'s {what} again: took out {len(entry['baselines'])} "
                f"baseline(s) ({statuses}), {len(entry['confirm'])} re-timing(s); kept in {LOG}")
    statuses = ", ".join(f"{e['status']}" for e in entry["evaluations"]) or "none"
    return (f"re-judging {entry['task']}: took out {len(entry['evaluations'])} verdict(s) ({statuses}), "
            f"{len(entry['baselines'])} baseline(s), {len(entry['confirm'])} re-timing(s); kept in {LOG}")


def replaced(out: Path) -> list[dict[str, Any]]:
    """What each entry of ``OUT/rejudged.jsonl`` took out, for the run's cost: its time (``at``),
    task, and ``scope``: ``verdicts`` (the whole task: search verdicts, baselines, re-timings),
    ``baselines`` (its baselines and re-timings) or ``mode`` (one baseline, with the task's
    re-timings)."""
    path = out / LOG
    if not path.exists():
        return []
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{"at": e["at"], "task": e["task"],
             "scope": "verdicts" if not e.get("mode") else BASELINES if e["mode"] == BASELINES else "mode"}
            for e in entries]


def recorded(out: Path) -> list[dict[str, Any]]:
    """What ``OUT/rejudged.jsonl`` says was judged again, for the report: task, when, why, and
    how many verdicts it took out (their rows stay in the file)."""
    path = out / LOG
    if not path.exists():
        return []
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{"task": e["task"] + (f" ({e['mode']})" if e.get("mode") else ""), "at": e["at"],
             "reason": e.get("reason", ""), "verdicts": len(e.get("evaluations", [])),
             "baselines": len(e.get("baselines", []))} for e in entries]
