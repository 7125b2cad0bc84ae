"""What a task of ``benchmarks/builtin_kernelbench.py`` costs in GPU time, and ``--cost-probe``: the
same baselines timed with the cost levers off and on, in one call, on the same tasks.

Two measures, both printed with the report and written under ``cost`` in ``OUT/report.json``:

- **device seconds per task** (the issue's "H200 time per task"): for each call of the benchmark,
  the wall time of its judged batches (search, baselines, re-timing) times the GPUs they ran on
  (``OUT/run.json``), divided by the tasks that call finished.  Batches recorded before the GPU
  count was kept are counted as one GPU (the stride-5 run's were: one H200).  And the same on the
  verdicts the figures stand on (:func:`standing`): where ``--rejudge`` took out a stage's
  verdicts of every task (``all``, ``all:baselines``), the batches that stage ran before are left
  out, as work done again; per task finished now, degenerate ones included.
- **lease-held seconds per task**: from every verdict of the task (the store's search and
  baseline verdicts, ``confirm.json``'s re-timings where they carry them), the seconds its worker
  held the GPU's lease (the phases of :data:`cudal1.harness.parent.batchstats.GPU_PHASES`), and of
  those the seconds of ``construct`` + ``compile`` + ``correctness`` (where a torch.compile job
  compiles; ``compile``, Inductor's compiling alone, is its own phase in verdicts since it got
  the build deadline, and inside ``correctness`` in those before).  Two
  workers per GPU hold the lease side by side in the shared phases, so these add up to more than
  the device seconds; they say where each task's time goes (and, per KernelBench level, which
  tasks are the expensive ones).

And where the lanes ran short-handed: the seconds in which 1, 2, … verdicts ran at once
(:func:`running_seconds`, from the store's recording times and each verdict's wall, and the
re-timings' in ``confirm.json`` where they carry one, since 2026-12-05), which shows the tails at
batch boundaries on runs that predate ``run.json``'s per-batch ``lanes_unused_share``; and which
verdicts ran by themselves (:func:`alone_seconds`: a batch's or a call's last long job, or one
judged again with the GPU to itself), the seconds in which the other lanes had nothing.

The cost levers (``--levers on``, the default) leave out the baselines a task's own verdicts make
redundant (:mod:`builtin_baseline_plan`), and change where and how often the rest compile, never
how they are timed: the baselines of a task share one persistent torch.compile/Triton cache
(``EvalConfig.baseline_cache``: each mode compiles once per machine, so ``--confirm``'s re-timing
of the best mode finds its kernels, and later modes reuse an earlier one's), baselines are timed
mode by mode (two workers time different tasks, and a task's next mode starts once its previous
one compiled), and a job that calls torch.compile imports Inductor before it takes the GPU's lease.
None of them is in the judge's config hash: stored verdicts stay valid either way.

``--cost-probe N`` times, outside the run store, the baselines of the first N finished tasks
(the modes the baseline plan keeps with the levers on, every ``--modes`` mode with them off, then
the re-timing of each task's best compile mode, as a run does) twice from empty caches: levers
on, then levers off (the earlier batch warms nothing the later
one uses but the machine itself, which favours *off*; Inductor's import before the lease has no
switch and is in both).  It prints the device seconds per task of
each and every (task, mode) speedup of both with whether their 95% intervals overlap: the levers
must leave the figures inside their confidence intervals.  The result goes to
``OUT/cost_probe.json``.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Collection, Iterator

import builtin_baseline_plan
from builtin_figures import counted, geomean, n_finished, retimed_values
from builtin_figures import summarize as figures_of
from cudal1.compile_modes import UNGRAPHED_TWIN
from cudal1.harness.parent.batchstats import GPU_PHASES

COMPILE_PHASES = ("construct", "compile", "compile_cpu", "correctness")
COMPILING_PHASES = ("compile", "compile_cpu")  # torch.compile's compiling alone, with the lease or without


def seconds_in(phase_s: dict[str, float] | None, phases: Collection[str]) -> float:
    """Seconds a verdict spent in ``phases``."""
    return sum(v for k, v in (phase_s or {}).items() if k in phases)


def held_s(phase_s: dict[str, float] | None) -> float:
    """Seconds a verdict's worker held the GPU's lease."""
    return seconds_in(phase_s, GPU_PHASES)


def compile_s(phase_s: dict[str, float] | None) -> float:
    return seconds_in(phase_s, COMPILE_PHASES)


def _add(into: dict[str, float], more: dict[str, float]) -> dict[str, float]:
    """``into`` with ``more``'s seconds added key by key."""
    for key, secs in more.items():
        into[key] = into.get(key, 0.0) + secs
    return into


def _largest_first(sums: dict[str, float]) -> dict[str, float]:
    return dict(sorted(sums.items(), key=lambda kv: -kv[1]))


def phase_sums(phase_s: list[dict[str, float] | None]) -> dict[str, float]:
    """Seconds per lease-held phase (:data:`GPU_PHASES`), summed over verdicts."""
    sums: dict[str, float] = {}
    for one in phase_s:
        _add(sums, {phase: secs for phase, secs in (one or {}).items() if phase in GPU_PHASES})
    return sums


def step_sums(spent: list[dict[str, float] | None]) -> dict[str, float]:
    """Seconds per step of a phase (the verdicts' ``figures["reference_cost"]`` or
    ``["correctness_cost"]``, recorded since 2026-12-04), summed over verdicts."""
    sums: dict[str, float] = {}
    for one in spent:
        _add(sums, {key[:-3]: ms / 1e3 for key, ms in (one or {}).items() if key.endswith("_ms") and key != "total_ms"})
    return sums


def task_costs(out: Path, tasks: list, config_hash: str) -> dict[str, dict[str, Any]]:
    """Per task id: lease-held and compile seconds of its search verdicts (the reference anchor
    included), its baselines and its re-timings, under the run's judge configuration."""
    from cudal1.report.load import ReportError, load_runs

    try:
        data = load_runs([out]) if (out / "cudal1.sqlite").exists() else None
    except ReportError:
        data = None
    records = {r.task.hash: r for r in data.tasks} if data else {}
    confirmed = json.loads((out / "confirm.json").read_text()) if (out / "confirm.json").exists() else {}
    mine = lambda r: r is not None and (not r.config_hash or r.config_hash == config_hash)  # noqa: E731
    costs: dict[str, dict[str, Any]] = {}
    for t in tasks:
        rec = records.get(t.hash)
        if rec is None:
            continue
        search = [r for r in [rec.reference] + [c.result for c in rec.candidates] if mine(r)]
        base = [r for r in rec.baselines.values() if mine(r)]
        again = [c for k, c in confirmed.items() if k.startswith(t.task_id + "|") and "phase_s" in c]
        costs[t.task_id] = {
            "steps": {phase: step_sums([r.figures.get(f"{phase}_cost") for r in search + base])
                      for phase in ("reference", "correctness")},
            "phases": {"search": phase_sums([r.phase_s for r in search]),
                       "baselines": phase_sums([r.phase_s for r in base]),
                       "confirm": phase_sums([c["phase_s"] for c in again])},
            "search": {"verdicts": len(search), "held_s": sum(held_s(r.phase_s) for r in search),
                       "compile_s": sum(compile_s(r.phase_s) for r in search),
                       "compiling_s": sum(seconds_in(r.phase_s, COMPILING_PHASES) for r in search)},
            "baselines": {"verdicts": len(base), "held_s": sum(held_s(r.phase_s) for r in base),
                          "compile_s": sum(compile_s(r.phase_s) for r in base),
                          "construct_s": sum(seconds_in(r.phase_s, ("construct",)) for r in base),
                          "compiling_s": sum(seconds_in(r.phase_s, COMPILING_PHASES) for r in base)},
            "confirm": {"verdicts": len(again), "held_s": sum(held_s(c["phase_s"]) for c in again)},
            "exclusive": {stage: exclusive_s(rs) for stage, rs in (("search", search), ("baselines", base))},
        }
    return costs


def exclusive_s(results: list) -> dict[str, float]:
    """Seconds the verdicts held the GPU's lease exclusive before timing (``figures
    ["exclusive_before_timing_s"]``, recorded since 2026-12-04) and how many recorded it."""
    held = [r.figures["exclusive_before_timing_s"] for r in results if "exclusive_before_timing_s" in r.figures]
    return {"s": float(sum(held)), "verdicts": len(held)}


def _stretches(spans: list[tuple[Any, ...]]) -> Iterator[tuple[float, frozenset[int]]]:
    """``(seconds, indices of the spans running)`` for each stretch of time in which at least one
    of ``spans`` (``(start, end, …)``) ran; one that starts as another ends never overlaps it."""
    edges = sorted([(sp[0], 1, i) for i, sp in enumerate(spans)] + [(sp[1], -1, i) for i, sp in enumerate(spans)],
                   key=lambda e: (e[0], e[1]))
    running: set[int] = set()
    last = None
    for t, step, i in edges:
        if running and last is not None and t > last:
            yield t - last, frozenset(running)
        (running.add if step == 1 else running.discard)(i)
        last = t


def running_at_once(spans: list[tuple[float, float]]) -> dict[int, float]:
    """Seconds in which ``k`` of ``spans`` ran at once, for each ``k`` of at least 1 (the time with
    none running, between calls and during the re-timings, is left out)."""
    out: dict[int, float] = {}
    for seconds, running in _stretches(spans):
        out[len(running)] = out.get(len(running), 0.0) + seconds
    return dict(sorted(out.items()))


def running_alone(spans: list[tuple[float, float, Any]]) -> dict[Any, float]:
    """Seconds in which each span's label (``(start, end, label)``) was the only one running: what
    kept the other lanes idle at a batch's or a call's end, or judged with the GPU to itself."""
    out: dict[Any, float] = {}
    for seconds, running in _stretches(spans):
        if len(running) == 1:
            label = spans[next(iter(running))][2]
            out[label] = out.get(label, 0.0) + seconds
    return out


def _spans(out: Path, config_hash: str, names: dict[str, str] | None = None) -> list[tuple[float, float, Any]]:
    """``(start, end, (task, kind, judged again alone))`` of the run's search and baseline verdicts
    under ``config_hash`` (the store's recording times; ``names``: task id by task hash) and of its
    re-timings that carry a recording time (``at``; kind ``re-timing``)."""
    from cudal1.store import RunStore

    if not (out / "cudal1.sqlite").exists():
        return []
    with RunStore(out / "cudal1.sqlite") as store:
        spans: list[tuple[float, float, Any]] = [
            (v.start, v.end, ((names or {}).get(v.task_hash, v.task_hash[:12]), v.kind, v.rejudged_alone))
            for v in store.verdict_spans(config_hash)]
    confirmed = json.loads((out / "confirm.json").read_text()) if (out / "confirm.json").exists() else {}
    spans += [(c["at"] - c["wall_s"], c["at"], (key.split("|", 1)[0], "re-timing", False))
              for key, c in confirmed.items()
              if isinstance(c.get("at"), (int, float)) and isinstance(c.get("wall_s"), (int, float))]
    return spans


def running_seconds(out: Path, config_hash: str) -> dict[int, float]:
    """:func:`running_at_once` over the run's search and baseline verdicts under ``config_hash``
    (the store's recording times) and its re-timings that carry a recording time (``at``): where
    a batch ran short-handed, its tails at the boundaries included, on runs that predate
    ``lanes_unused_share`` too."""
    return running_at_once([sp[:2] for sp in _spans(out, config_hash)])


def alone_seconds(out: Path, config_hash: str, names: dict[str, str]) -> list[dict[str, Any]]:
    """:func:`running_alone` over the same verdicts, longest first: ``{task, kind, s,
    rejudged_alone}`` for each verdict kind of a task that ran by itself for at least 0.5 s."""
    alone = running_alone(_spans(out, config_hash, names))
    return [{"task": task, "kind": kind, "s": round(s, 1), "rejudged_alone": again}
            for (task, kind, again), s in sorted(alone.items(), key=lambda kv: -kv[1]) if s >= 0.5]


def call_costs(run: dict, finished_by_call: dict[str, int]) -> list[dict[str, Any]]:
    """Per call of the benchmark (batches grouped by their ``call`` stamp; earlier batches, which
    carry none, as one call ``before``): device seconds by kind and per task it finished, and the
    judge workers per GPU of its search and baselines (None where the batches did not record it)."""
    calls: dict[str, dict[str, Any]] = {}
    for b in run.get("batches", []):
        c = calls.setdefault(b.get("call", "before"), {"call": b.get("call", "before"), "levers": b.get("levers"),
                                                       "device_s": {}, "jobs": 0, "workers_per_gpu": None})
        kind = b["what"].split()[0]  # search | baselines | confirm (winners, modes) | baselines+confirm (joined)
        c["device_s"][kind] = c["device_s"].get(kind, 0.0) + b["wall_s"] * b.get("gpus", 1)
        c["jobs"] += b["jobs"]
        if kind != "confirm" and b.get("workers_per_gpu") is not None:
            c["workers_per_gpu"] = b["workers_per_gpu"]
        if b.get("compile_lease"):
            c["compile_lease"] = b["compile_lease"]
        if b.get("first_call_lease"):
            c["first_call_lease"] = b["first_call_lease"]
        if b.get("baseline_lease"):
            c["baseline_lease"] = b["baseline_lease"]
        if b.get("lease_order"):
            c["lease_order"] = b["lease_order"]
    for c in calls.values():
        c["finished"] = finished_by_call.get(c["call"])
        total = sum(c["device_s"].values())
        c["device_s_total"] = total
        c["device_s_per_task"] = total / c["finished"] if c["finished"] else None
    return list(calls.values())


STAGE_SCOPES = {"search": ("verdicts",), "baselines": ("verdicts", "baselines")}  # what a re-judge's scope replaces


def _stage(what: str) -> str:
    """A batch's stage: ``search``, or ``baselines`` for the baselines, the re-timings and the two
    joined (``baselines+confirm``)."""
    return "search" if what.split()[0] == "search" else "baselines"


def standing(run: dict, replaced: list[dict[str, Any]], task_ids: Collection[str], finished: int) -> dict[str, Any]:
    """The device seconds of the batches whose verdicts the run's figures stand on, per task
    finished.  A batch's verdicts are all gone when, after the batch ended, re-judges
    (``builtin_rejudge.replaced``) took out its stage's verdicts of *every* task of the run (the
    ``all`` forms): its seconds are left out, as work the run then did again.  A re-judge of some
    tasks or of one baseline mode leaves the batches it touched counted whole (their share of
    them is not recorded), so the figure errs high; so does a batch without its end time (``at``)."""
    whole = set(task_ids)
    times = [(dt.datetime.fromisoformat(e["at"]), e["task"], e["scope"]) for e in replaced]
    kept_s = left_s = 0.0
    left = 0
    for b in run.get("batches", []):
        seconds = b["wall_s"] * b.get("gpus", 1)
        end = dt.datetime.fromisoformat(b["at"]) if b.get("at") else None
        scopes = STAGE_SCOPES[_stage(b["what"])]
        covered = {task for at, task, scope in times if end is not None and at >= end and scope in scopes}
        if whole and covered >= whole:
            left_s, left = left_s + seconds, left + 1
        else:
            kept_s += seconds
    return {"device_s": kept_s, "finished": finished, "per_task": kept_s / finished if finished else None,
            "unfinished": len(whole) - finished, "replaced_s": left_s, "replaced_batches": left}


def summarize(costs: dict[str, dict[str, Any]], calls: list[dict[str, Any]],
              running: dict[int, float] | None = None, standing: dict[str, Any] | None = None,
              alone: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    def med(xs: list[float]) -> float | None:
        return statistics.median(xs) if xs else None

    def total(c: dict[str, Any]) -> float:
        return c["search"]["held_s"] + c["baselines"]["held_s"] + c["confirm"]["held_s"]

    full = [c for c in costs.values() if c["baselines"]["verdicts"]]
    levels: dict[str, list[float]] = {}
    for task_id, c in costs.items():
        if c["baselines"]["verdicts"]:
            levels.setdefault(task_id.split("/", 1)[0] if "/" in task_id else "-", []).append(total(c))
    exclusive: dict[str, dict[str, float]] = {}  # stage -> {s, verdicts}
    for c in costs.values():
        for stage, e in c.get("exclusive", {}).items():
            _add(exclusive.setdefault(stage, {}), e)
    by_phase: dict[str, dict[str, float]] = {}  # stage -> phase -> seconds
    steps: dict[str, dict[str, float]] = {}  # phase -> step -> seconds
    for c in costs.values():
        for totals, key in ((by_phase, "phases"), (steps, "steps")):
            for name, sums in c.get(key, {}).items():
                _add(totals.setdefault(name, {}), sums)
    # the tasks finished now; without that count, the calls' finishings (a task re-judged and finished
    # again counts twice there)
    finished = standing["finished"] if standing else sum(c["finished"] or 0 for c in calls)
    device_s = sum(c["device_s_total"] for c in calls)
    return {
        "tasks": len(full),
        "device_s": {"total": device_s, "finished": finished, "per_task": device_s / finished if finished else None},
        "held_s_by_phase": {stage: _largest_first(v) for stage, v in by_phase.items()},
        "s_by_step": {phase: _largest_first(v) for phase, v in steps.items() if v},
        "held_s_by_level": {k: {"tasks": len(v), "total": med(v)} for k, v in sorted(levels.items())},
        "held_s_per_task": {
            "search": med([c["search"]["held_s"] for c in full]),
            "search_compiling": med([c["search"].get("compiling_s", 0.0) for c in full]),
            "baselines": med([c["baselines"]["held_s"] for c in full]),
            "baselines_compile": med([c["baselines"]["compile_s"] for c in full]),
            "baselines_construct": med([c["baselines"]["construct_s"] for c in full]),
            "baselines_compiling": med([c["baselines"].get("compiling_s", 0.0) for c in full]),
            "total": med([total(c) for c in full]),
        },
        "exclusive_before_timing": exclusive,
        "calls": calls,
        **({"standing": standing} if standing else {}),
        "running_s": {str(k): v for k, v in (running or {}).items()},
        "alone_s": alone or [],
        "per_task": costs,
    }


def markdown(cost: dict[str, Any]) -> str:
    f = lambda x: "-" if x is None else f"{x:.0f}"  # noqa: E731
    h = cost["held_s_per_task"]
    lines = [f"cost, lease-held seconds per task (median of {cost['tasks']} tasks with baselines): "
             f"search {f(h['search'])} (compile {f(h.get('search_compiling'))}), baselines {f(h['baselines'])} "
             f"(construct + compile + correctness "
             f"{f(h['baselines_compile'])}, of it construct {f(h['baselines_construct'])}, compile "
             f"{f(h.get('baselines_compiling'))}), all {f(h['total'])}"]
    if cost.get("held_s_by_level"):
        lines.append("by level, median lease-held seconds per task, all stages: " + ", ".join(
            f"{k} {f(v['total'])} ({v['tasks']} tasks)" for k, v in cost["held_s_by_level"].items()))
    for c in cost["calls"]:
        kinds = ", ".join(f"{k} {v:.0f}" for k, v in c["device_s"].items())
        workers = f", {c['workers_per_gpu']} worker(s) per GPU" if c.get("workers_per_gpu") else ""
        workers += f", compiling with the lease {c['compile_lease']}" if c.get("compile_lease") else ""
        workers += f", first call's lease {c['first_call_lease']}" if c.get("first_call_lease") else ""
        workers += f", a compiled baseline's {c['baseline_lease']}" if c.get("baseline_lease") else ""
        workers += f", the lease {c['lease_order']}" if c.get("lease_order") else ""
        lines.append(f"cost of call {c['call']} (levers {c['levers'] or 'n/a'}{workers}): device seconds {kinds} "
                     f"= {c['device_s_total']:.0f} for {c['finished'] if c['finished'] is not None else '?'} "
                     f"task(s) finished: {f(c['device_s_per_task'])} s per task")
    d = cost.get("device_s")
    if d and len(cost["calls"]) > 1:
        lines.append(f"cost of all {len(cost['calls'])} calls: device seconds {d['total']:.0f} for {d['finished']} "
                     f"task(s) finished: {f(d['per_task'])} s per task")
    st = cost.get("standing")
    if st and st["replaced_batches"]:
        lines.append(f"cost of the verdicts the figures stand on: device seconds {st['device_s']:.0f} for "
                     f"{st['finished']} task(s) finished: {f(st['per_task'])} s per task"
                     + (f" ({st['unfinished']} task(s) unfinished, their work so far included)" if st["unfinished"]
                        else "")
                     + f"; left out, {st['replaced_s']:.0f} device s of {st['replaced_batches']} batch(es) whose "
                       "verdicts a later re-judge of every task took out")
    if cost.get("running_s"):
        lines.append("verdicts running at once, seconds (from their recording times; re-timings recorded before "
                     "2026-12-05 are not in it): " + ", ".join(f"{k}: {v:.0f}" for k, v in cost["running_s"].items()))
    if cost.get("alone_s"):
        alone = cost["alone_s"]
        again = sum(a["s"] for a in alone if a["rejudged_alone"])
        retimed = sum(a["s"] for a in alone if a["kind"] == "re-timing")
        lines.append(f"one verdict running by itself, seconds: {sum(a['s'] for a in alone):.0f} (verdicts judged "
                     f"again alone {again:.0f}, re-timings {retimed:.0f}); longest: " + ", ".join(
                         f"{a['task']} {a['kind']}{' (judged again alone)' if a['rejudged_alone'] else ''} {a['s']:.0f}"
                         for a in alone[:6]))
    ex = {k: v for k, v in (cost.get("exclusive_before_timing") or {}).items() if v.get("verdicts")}
    if ex:
        lines.append("the lease held exclusive before timing (what a verdict kept every other one off the GPU for, "
                     "untimed), seconds: " + ", ".join(f"{k} {v['s']:.0f} ({v['verdicts']:.0f} verdicts)"
                                                       for k, v in ex.items()))
    if cost.get("held_s_by_phase"):
        lines.append("lease-held seconds by phase, all tasks: " + "; ".join(
            f"{stage} " + ", ".join(f"{p} {v:.0f}" for p, v in phases.items())
            for stage, phases in cost["held_s_by_phase"].items() if phases))
    for phase, steps in (cost.get("s_by_step") or {}).items():
        lines.append(f"{phase} phase by step, search and baselines: " + ", ".join(
            f"{k} {v:.0f}" for k, v in steps.items()))
    return "\n".join(lines)


# ---- --cost-probe ---------------------------------------------------------------------------------------


def probe(out: Path, tasks: list, rows: list[dict], modes: list[str], judge: Any, plan: Any,
          confirm_workers_per_gpu: int, n: int) -> dict[str, Any]:
    """Baselines of the first ``n`` finished tasks (and the re-timing of each one's best compile
    mode) from empty caches, levers on then off; written to ``OUT/cost_probe.json``."""
    from cudal1.harness.baselines import check_modes
    from cudal1.harness.parent.api import time_baselines

    modes = check_modes(modes, plan.device)  # as the run times them (CUDA-only modes dropped on a CPU)
    by_id = {t.task_id: t for t in tasks}
    done = [r for r in rows if counted(r)][:n]
    chosen = [by_id[r["task"]] for r in done]
    best = {r["task"]: r["best_mode"] for r in done if r["best_mode"]}
    passes: dict[str, Any] = {}
    for label, on in (("on", True), ("off", False)):
        root = Path(tempfile.mkdtemp(prefix="cudal1_cost_probe_"))
        cfg = judge.replace(baseline_cache=on, cache_dir=str(root))
        walls: list[float] = []
        add = walls.append
        t0 = time.monotonic()
        skipped: dict[str, dict[str, str]] = {}
        try:
            if on:  # as the run does: the baseline plan's phases, the graph rule on this pass's own cudagraph
                items, first = [], []
                for phase in builtin_baseline_plan.phases(modes):
                    todo, skips = builtin_baseline_plan.plan([_as_measured(r, items, first) for r in done], phase)
                    builtin_baseline_plan.merge_skips(skipped, skips)
                    now = [(by_id[t], m) for t, m in todo]
                    if now:
                        first += time_baselines(now, cfg, plan=plan, on_stats=lambda s, add=add: add(s.wall_s))
                    items += now
            else:
                items = [(t, m) for t in chosen for m in modes]
                first = time_baselines(items, cfg, plan=plan, on_stats=lambda s, add=add: add(s.wall_s))
            again_items = [(by_id[t], m) for t, m in best.items()]
            again = time_baselines(again_items, cfg.replace(workers_per_gpu=confirm_workers_per_gpu), plan=plan,
                                   on_stats=lambda s, add=add: add(s.wall_s))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        passes[label] = {
            "wall_s": time.monotonic() - t0, "device_s": sum(walls) * len(plan.lanes),
            "device_s_per_task": sum(walls) * len(plan.lanes) / max(1, len(chosen)),
            "held_s": sum(held_s(r.phase_s) for r in first + again),
            "construct_s": sum((r.phase_s or {}).get("construct", 0.0) for r in first + again),
            "results": {f"{t.task_id}|{m}": _short(r) for (t, m), r in zip(items, first)}
            | {f"{t.task_id}|{m}|again": _short(r) for (t, m), r in zip(again_items, again)},
            "skipped": skipped,
        }
    result = {"tasks": [t.task_id for t in chosen], "modes": modes, "gpus": len(plan.lanes),
              "passes": passes, "agreement": agreement(passes["on"]["results"], passes["off"]["results"])}
    (out / "cost_probe.json").write_text(json.dumps(result, indent=1))
    return result


def _as_measured(row: dict[str, Any], items: list, results: list) -> dict[str, Any]:
    """``row`` with its modes as this probe pass measured them so far; a mode the search judged
    keeps the search's verdict (it stands in for that mode, as in the run)."""
    kept = [m for m in row["modes"] if builtin_baseline_plan.searched(row, m)]
    value = {m: row["modes"][m] for m in kept}
    status = {m: row["mode_status"][m] for m in kept}
    ci = {m: row["mode_ci"][m] for m in kept if m in (row.get("mode_ci") or {})}
    for (t, m), r in zip(items, results):
        if t.task_id == row["task"]:
            status[m] = r.status.value
            if r.status.value == "ok" and r.speedup is not None:
                value[m] = r.speedup
                if r.speedup_ci:
                    ci[m] = list(r.speedup_ci)
    return row | {"modes": value, "mode_status": status, "mode_ci": ci}


def _short(r: Any) -> dict[str, Any]:
    return {"status": r.status.value, "speedup": r.speedup, "speedup_ci": r.speedup_ci, "phase_s": r.phase_s}


def agreement(on: dict[str, dict], off: dict[str, dict]) -> dict[str, Any]:
    """Per (task, mode): both speedups, and whether their 95% intervals overlap; the statuses that
    differ."""
    rows, differ = [], []
    for key in sorted(set(on) & set(off)):
        a, b = on[key], off[key]
        if a["status"] != b["status"]:
            differ.append([key, b["status"], a["status"]])
            continue
        if a["speedup"] is None or b["speedup"] is None:
            continue
        ca, cb = a.get("speedup_ci") or [a["speedup"]] * 2, b.get("speedup_ci") or [b["speedup"]] * 2
        rows.append([key, b["speedup"], a["speedup"], ca[0] <= cb[1] and cb[0] <= ca[1]])
    return {"compared": len(rows), "overlapping": sum(1 for r in rows if r[3]), "rows": rows,
            "status_differs": differ}


def probe_markdown(p: dict[str, Any]) -> str:
    on, off = p["passes"]["on"], p["passes"]["off"]
    a = p["agreement"]
    lines = [f"cost probe over {len(p['tasks'])} task(s) ({', '.join(p['tasks'])}), modes {', '.join(p['modes'])}, "
             f"baselines and the best mode's re-timing, {p['gpus']} GPU(s):",
             f"  levers off: {off['device_s_per_task']:.0f} device s per task (lease held {off['held_s']:.0f} s, "
             f"construct {off['construct_s']:.0f} s)",
             f"  levers on:  {on['device_s_per_task']:.0f} device s per task (lease held {on['held_s']:.0f} s, "
             f"construct {on['construct_s']:.0f} s)",
             f"  speedups with overlapping 95% intervals: {a['overlapping']} of {a['compared']}"
             + (f"; status differs: {a['status_differs']}" if a["status_differs"] else "")]
    lines += [f"    {k}: off {x:.3f}, on {y:.3f}{'' if ok else '  (intervals apart)'}" for k, x, y, ok in a["rows"]]
    skipped = on.get("skipped") or {}
    if skipped:
        lines.append("  not timed with the levers on (builtin_baseline_plan.py), and what the levers-off pass read:")
        for task, why in sorted(skipped.items()):
            for mode, reason in sorted(why.items()):
                lines.append(f"    {task}|{mode}: off {_value(off, task, mode)}"
                             + (f", its sibling {UNGRAPHED_TWIN[mode]} {_value(off, task, UNGRAPHED_TWIN[mode])}"
                                if mode in UNGRAPHED_TWIN else "") + f"; {reason}")
    return "\n".join(lines)


def _value(probe_pass: dict[str, Any], task: str, mode: str) -> str:
    r = probe_pass["results"].get(f"{task}|{mode}")
    if r is None:
        return "-"
    return f"{r['speedup']:.3f}" if r["status"] == "ok" and r["speedup"] is not None else r["status"]


# ---- two judge configurations of one run ------------------------------------------------------------


def _finished_rows(report: dict[str, Any]) -> dict[str, dict]:
    return {r["task"]: r for r in report["rows"] if counted(r)}


def _measures(row: dict[str, Any]) -> dict[str, dict]:
    """A finished task's measurements with their status and 95% interval, keyed alike in any
    configuration: each compile mode, the search's best, and the two re-timings."""
    got: dict[str, dict] = {}
    for m, status in row["mode_status"].items():
        if status not in (None, "skipped"):  # a verdict of any status
            got[f"{row['task']}|mode:{m}"] = {"status": status, "speedup": row["modes"].get(m),
                                               "speedup_ci": (row.get("mode_ci") or {}).get(m)}
    if row.get("best") is not None:
        got[f"{row['task']}|best builtin"] = {"status": "ok", "speedup": row["best"], "speedup_ci": row.get("best_ci")}
    for key, label in (("best_confirmed", "best builtin, re-timed"), ("mode_confirmed", "best mode, re-timed")):
        c = row.get(key)
        if c:
            got[f"{row['task']}|{label}"] = {"status": c["status"], "speedup": c["speedup"],
                                             "speedup_ci": c.get("speedup_ci")}
    return got


def geomean_interval(values: list[float], resamples: int = 10_000, seed: int = 0) -> list[float] | None:
    """The geomean of positive ``values`` with its 95% percentile-bootstrap interval over them (the
    tasks resampled with replacement; seeded, so a report reads the same every time): [geomean,
    low, high], None without values.  Of two runs' per-task ratios (the same tasks), an interval
    covering 1.0 means the runs' figures do not differ beyond what the choice of tasks spreads."""
    logs = [math.log(v) for v in values if v and v > 0]
    if not logs:
        return None
    rng, n = random.Random(seed), len(logs)
    means = sorted(sum(rng.choices(logs, k=n)) / n for _ in range(resamples))
    lo, hi = means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]
    return [geomean(values), math.exp(lo), math.exp(hi)]


def headline_intervals(before: dict[str, dict], now: dict[str, dict], tasks: list[str]) -> dict[str, Any]:
    """The two re-timed headline figures (best builtin over eager; over the re-timed best compile
    mode) of two runs on the same counted tasks, each with its bootstrap interval over the tasks,
    and the paired one of now/before per task (:func:`geomean_interval`)."""
    a = {t: (b, m) for t, b, m in retimed_values([before[t] for t in tasks])}
    b = {t: (x, m) for t, x, m in retimed_values([now[t] for t in tasks])}
    eager = [t for t in tasks if t in a and t in b]
    over = [t for t in eager if a[t][1] and b[t][1]]
    out: dict[str, Any] = {}
    for name, keys, value in (("best", eager, lambda v: v[0]), ("over_best_compile_mode", over, lambda v: v[0] / v[1])):
        out[name] = {"n": len(keys), "before": geomean_interval([value(a[t]) for t in keys]),
                     "now": geomean_interval([value(b[t]) for t in keys]),
                     "now_over_before": geomean_interval([value(b[t]) / value(a[t]) for t in keys])}
    return out


def compare(before: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """The same run under two judge configurations (``report.N.json`` kept when the judge changed,
    and ``report.json``): on the tasks finished under both, every measurement of the one against
    the other's (:func:`agreement`; a measurement without an interval counts as a point), the
    winning chains, the headline figures, and the device seconds per task of each configuration's
    calls (the calls of ``now`` that ``before`` does not list are the new configuration's; their
    seconds include work on tasks not finished yet, so the new figure is an upper bound)."""
    a, b = _finished_rows(before), _finished_rows(now)  # the figures: on the tasks finished in both
    order = {r["task"]: i for i, r in enumerate(now["rows"])}
    both = sorted(set(a) & set(b), key=order.__getitem__)
    m_before = {k: v for t in both for k, v in _measures(a[t]).items()}
    m_now = {k: v for t in both for k, v in _measures(b[t]).items()}
    earlier_calls = {c["call"] for c in before["cost"]["calls"]}
    old_s = sum(c["device_s_total"] for c in before["cost"]["calls"])
    new_calls = [c for c in now["cost"]["calls"] if c["call"] not in earlier_calls]
    new_s = sum(c["device_s_total"] for c in new_calls)
    held = lambda rep, t: sum(rep["cost"]["per_task"].get(t, {}).get(k, {}).get("held_s", 0.0)  # noqa: E731
                              for k in ("search", "baselines", "confirm"))
    agreed = agreement(m_now, m_before)  # argument order: rows read [key, before, now, overlap]
    # one run's interval describes the spread inside that run, not between two runs: how many also
    # lie within 1% of each other, and the largest difference
    agreed["within_1pct"] = sum(1 for _, x, y, _ in agreed["rows"] if abs(y / x - 1) <= 0.01)
    agreed["largest"] = max(agreed["rows"], key=lambda r: abs(r[2] / r[1] - 1), default=None)
    return {
        "tasks": both,
        "agreement": agreed,
        "chains": [[t, a[t]["best_passes"], b[t]["best_passes"]] for t in both],
        "intervals": headline_intervals(a, b, both),
        "figures": {name: {k: same[k] for k in ("best", "over_best_compile_mode")}
                    for name, rep, rows in (("before", before, a), ("now", now, b))
                    for same in [figures_of([rows[t] for t in both], rep.get("modes") or [])["retimed"]]},
        # per task finished, degenerate ones included (their search and baselines ran too)
        "device_s_per_task": {"before": old_s / n_before if (n_before := n_finished(before["rows"])) else None,
                              "now": new_s / n_now if (n_now := n_finished(now["rows"])) and new_calls else None,
                              "before_tasks": n_before, "now_tasks": n_now, "now_calls": len(new_calls),
                              **({"now_standing": st["per_task"], "now_standing_tasks": st["finished"]}
                                 if (st := now["cost"].get("standing")) and st["replaced_batches"] else {})},
        "held_s_per_task": {"before": statistics.median([held(before, t) for t in both]) if both else None,
                            "now": statistics.median([held(now, t) for t in both]) if both else None},
    }


def compare_markdown(c: dict[str, Any], what: str = "the judge's two configurations") -> str:
    f = lambda x, d=0: "-" if x is None else f"{x:.{d}f}"  # noqa: E731
    d, h, g = c["device_s_per_task"], c["held_s_per_task"], c["figures"]
    ag = c["agreement"]
    def ci(v: list[float] | None) -> str:
        return "-" if v is None else f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"

    def fig(s: dict[str, Any]) -> str:
        best, over = s["best"] or {}, s["over_best_compile_mode"] or {}
        return (f"best builtin re-timed geomean {f(best.get('geomean'), 3)}x (n {best.get('n')}), over the best "
                f"compile mode {f(over.get('geomean'), 3)}x ({over.get('wins')} of {over.get('n')} won)")

    lines = [f"{what} on the {len(c['tasks'])} task(s) finished under both:",
             f"  device s per task: before {f(d['before'])} ({d['before_tasks']} tasks), now {f(d['now'])} "
             f"({d['now_calls']} call(s), {d['now_tasks']} tasks finished; work on unfinished tasks included)"
             + (f"; on the verdicts its figures stand on (batches a re-judge of every task replaced left out) "
                f"{f(d['now_standing'])} ({d['now_standing_tasks']} tasks finished)" if "now_standing" in d else ""),
             f"  lease-held s per task (median): before {f(h['before'])}, now {f(h['now'])}",
             f"  before: {fig(g['before'])}", f"  now:    {fig(g['now'])}",
             *(f"  {label} (n {iv['n']}), geomean [95% bootstrap interval over tasks]: before {ci(iv['before'])}, "
               f"now {ci(iv['now'])}; now/before per task {ci(iv['now_over_before'])}"
               for label, iv in (("re-timed best builtin over eager", c["intervals"]["best"]),
                                 ("over the re-timed best compile mode", c["intervals"]["over_best_compile_mode"]))),
             f"  measurements with overlapping 95% intervals: {ag['overlapping']} of {ag['compared']}, within 1% "
             f"of each other: {ag['within_1pct']} of {ag['compared']}"
             + (f"; status differs: {ag['status_differs']}" if ag["status_differs"] else "")]
    lines += [f"    {k}: before {x:.3f}, now {y:.3f}{'' if ok else '  (intervals apart)'}"
              for k, x, y, ok in ag["rows"]]
    lines += [f"    {t}: winning chain before {x}, now {y}" for t, x, y in c["chains"] if x != y]
    return "\n".join(lines)


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description="A builtin_kernelbench.py run under two judge configurations: "
                                             "OUT/report.N.json (kept when the judge changed) against OUT/report.json, "
                                             "or, with --against, another run of the same sample against this one.")
    ap.add_argument("out", help="the run directory")
    ap.add_argument("--earlier", type=int, default=1, metavar="N",
                    help="the earlier configuration's number (default 1)")
    ap.add_argument("--against", default=None, metavar="RUN",
                    help="another run of the same sample (its directory or report.json) as the earlier one")
    ap.add_argument("--json", default=None, help="also write the comparison here")
    args = ap.parse_args()
    out = Path(args.out)
    if args.against:
        other = Path(args.against)
        paths = [other / "report.json" if other.is_dir() else other, out / "report.json"]
    else:
        paths = [out / f"report.{args.earlier}.json", out / "report.json"]
    for path in paths:
        if not path.is_file():
            ap.error(f"{path} does not exist" + ("" if args.against else
                                                 " (a run resumed with another judge keeps report.N.json)"))
    before, now = (json.loads(path.read_text()) for path in paths)
    result = compare(before, now)
    print(compare_markdown(result, "two runs of the sample" if args.against else "the judge's two configurations"))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
