"""The report document: one JSON-serialisable dict built from :class:`~cudal1.report.load.RunData`.

Contract (``cudal1 report --format json`` prints it; the HTML and Markdown renderers read it):

* ``summary``: ``tasks`` (attempted, degenerate ones excluded), ``ok`` (tasks with a verified
  candidate), ``mean``, ``median``, ``geomean``, ``max``, ``p25``, ``p75`` of the per-task best
  speedup over eager, ``fast_p`` (faster with confidence) and ``fast_p_point`` (KernelBench's
  point-value definition) keyed "0", "1.0", "1.2", "1.5", "2.0" (see
  :mod:`cudal1.report.aggregate`), plus ``n``, ``faster``, ``faster_point``, ``degenerate``, ``candidates``,
  ``statuses`` and ``flags`` (counts over all judged candidates) and ``conventions``;
* ``levels``: the same figures per level (``level1`` ..., ``other`` for tasks without one), with
  the level's ``candidates``, ``statuses`` and ``flags`` (degenerate tasks left out);
* ``baselines``: per measured baseline mode (``compile-default``, ``compile-reduce-overhead``,
  ``compile-max-autotune``, ``compile-max-autotune-no-cudagraphs``, ``cudagraph``; the older names
  ``compile``, ``compile-ro``, ``max-autotune`` are read as these), the best speedup over that
  baseline (ratio to the baseline's own speedup over eager), and ``baseline_over_eager``; a
  builtin run's verified ``compile-default`` candidate counts as the baseline
  ``compile-default-candidate``;
* ``tasks``: one entry per task with ``task``, ``level``, ``best_speedup``, ``best_ci``,
  ``faster`` (its 95% CI above 1.0), ``uncertain`` (the CI includes 1.0), ``high_variance``,
  ``best_candidate`` (candidate hash), ``statuses``, ``techniques`` (labels of the best
  candidate), and more;
* ``techniques``: label → ``candidates`` (judged ones carrying it), ``verified``, ``tasks`` (tasks
  with a verified candidate carrying it), ``median_speedup`` (over those verified candidates);
* ``environment``: where the numbers were measured (the most common one, in full;
  ``environments`` lists each distinct one by :data:`ENVIRONMENT_KEYS`, with its ``verdicts``),
  ``rounds`` (search progress), ``degenerate`` and ``rejected`` (reported apart), ``conventions``
  (the other convention's summary, for comparison with published figures) and, for a verify
  run, ``audit``: ``summary`` and ``file`` as ``verify_report.json`` holds them, ``slack`` (the
  report's own, else 0.8), ``per_level`` (level → class → records) and ``records`` (see
  :func:`audit_records`);
* for ``cudal1 evaluate`` runs, ``evaluations``: per run, its compile/correct/ok rates,
  ``pass`` (pass@k), fast_p and best-of-k speedups, as its ``evaluation.json`` holds them
  (:func:`evaluation_section`).

A task's best is picked as ``cudal1 optimize`` picks the program it keeps: verified candidates
faster than the reference with confidence first, then the highest speedup
(:func:`best_candidate`).  ``candidates`` of a task counts its judged candidates, the reference
anchor not counted (``cudal1 optimize``'s ``judged``).  Technique labels are ``cudal1
analyze``'s for the candidate against its reference, with the model's analysis (never the
builtin policy's pass list).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections import Counter
from typing import Any

from cudal1.report.aggregate import CONVENTIONS, TaskOutcome, aggregate, conventions, geomean, level_key, verdict_counts
from cudal1.report.load import CandidateRecord, RunData, TaskRecord
from cudal1.report.techniques import TECHNIQUES, analyze
from cudal1.report.verify import CLASSES, DEFAULT_SLACK
from cudal1.speedup import faster as speedup_faster
from cudal1.speedup import noisy, uncertain
from cudal1.types import Status

COMPILE_CANDIDATE = "compile-default-candidate"
# baseline names recorded before the shared execution-mode vocabulary (cudal1.compile_modes)
OLD_BASELINE_NAMES = {"compile": "compile-default", "compile-ro": "compile-reduce-overhead",
                      "max-autotune": "compile-max-autotune"}


def _ok(c: CandidateRecord) -> bool:
    return c.result is not None and c.result.status is Status.OK and c.result.speedup is not None


def degenerate(rec: TaskRecord) -> bool:
    results = [c.result for c in rec.candidates if c.result] + ([rec.reference] if rec.reference else [])
    return any("degenerate_task" in r.flags for r in results)


def best_candidate(rec: TaskRecord) -> CandidateRecord | None:
    """The task's best verified candidate, picked as ``cudal1 optimize`` picks the one it keeps
    (:mod:`cudal1.search.outputs`): those faster than the reference with confidence first, then
    the highest speedup (earliest on ties); None on degenerate tasks."""
    ok = [c for c in rec.candidates if _ok(c)]
    if degenerate(rec) or not ok:
        return None
    return max(ok, key=lambda c: (speedup_faster(c.result), c.result.speedup))  # max keeps the first of equal values


def baseline_label(name: str) -> str:
    """A baseline's name for people (tables and plots): what runs, not the registry key."""
    from cudal1.compile_modes import COMPILE_MODES, CUDA_GRAPH, CUDA_GRAPH_DESCRIPTION

    if name == COMPILE_CANDIDATE:
        return "torch.compile, default mode (judged as a candidate of this run)"
    if name in COMPILE_MODES:
        return COMPILE_MODES[name].description
    return CUDA_GRAPH_DESCRIPTION if name == CUDA_GRAPH else name


def baseline_speedups(rec: TaskRecord) -> dict[str, float]:
    """Measured baselines' speedups over eager (``eager`` itself left out; old mode names read
    as their current ones)."""
    out = {OLD_BASELINE_NAMES.get(m, m): r.speedup for m, r in rec.baselines.items()
           if m != "eager" and r.status is Status.OK and r.speedup and r.speedup > 0}
    compiled = [c for c in rec.candidates if _ok(c) and c.passes == ["compile-default"]]
    if compiled:
        out[COMPILE_CANDIDATE] = compiled[0].result.speedup
    return out


def outcome(rec: TaskRecord) -> TaskOutcome:
    best = best_candidate(rec)
    ci = best.result.speedup_ci if best else None
    return TaskOutcome(rec.task.task_id, rec.task.level, best.result.speedup if best else None, ci[0] if ci else None,
                       degenerate(rec), baseline_speedups(rec))


def model_analysis(c: CandidateRecord) -> str:
    """The model's Performance Analysis of ``c`` ("" for the builtin policy, whose recorded text
    is the list of passes it applied, not an analysis)."""
    return "" if c.meta.get("policy") == "builtin" else c.analysis


def label_candidates(data: RunData) -> dict[str, list[str]]:
    """Technique labels of every candidate (by hash): :func:`cudal1.report.techniques.analyze` of
    its code against its task's reference, with the model's analysis, as ``cudal1 analyze FILE
    --reference TASK [--analysis TEXT]`` labels it."""
    labels: dict[str, list[str]] = {}
    for rec in data.tasks:
        for c in rec.candidates:
            if c.hash not in labels:
                labels[c.hash] = analyze(c.source, rec.task.source, model_analysis(c)).techniques
    return labels


def technique_table(data: RunData, labels: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for tech in TECHNIQUES:
        judged = [(rec, c) for rec in data.tasks if not degenerate(rec) for c in rec.candidates
                  if c.result is not None and tech in labels.get(c.hash, [])]
        if not judged:
            continue
        ok = [(rec, c) for rec, c in judged if _ok(c)]
        speedups = [c.result.speedup for _, c in ok]
        table[tech] = {"candidates": len(judged), "verified": len(ok), "tasks": len({rec.task.hash for rec, _ in ok}),
                       "median_speedup": statistics.median(speedups) if speedups else None}
    return table


def rounds(data: RunData) -> list[dict[str, Any]]:
    """Search progress: per round, the candidates judged and the geomean over tasks of the best
    verified speedup so far (1.0 for a task with none yet: the reference)."""
    live = [rec for rec in data.tasks if not degenerate(rec)]
    seen = sorted({c.round or 0 for rec in live for c in rec.candidates if c.result})
    out = []
    if seen and seen[0] > 0 and any(rec.reference for rec in live):  # round 0: the references, 1.0x
        out.append({"round": 0, "candidates": 0, "ok": 0, "tasks_with_ok": 0, "geomean_best_so_far": 1.0})
    for r in seen:
        bests = []
        for rec in live:
            ok = [c.result.speedup for c in rec.candidates if _ok(c) and (c.round or 0) <= r]
            bests.append(max(ok) if ok else None)
        this = [c for rec in live for c in rec.candidates if c.result and (c.round or 0) == r]
        out.append({"round": r, "candidates": len(this), "ok": sum(1 for c in this if _ok(c)),
                    "tasks_with_ok": sum(1 for b in bests if b is not None),
                    "geomean_best_so_far": geomean([b if b and b > 1.0 else 1.0 for b in bests])})
    return out


# What makes two measurements' environments different.  Not the isolation details: they name
# each job's own work directory, so every verdict would count as an environment of its own.
ENVIRONMENT_KEYS = ("device", "gpu_name", "gpu_capability", "driver", "cuda", "torch", "triton", "python", "cudal1",
                    "hostname")


def environment(data: RunData) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(the most common environment of the verdicts, in full; every distinct one, by
    :data:`ENVIRONMENT_KEYS`, most common first, with ``verdicts``: how many were measured there)."""
    envs: Counter = Counter()
    full: dict[str, dict[str, Any]] = {}
    for rec in data.tasks:
        for c in rec.candidates:
            if c.result is not None:
                env = dataclasses.asdict(c.result.environment)
                key = json.dumps({k: env.get(k) for k in ENVIRONMENT_KEYS}, sort_keys=True)
                envs[key] += 1
                full.setdefault(key, env)
    listed = [json.loads(key) | {"verdicts": n} for key, n in envs.most_common()]
    return (full[envs.most_common(1)[0][0]] if envs else None), listed


def environment_rows(env: dict[str, Any] | None) -> list[tuple[str, Any]]:
    """The environment as (name, value) rows for a two-column table; a mapping (``isolation``:
    measure → what happened) becomes one row per entry, ``isolation: netns``, so nothing is a
    raw dict on one line."""
    rows: list[tuple[str, Any]] = []
    for key, value in (env or {}).items():
        if isinstance(value, dict):
            rows += [(f"{key}: {k}", v) for k, v in value.items()] or [(key, "-")]
        else:
            rows.append((key, "-" if value in (None, "") else value))
    return rows


def task_row(rec: TaskRecord, labels: dict[str, list[str]]) -> dict[str, Any]:
    best = best_candidate(rec)
    judged = [c for c in rec.candidates if c.result is not None]
    counts = verdict_counts([c.result for c in judged])
    return {
        "task": rec.task.task_id, "level": rec.task.level, "name": rec.task.name,
        "best_speedup": best.result.speedup if best else None, "best_candidate": best.hash if best else None,
        "best_ci": list(best.result.speedup_ci) if best and best.result.speedup_ci else None,
        "faster": bool(best and speedup_faster(best.result)),
        "uncertain": bool(best and uncertain(best.result.speedup, best.result.speedup_ci)),
        "high_variance": bool(best and noisy(best.result)), "statuses": counts["statuses"],
        "flags": counts["flags"], "techniques": labels.get(best.hash, []) if best else [],
        "candidates": len(judged), "pending": len(rec.candidates) - len(judged),
        "verified": sum(1 for c in judged if _ok(c)), "degenerate": degenerate(rec),
        "baselines": baseline_speedups(rec),
        "reference_ms": best.result.reference_ms if best else (rec.reference.reference_ms if rec.reference else None),
        "best_ms": best.result.candidate_ms if best else None,
    }


def _record_order(row: dict[str, Any]) -> tuple:
    """Level (none last), then the problem id after the ``/`` as a number, then the task id."""
    level, task = row.get("level"), str(row.get("task"))
    tail = task.rsplit("/", 1)[-1]
    return (level is None, level or 0, not tail.isdigit(), int(tail) if tail.isdigit() else 0, task)


def audit_records(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per verify record: ``task``, ``level``, ``class``, ``claimed``, ``measured``,
    ``ratio`` (measured / claimed, None unless both are there and claimed > 0), ``status`` and
    ``flags``; sorted by level, then problem id (numeric)."""
    out = []
    for r in sorted(rows, key=_record_order):
        claimed, measured = r.get("claimed"), r.get("measured")
        out.append({"task": r.get("task"), "level": r.get("level"), "class": r.get("class"),
                    "claimed": claimed, "measured": measured,
                    "ratio": measured / claimed if claimed and measured is not None and claimed > 0 else None,
                    "status": r.get("status"), "flags": list(r.get("flags") or [])})
    return out


def audit_section(audit: dict[str, Any]) -> dict[str, Any]:
    """``doc["audit"]`` of a ``verify_report.json`` (module docstring); class counts in
    :data:`~cudal1.report.verify.CLASSES` order, unknown classes after them."""
    summary = audit.get("summary") or {}
    records = audit_records(audit.get("records") or [])
    per_level = summary.get("per_level")
    if per_level is None:  # an older or hand-written report: count the records
        counted: dict[str, Counter] = {}
        for r in records:
            counted.setdefault(level_key(r["level"]), Counter())[r["class"]] += 1
        per_level = {k: dict(v) for k, v in counted.items()}

    def ordered(counts: dict[str, int]) -> dict[str, int]:
        keys = [c for c in CLASSES if c in counts] + sorted(c for c in counts if c not in CLASSES)
        return {c: counts[c] for c in keys}

    slack = audit.get("slack")  # verify reports written before commit 4c117d1 did not record it: the default
    return {"summary": audit.get("summary"), "file": audit.get("file"),
            "slack": float(slack) if isinstance(slack, (int, float)) else DEFAULT_SLACK,
            "per_level": {k: ordered(v) for k, v in per_level.items()}, "records": records}


EVALUATION_KEYS = ("run", "tasks", "samples_per_task", "samples", "complete", "failed_requests", "compile_rate",
                   "correct_rate", "ok_rate", "fast_p", "fast_p_point", "speedup")


def evaluation_section(evaluation: dict[str, Any]) -> dict[str, Any]:
    """``doc["evaluations"]`` entry of one ``cudal1 evaluate`` run's ``evaluation.json``: its rates,
    fast_p, best-of-k speedups and ``pass`` (``pass@j`` → value, j ascending)."""
    passes = sorted(
        (k for k in evaluation if k.startswith("pass@")), key=lambda k: int(k[5:]) if k[5:].isdigit() else 0
    )
    return {k: evaluation.get(k) for k in EVALUATION_KEYS} | {"pass": {k: evaluation[k] for k in passes}}


def build_report(data: RunData, conv: str = "all-tasks", labels: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """The report document of ``data`` under the named aggregation conventions."""
    chosen = conventions(conv)
    labels = label_candidates(data) if labels is None else labels
    outcomes = [outcome(rec) for rec in data.tasks]
    agg = aggregate(outcomes, chosen)
    judged = [c.result for rec in data.tasks for c in rec.candidates if c.result is not None]
    counts = verdict_counts(judged)
    env, envs = environment(data)
    rejected = [
        {
            "task": rec.task.task_id, "candidate": c.hash, "flags": c.result.flags,
            "message": (c.result.message.splitlines() or [""])[0][:300],
        }
        for rec in data.tasks
        for c in rec.candidates
        if c.result is not None and c.result.status is Status.REJECTED
    ]
    others = {name: aggregate(outcomes, c)["summary"] for name, c in CONVENTIONS.items() if name != chosen.name}
    by_level: dict[str, list] = {}
    for rec in data.tasks:
        if not degenerate(rec):
            by_level.setdefault(level_key(rec.task.level), []).extend(c.result for c in rec.candidates if c.result)
    doc = {
        "summary": agg["summary"] | {"candidates": len(judged), "conventions": chosen.name, **counts},
        "levels": {k: v | {"candidates": len(by_level.get(k, [])), **verdict_counts(by_level.get(k, []))}
                   for k, v in agg["levels"].items()},
        "baselines": agg["baselines"],
        "tasks": [task_row(rec, labels) for rec in data.tasks],
        "techniques": technique_table(data, labels),
        "environment": env,
        "environments": envs,
        "rounds": rounds(data),
        "degenerate": agg["degenerate"],
        "rejected": rejected,
        "conventions": others,
        "runs": [{k: r[k] for k in ("store", "kind", "status")} for r in data.runs],
        "sources": data.paths,
    }
    if data.audit is not None:
        doc["audit"] = audit_section(data.audit)
    if data.evaluations:
        doc["evaluations"] = [evaluation_section(e) for e in data.evaluations]
    return doc
