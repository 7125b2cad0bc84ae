"""The builtin (no-LLM) policy over KernelBench tasks against eager and every torch.compile mode, on
this machine's GPUs; resumable across calls and machines from the run directory alone.

Usage (from the repository root; see docs/builtin.md for the recorded runs and their commands)::

    python benchmarks/builtin_kernelbench.py kernelbench:level1 kernelbench:level2 kernelbench:level3 \\
        --subset stride:5+2 --exclude benchmarks/builtin_design_tasks.txt \\
        --rounds 2 --samples 2 --confirm --out benchmarks/runs/stride5

Selection: ``--subset stride:N[+K]`` keeps the tasks at positions K, K+N, ... of each selector (by
problem id), ``algebraic`` the tasks a graph pass rewrites, ``all`` everything (rules unite);
``--exclude FILE`` drops the task ids it lists (e.g. the tasks used to design the passes).  The
selection and the task sources are written to ``OUT/tasks.jsonl`` and reused on every later call
(``--reselect`` applies the rules again), so a resumed run needs no dataset.

Each call, in chunks of tasks (``--chunk``; every chunk finished before the next starts, so a run
cut short leaves whole tasks behind): the search (``cudal1.search.optimize`` with
``BuiltinPolicy``, ``--passes`` picks and orders its passes), the baselines of ``--modes`` (the
reference under each torch.compile mode and CUDA-graph replay, timed by the same judge), and with
``--confirm`` the re-timing of each task's winner and best compile mode with fresh inputs
(:mod:`builtin_confirm`); the baselines and the re-timing run as one batch whose jobs join as the
verdicts they depend on come in (``--finish joined``, :mod:`builtin_finish`; ``staged``: one
after the other), and the baselines that need nothing of the search run in its first batch
(``--baselines-along``, :func:`builtin_baseline_plan.ahead`).  The report
(:mod:`builtin_figures`, which defines every figure) is printed last and written to
``OUT/report.md`` / ``report.json``; ``OUT/report.html`` is ``cudal1 report OUT`` when the
``report`` extra is installed; ``OUT/run.json`` records each batch's GPU idle share.
``--prepare`` only selects and traces the graph rewrites (CPU, no judge) into
``OUT/rewrites``; ``--report-only`` judges nothing; ``--pack FILE`` writes the run directory's state
(selection, store snapshot, confirmations, rewrites, reports) to one tar.gz, for a machine that
returns few files.  The report also names, for every finished task a compile mode won, why the
builtin lost (:mod:`builtin_losses`), and what a task cost in GPU time (:mod:`builtin_cost`);
``--levers off`` turns the cost levers off (the config hash stays the same; every baseline mode is
timed for every task, where with them on :mod:`builtin_baseline_plan` skips the ones a task's own
verdicts make redundant) and
``--cost-probe N`` times N finished tasks' baselines with them on and off, outside the store.
``--rejudge TASK`` (repeatable) takes a task's verdicts, baselines and re-timings under the current
judge config out of the run into ``OUT/rejudged.jsonl``, so this call judges its recorded programs
again (:mod:`builtin_rejudge`: for verdicts a since-fixed judge problem decided; ``TASK:MODE`` and
``TASK:baselines`` time baselines again, ``all`` names every task).

Resuming: the run store is kept as ``OUT/cudal1.sqlite.gz`` and the rewrite cache as
``OUT/rewrites.tgz`` (restored when the plain files are missing or older; rewritten at the end of
every call, also when SIGINT or SIGTERM cut it short), so ``OUT`` moves between machines as it is
(or as ``--pack``'s tar.gz): run the same command again.  ``--drain-after S`` stops a call without
losing work in flight: after S seconds no new verdict starts, the running ones finish and are
recorded, and the call ends as a cut one does (:mod:`cudal1.harness.parent.drain`); with
``--drain-end E`` (a deadline from the call's start) a verdict starts only where it is expected to
end by E (by its task's verdicts of its kind so far), until E also after S, so the GPU is not left
idle while the last long ones finish and the hard stop after E cuts nothing.  Under
``benchmarks/runs/`` git keeps only a run's selection (``tasks.jsonl``); benchmarks/README.md
("Run state") says where earlier runs' state is kept and how to restore it.
"""

from __future__ import annotations

import argparse
import faulthandler
import gzip
import json
import os
import shutil
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmark's helper modules beside it

import builtin_baseline_plan
import builtin_cost
import builtin_losses
import builtin_rejudge
from builtin_confirm import confirm
from builtin_figures import builtin_figures, markdown, n_finished, task_rows
from builtin_finish import finish
from compile_lease_ab import LEASE_SETTINGS
from cudal1.compile_modes import COMPILE_MODES, CUDA_GRAPH
from cudal1.config import CONFIG_FILE, ConfigError, EvalConfig, config_changes, keep_previous_config, saved_config
from cudal1.harness.parent import drain
from cudal1.tasks import load_tasks
from cudal1.types import Task

STORE, SNAPSHOT, REWRITES_TGZ = "cudal1.sqlite", "cudal1.sqlite.gz", "rewrites.tgz"
STALL_S = 240  # every thread's stack is printed once no verdict has come for this long (and again)


def select(selectors: list[str], subset: list[str], exclude: set[str], source: str | None) -> tuple[list, dict]:
    """The tasks of ``selectors`` kept by the ``subset`` rules and not excluded, and for each task
    id the rules that kept it."""
    from cudal1.policy.builtin_passes import prepare_rewrites

    tasks, rules_of = [], {}
    for sel in selectors:
        got = sorted(load_tasks(sel, source), key=lambda t: (t.level or 0, int(t.problem_id or 0)))
        keep: dict[str, list[str]] = {}
        for rule in subset or ["all"]:
            if rule == "all":
                hit = {t.hash for t in got}
            elif rule.startswith("stride:"):
                n, _, k = rule.removeprefix("stride:").partition("+")
                hit = {t.hash for i, t in enumerate(got) if i % int(n) == int(k or 0)}
            elif rule == "algebraic":
                hit = {t.hash for t, o in zip(got, prepare_rewrites([t.source for t in got], variants=["algebraic"]))
                       if o.ok}
            else:
                raise SystemExit(f"unknown --subset rule {rule!r} (all | stride:N[+K] | algebraic)")
            for h in hit:
                keep.setdefault(h, []).append(rule)
        for t in got:
            if t.hash in keep and t.task_id not in exclude:
                tasks.append(t)
                rules_of[t.task_id] = keep[t.hash]
    return tasks, rules_of


def read_exclusions(paths: list[str]) -> set[str]:
    out: set[str] = set()
    for p in paths:
        out |= {line.split("#")[0].strip() for line in Path(p).read_text().splitlines()} - {""}
    return out


def load_selection(out: Path) -> tuple[list, dict]:
    tasks, rules_of = [], {}
    for line in (out / "tasks.jsonl").read_text().splitlines():
        row = json.loads(line)
        tasks.append(Task(name=row["name"], source=row["code"], level=row["level"], problem_id=row["problem_id"],
                          origin=row.get("origin", "")))
        rules_of[tasks[-1].task_id] = row["rules"]
    return tasks, rules_of


def save_selection(out: Path, tasks: list, rules_of: dict) -> None:
    (out / "tasks.jsonl").write_text("".join(json.dumps(
        {"name": t.name, "level": t.level, "problem_id": t.problem_id, "origin": t.origin, "rules": rules_of[t.task_id],
         "code": t.source}) + "\n" for t in tasks))


def restore_store(out: Path) -> None:
    """``OUT/cudal1.sqlite`` from its snapshot when the plain file is missing or older."""
    snap, store = out / SNAPSHOT, out / STORE
    if snap.exists() and (not store.exists() or snap.stat().st_mtime > store.stat().st_mtime):
        with gzip.open(snap, "rb") as src, open(store, "wb") as dst:
            shutil.copyfileobj(src, dst)


def judged_gpus(out: Path) -> set[str]:
    """The GPU names of the environments the run's store recorded (empty: no store, or no GPU verdict)."""
    from cudal1.store import RunStore

    if not (out / STORE).exists():
        return set()
    with RunStore(out / STORE) as store:
        return {env["gpu_name"] for env in store.environments() if env.get("gpu_name")}


def this_gpu() -> str | None:
    """This machine's first GPU's name (None: no GPU)."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def this_gpu_gib() -> float | None:
    """This machine's first GPU's memory in GiB (None: no GPU)."""
    import torch

    return torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else None


def snapshot_store(out: Path) -> None:
    """A consistent copy of the store (SQLite's backup API), gzipped next to it."""
    store = out / STORE
    if not store.exists():
        return
    tmp = out / (STORE + ".copy")
    src, dst = sqlite3.connect(store), sqlite3.connect(tmp)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    with open(tmp, "rb") as f, gzip.GzipFile(out / (SNAPSHOT + ".tmp"), "wb", mtime=0) as g:
        shutil.copyfileobj(f, g)
    os.replace(out / (SNAPSHOT + ".tmp"), out / SNAPSHOT)
    tmp.unlink()


def restore_rewrites(out: Path) -> None:
    """``OUT/rewrites/`` from ``OUT/rewrites.tgz`` (entries not there yet)."""
    import tarfile

    if (out / REWRITES_TGZ).exists():
        with tarfile.open(out / REWRITES_TGZ) as tar:
            tar.extractall(out, members=[m for m in tar.getmembers() if m.name.startswith("rewrites/") and m.isfile()
                                         and not (out / m.name).exists()], filter="data")


def snapshot_rewrites(out: Path) -> None:
    """``OUT/rewrites/`` as one ``OUT/rewrites.tgz`` (the entries repeat the kernel sources: it
    packs well, and one file is what a repository wants)."""
    import tarfile

    if not (out / "rewrites").is_dir():
        return
    with tarfile.open(out / (REWRITES_TGZ + ".tmp"), "w:gz") as tar:
        for f in sorted((out / "rewrites").glob("*.json")):
            tar.add(f, arcname=f"rewrites/{f.name}")
    os.replace(out / (REWRITES_TGZ + ".tmp"), out / REWRITES_TGZ)


# How run.json records --compile-lease (its calls before autotuning compiles were released say "released").
COMPILE_LEASE_RECORDED = {"held": "held", "released": "released, autotuning too",
                          "autotune-held": "released, autotuning held"}


class Batches:
    """Every judged batch's BatchStats, summarized for OUT/run.json and the report; each batch
    carries its call's stamp, the GPUs it ran on, the judge workers sharing each GPU (the re-timing's
    own count for a ``confirm`` batch), whether the cost levers were on and where compiling held the
    GPU's lease (``compile_lease``, when released), the lease a candidate's first call held
    (``first_call_lease``, with compiling released; batches without it: exclusive from fc2bad6
    on, shared before), the lease a torch.compile baseline's first call held (``baseline_lease``
    when it was choosers; without it: exclusive), the lease's order (``lease_order`` when it was
    choices-first; without it: any), and each call the tasks finished before and after it
    (:mod:`builtin_cost`)."""

    def __init__(self, out: Path, gpus: int = 1, levers: str = "on", workers: int = 2,
                 confirm_workers: int = 1, compile_lease: str = "held", first_call_lease: str = "",
                 baseline_lease: str = "exclusive", lease_order: str = "any") -> None:
        self.path = out / "run.json"
        self.run = json.loads(self.path.read_text()) if self.path.exists() else {"batches": []}
        self.call, self.gpus, self.levers = time.strftime("%Y-%m-%dT%H:%M:%S"), gpus, levers
        self.workers, self.confirm_workers = workers, confirm_workers
        self.compile_lease = compile_lease
        self.first_call_lease = first_call_lease if compile_lease != "held" else ""
        self.baseline_lease = baseline_lease if compile_lease != "held" else "exclusive"  # choosers needs it released
        self.lease_order = lease_order
        self.stage, self.since, self.verdicts = "search", None, 0  # what a cut call was doing, since when

    def begin(self, stage: str) -> None:
        """The stage (search | baselines | confirm | baselines+confirm, :data:`JOINED`) the next
        batches belong to."""
        self.stage = stage
        if self.since is None:
            self.since = time.monotonic()

    def verdict(self) -> None:
        self.verdicts += 1

    def add(self, what: str, stats, along: int = 0) -> None:
        """A judged batch; ``along``: how many of its jobs were baselines timed in a search's batch."""
        self._append({"what": what, "jobs": stats.jobs, "wall_s": stats.wall_s,
                      "gpu_idle_share": stats.gpu_idle_share, "lease_wait_s": stats.lease_wait_s,
                      "lanes_unused_share": stats.lanes_unused_share, **({"along": along} if along else {})})

    def cut(self, how: str = "cut", stats: Any = None) -> None:
        """The call was stopped inside a batch (``how``: cut, or drained: its running verdicts
        finished first): the time since the last whole batch, as a batch of the current stage
        marked ``cut`` (its verdicts are kept), so the call's device seconds hold all the work it
        did.  A drained batch's ``stats`` (:class:`drain.Drained`) give its device idle share, lease
        waits and unused lanes over the jobs it ran; a cut one's are not known."""
        if self.since is not None:
            known: dict[str, Any] = {"gpu_idle_share": None, "lease_wait_s": None}
            if stats is not None:
                known = {"gpu_idle_share": stats.gpu_idle_share, "lease_wait_s": stats.lease_wait_s,
                         "lanes_unused_share": stats.lanes_unused_share}
            self._append({"what": f"{self.stage} ({how})", "jobs": self.verdicts,
                          "wall_s": time.monotonic() - self.since, **known, "cut": True})

    def _append(self, batch: dict[str, Any]) -> None:
        workers = self.confirm_workers if batch["what"].startswith("confirm") else self.workers
        self.run["batches"].append({**batch, "at": time.strftime("%Y-%m-%d %H:%M:%S"), "call": self.call,
                                    "gpus": self.gpus, "workers_per_gpu": workers, "levers": self.levers,
                                    **({"compile_lease": self.compile_lease} if self.compile_lease != "held" else {}),
                                    **({"first_call_lease": self.first_call_lease} if self.first_call_lease else {}),
                                    **({"baseline_lease": self.baseline_lease} if self.baseline_lease != "exclusive"
                                       else {}),
                                    **({"lease_order": self.lease_order} if self.lease_order != "any" else {})})
        self.since, self.verdicts = time.monotonic(), 0
        self.save()

    def finished(self, when: str, n: int) -> None:
        self.run.setdefault("calls", {}).setdefault(self.call, {})[when] = n
        self.save()

    def finished_by_call(self) -> dict[str, int]:
        return {c: v["after"] - v.get("before", 0) for c, v in self.run.get("calls", {}).items() if "after" in v}

    def save(self) -> None:
        """OUT/run.json, written whole, then renamed (a call killed while writing keeps the last one)."""
        builtin_baseline_plan.write_whole(self.path, json.dumps(self.run, indent=1))


def search(args, out: Path, tasks: list, judge: EvalConfig, batches: Batches) -> None:
    from cudal1.harness import DevicePlan, Job
    from cudal1.policy.builtin import BuiltinPolicy
    from cudal1.recorded import RecordedJudge
    from cudal1.search import SearchConfig, optimize
    from cudal1.store import RunStore

    plan = DevicePlan.detect(args.device)
    passes = [p.strip() for p in args.passes.split(",") if p.strip()] if args.passes else None
    policy = BuiltinPolicy(device=plan.device, passes=passes, rewrite_cache=str(out / "rewrites"))
    t0, count = time.monotonic(), [0]

    def tick(r) -> None:
        count[0] += 1
        batches.verdict()
        faulthandler.dump_traceback_later(STALL_S, repeat=True)  # progress: the stall clock starts again
        print(f"[{time.monotonic() - t0:6.0f}s] {count[0]:4d} {r.task_name[:44]:44s} {r.status.value:14s} "
              f"{'-' if r.speedup is None else round(r.speedup, 3)} {','.join(r.flags)}", flush=True)

    class Judge(RecordedJudge):  # every batch's stats to run.json; baselines along with the first (below)
        along: list = []  # Jobs of baselines for the next batch

        def judge(self, pairs, **kw):
            jobs, self.along = self.along, []
            n = len(jobs)
            kw.setdefault("on_stats", lambda s: batches.add("search", s, along=n))
            if jobs:
                kw["along"] = (jobs, self.keep_along)
            return super().judge(pairs, **kw)

        def keep_along(self, res) -> None:
            self.keep_baseline(res)
            tick(res)

    modes = [m for m in args.modes.split(",") if m and m != "none"]
    size = args.chunk or max(8, 4 * len(plan.lanes) * judge.workers_per_gpu)
    print(f"{len(tasks)} tasks on {plan.device} lanes {plan.lanes}, {judge.workers_per_gpu} worker(s) per GPU, "
          f"chunks of {size}", flush=True)
    search_cfg = SearchConfig(rounds=args.rounds, samples=args.samples, budget_minutes=args.budget_minutes,
                              anchor=not args.no_anchor)
    joined = (JOINED if args.confirm else "baselines") if joins(args, modes) else ""  # the joined batch's name
    store = RunStore(out / STORE)
    try:
        rj = Judge(judge, store, plan=plan, on_event=lambda e: tick(e.result) if e.kind == "verdict" else None,
                   hardware="GPU")
        for start in range(0, len(tasks), size):
            chunk = tasks[start:start + size]
            batches.begin("search")
            if args.baselines_along == "on" and args.levers == "on":  # their compiles beside the search's GPU work
                _, ahead = rj.baselines_to_time([(t, m) for m in builtin_baseline_plan.ahead(modes) for t in chunk])
                rj.along = [Job(t, None, m) for t, m in ahead]
            optimize(chunk, policy, search_cfg, rj, out, record={"benchmark": "builtin_kernelbench"})
            rj.along = []  # a search that judged nothing left them to the baselines' batch
            if joined:  # the baselines, and with --confirm the re-timing, as one batch
                batches.begin(joined)
                finish(out, rj, chunk, modes, judge.hash(), retime=args.confirm, on_result=tick,
                       on_stats=lambda s: batches.add(joined, s))
                continue
            if modes:
                batches.begin("baselines")
                time_baselines(out, rj, chunk, modes, judge.hash(), args.levers == "on",
                               on_result=tick, on_stats=lambda s: batches.add("baselines", s))
            if args.confirm:
                batches.begin("confirm")
                rows = task_rows(out, chunk, judge.hash(), {}, modes)
                confirm(out, chunk, rows, judge.replace(workers_per_gpu=args.confirm_workers_per_gpu), plan,
                        on_stats=batches.add, tick=tick)
        batches.begin("search")
        optimize(tasks, policy, search_cfg, rj, out, record={"benchmark": "builtin_kernelbench"})
    finally:
        store.close()


JOINED = "baselines+confirm"  # run.json's name for a batch of --finish joined


def joins(args: Any, modes: list[str]) -> bool:
    """Whether a chunk's baselines (with ``--confirm``, and its re-timing) run as one batch
    (:mod:`builtin_finish`): ``--finish joined`` with baselines, the levers on (the plan's phases)
    and, with ``--confirm``, one worker count for both; said on stdout where it was asked for and
    cannot."""
    if args.finish != "joined" or not modes:
        return False
    why = ("the cost levers are off" if args.levers != "on" else
           "the re-timing has its own worker count"
           if args.confirm and args.confirm_workers_per_gpu != args.workers_per_gpu else "")
    if why:
        print(f"baselines and re-timing run one after the other: {why}", flush=True)
    return not why


def time_baselines(out: Path, rj: Any, chunk: list, modes: list[str], config_hash: str, levers: bool,
                   **callbacks: Any) -> None:
    """The chunk's baselines: every mode of every task with the levers off; with them on, the
    graphed compile modes after the others, and only what :mod:`builtin_baseline_plan` says a
    task needs (its skips go to ``OUT/baseline_skips.json``).  Once all have run, the chunk's tasks
    are added to ``OUT/baselines_done.json``: their rows are finished (``builtin_figures``)."""
    if not levers:
        rj.baselines(chunk, modes, **callbacks)
    else:
        by_id = {t.task_id: t for t in chunk}
        for phase in builtin_baseline_plan.phases(modes):
            todo, skipped = builtin_baseline_plan.plan(task_rows(out, chunk, config_hash, {}, modes), phase)
            builtin_baseline_plan.record_skips(out, skipped)
            if todo:
                rj.baselines_for([(by_id[t], m) for t, m in todo], **callbacks)
    builtin_baseline_plan.record_done(out, [t.task_id for t in chunk])


def prepare(out: Path, tasks: list) -> None:
    """Trace every graph pass of every task into OUT/rewrites (CPU child processes, no judge)."""
    from cudal1.policy.builtin_passes import GRAPH_VARIANTS, REWRITES, prepare_rewrites, set_rewrite_cache

    set_rewrite_cache(out / "rewrites")
    t0 = time.monotonic()
    prepare_rewrites([t.source for t in tasks])
    applies = {v: sum(1 for t in tasks if _applies(REWRITES.get(t.source, v), GRAPH_VARIANTS[v].requires))
               for v in GRAPH_VARIANTS}
    print(f"traced {len(tasks)} tasks in {time.monotonic() - t0:.0f} s; graph passes that apply: "
          + ", ".join(f"{v} {n}" for v, n in applies.items()), flush=True)


def _applies(outcome, requires: str | None) -> bool:
    return outcome.ok and (requires is None or requires in outcome.applied)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("selectors", nargs="+")
    ap.add_argument(
        "--source", default=None, help="KernelBench JSONL for kernelbench: selectors (default: cudal1's rule)"
    )
    ap.add_argument("--subset", action="append", default=[], help="all | stride:N[+K] | algebraic (repeatable: union)")
    ap.add_argument("--exclude", action="append", default=[], help="file of task ids to leave out (repeatable)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument(
        "--budget-minutes", type=float, default=None, help="search budget per chunk (checked between rounds)"
    )
    ap.add_argument("--passes", default=None, help="comma-separated builtin passes in proposal order (default: all)")
    ap.add_argument("--modes", default=",".join([*COMPILE_MODES, CUDA_GRAPH]),
                    help="baselines timed beside the search (comma-separated; none: no baselines)")
    ap.add_argument("--out", default="runs/builtin_kb")
    ap.add_argument("--device", default="cuda")
    ap.add_argument(
        "--preset", default="default", help="judge preset: default (exact-answer rule) | kernelbench-v0 | ..."
    )
    ap.add_argument("--timing-budget", type=float, default=None, metavar="S",
                    help="the judge's timing_budget_s (target seconds of a verdict's timing phase; default: the "
                         "preset's): part of the config hash, so a run resumed with another value judges afresh")
    ap.add_argument("--timing-trials", type=int, default=None, metavar="N",
                    help="the judge's timing_trials (most timed calls per model; default: the preset's): in the "
                         "config hash like --timing-budget")
    ap.add_argument("--workers-per-gpu", type=int, default=2,
                    help="judge workers sharing each GPU in the search and baselines (timing stays exclusive)")
    ap.add_argument("--confirm-workers-per-gpu", type=int, default=1,
                    help="workers per GPU for the re-timing (default 1: a quiet host)")
    ap.add_argument("--chunk", type=int, default=0, help="tasks per chunk (0: 4 x GPUs x workers per GPU, at least 8)")
    ap.add_argument(
        "--confirm", action="store_true", help="re-time each winner and best compile mode with fresh inputs"
    )
    ap.add_argument("--no-anchor", action="store_true",
                    help="the search judges no reference as itself (SearchConfig.anchor off): the builtin policy "
                         "ranks against 1.00x, which no figure here reads from the anchor; one job per task fewer")
    ap.add_argument("--prepare", action="store_true", help="select and trace the graph rewrites only (CPU)")
    ap.add_argument("--report-only", action="store_true", help="the report of OUT, judging nothing")
    ap.add_argument("--rejudge", action="append", default=[], metavar="TASK",
                    help="judge this task's recorded programs again with the current judge (repeatable; its "
                         "earlier verdicts go to OUT/rejudged.jsonl); TASK:MODE times only that baseline again, "
                         "TASK:baselines every baseline of it; TASK all: every task of the run")
    ap.add_argument("--rejudge-reason", default="", help="why, recorded with each --rejudge entry")
    ap.add_argument("--reselect", action="store_true", help="apply the selection rules again")
    ap.add_argument("--levers", choices=("on", "off"), default="on",
                    help="cost levers (builtin_cost.py, builtin_baseline_plan.py): a task's baselines share one "
                         "compile cache, a mode the search already judged is not timed again, the graphed compile "
                         "modes are not timed where CUDA-graph replay did not pay (off: a fresh cache per baseline "
                         "job, every mode timed); the config hash is the same either way")
    ap.add_argument("--compile-lease", choices=tuple(LEASE_SETTINGS), default="released",
                    help="where compiling (torch.compile's, Triton's) holds the GPU's lease: held, as the "
                         "phase it interrupts; released, Inductor's own GPU steps taking it back, autotuning "
                         "compiles included (EvalConfig.compile_off_lease, autotune_off_lease); autotune-held, "
                         "released except autotuning compiles (docs/harness.md; the config hash is the same "
                         "either way)")
    ap.add_argument("--first-call-lease", choices=("choosers", "exclusive"), default="choosers",
                    help="with compiling released, the lease a candidate's first call holds: choosers, the phase's "
                         "shared one, exclusive only while a choice is made by timing (cuDNN's benchmark mode, "
                         "TunableOp, autotuners, a compile's GPU steps); exclusive, the whole call "
                         "(EvalConfig.first_call_lease; the config hash is the same either way)")
    ap.add_argument("--baseline-lease", choices=("exclusive", "choosers"), default="exclusive",
                    help="with compiling released, the lease a torch.compile baseline's construction and first "
                         "call hold: exclusive, the whole phases; choosers, a candidate's rule (shared, exclusive "
                         "only while a choice is made by timing: --first-call-lease choosers; kept off until its "
                         "GPU test passes on an H200 again, docs/harness.md) "
                         "(EvalConfig.baseline_lease; the config hash is the same either way)")
    ap.add_argument("--lease-order", choices=("any", "choices-first"), default="any",
                    help="who gets the GPU's lease first among its waiters: any, flock's (a worker waiting for it "
                         "exclusive waits until no shared holder is left); choices-first, a waiter for it exclusive "
                         "to make a choice by timing (an autotuning compile's steps) stops new holders until it is "
                         "served (EvalConfig.lease_order; off by default: one honest candidate rejected in its first "
                         "GPU A/B, not again in 24 verdicts since, docs/harness.md; the config hash is the same "
                         "either way)")
    ap.add_argument("--finish", choices=("joined", "staged"), default="joined",
                    help="a chunk's baselines and re-timing: joined, one batch whose jobs join as the verdicts "
                         "they depend on come in (builtin_finish.py; needs the levers on and, with --confirm, "
                         "--confirm-workers-per-gpu equal to --workers-per-gpu, else staged); staged, the baseline "
                         "phases, then the re-timing, each its own batch; the verdicts are the same either way")
    ap.add_argument("--baselines-along", choices=("on", "off"), default="on",
                    help="with the levers on, time the baselines that need nothing of the search (the first "
                         "phase's modes but compile-default, whose search verdict stands in: "
                         "builtin_baseline_plan.ahead) in each chunk's first search batch, their compiles beside "
                         "the candidates' GPU work (run.json: the batch's `along`); off, after the search; the "
                         "verdicts are the same either way")
    ap.add_argument("--cost-probe", type=int, default=0, metavar="N",
                    help="time the baselines of N finished tasks with the levers on, then off (outside the store), "
                         "and print the device seconds per task of each")
    ap.add_argument("--drain-after", type=float, default=None, metavar="S",
                    help="after S seconds start no new verdict, let the running ones finish, then stop like a cut "
                         "call (nothing in flight is lost; a hard limit, e.g. timeout's, stays the backstop)")
    ap.add_argument("--drain-end", type=float, default=None, metavar="E",
                    help="with --drain-after: a deadline from the start: a verdict starts only if expected to end by "
                         "E (its task's longest verdict of its kind so far x1.5 + 5 s; without one, the upper "
                         "quartile of its kind over tasks, and after --drain-after never; one longer than E with "
                         "its margin, in E's first tenth if it fits without), also after S")
    ap.add_argument(
        "--pack", default=None, help="also write the run directory's state to this tar.gz (e.g. $OUT/state.tgz)"
    )
    ap.add_argument("--other-gpu", action="store_true",
                    help="resume a run on a GPU other than the one its verdicts were judged on (without it such a "
                         "call stops at once: every verdict of the run would be judged again on this GPU, beside "
                         "the earlier GPU's, and its figures would mix neither)")
    ap.add_argument("--min-gpu-gib", type=float, default=None, metavar="GIB",
                    help="stop at once, before judging anything, on a GPU with less memory than GIB: for a sample "
                         "whose largest tasks do not fit a smaller card even judged alone (they would end out of "
                         "memory, and the figures would lose them)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `timeout` stops it like Ctrl-C: store kept
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if (out / "tasks.jsonl").exists() and not args.reselect:
        tasks, rules_of = load_selection(out)
    else:
        tasks, rules_of = select(args.selectors, args.subset, read_exclusions(args.exclude), args.source)
        save_selection(out, tasks, rules_of)
    print(f"{len(tasks)} tasks selected ({out / 'tasks.jsonl'})", flush=True)
    restore_rewrites(out)
    if args.prepare:
        prepare(out, tasks)
        snapshot_rewrites(out)
        return 0
    restore_store(out)
    judging_here = not args.report_only and args.device == "cuda"  # --prepare returned above
    if judging_here and not args.other_gpu:
        here, before = this_gpu(), judged_gpus(out)
        if before and here not in before:
            print(f"error: {out} was judged on {', '.join(sorted(before))}, this machine has {here or 'no GPU'}: "
                  "resume it there, or pass --other-gpu to judge the run again here", file=sys.stderr)
            return 2
    if judging_here and args.min_gpu_gib is not None:
        gib = this_gpu_gib() or 0.0
        if gib < args.min_gpu_gib:
            print(f"error: this sample needs a GPU of at least {args.min_gpu_gib:g} GiB (--min-gpu-gib), this "
                  f"machine's {this_gpu() or 'no GPU'} has {gib:.1f} GiB: its largest tasks would end out of memory",
                  file=sys.stderr)
            return 2
    faulthandler.dump_traceback_later(STALL_S, repeat=True)  # a stalled run shows where it stands
    try:
        judge = EvalConfig.preset(args.preset).replace(
            device=args.device, workers_per_gpu=args.workers_per_gpu, keep_samples=False,
            baseline_cache=args.levers == "on", timing_budget_s=args.timing_budget,
            timing_trials=args.timing_trials, first_call_lease=args.first_call_lease,
            baseline_lease=args.baseline_lease, lease_order=args.lease_order,
            **LEASE_SETTINGS[args.compile_lease])
    except ConfigError as exc:
        ap.error(str(exc))
    keep_earlier_config(out, judge, args.report_only)
    if args.rejudge:
        if args.report_only:
            ap.error("--rejudge judges again: it cannot go with --report-only")
        try:
            for entry in builtin_rejudge.rejudge(out, tasks, args.rejudge, judge.hash(), args.rejudge_reason):
                print(builtin_rejudge.summary(entry), flush=True)
        except ValueError as exc:
            ap.error(str(exc))
        snapshot_store(out)  # the snapshot, too, no longer holds them (a packed run moves it alone)
    modes = [m for m in args.modes.split(",") if m and m != "none"]
    batches = Batches(out, gpus=_gpus(args), levers=args.levers, workers=args.workers_per_gpu,
                      compile_lease=COMPILE_LEASE_RECORDED[args.compile_lease], first_call_lease=args.first_call_lease,
                      baseline_lease=args.baseline_lease, lease_order=args.lease_order,
                      confirm_workers=args.confirm_workers_per_gpu)
    code = 0
    if args.drain_end is not None and (args.drain_after is None or args.drain_end <= args.drain_after):
        ap.error("--drain-end needs --drain-after, and a later time")
    if args.drain_after is not None and not args.report_only:
        drain.after(args.drain_after, end=args.drain_end)
    try:
        if not args.report_only:
            batches.finished("before", _finished(out, tasks, judge, rules_of, modes))
            search(args, out, tasks, judge, batches)
        if args.cost_probe:
            cost_probe(args, out, tasks, judge, rules_of, modes)
    except KeyboardInterrupt as exc:
        drained = isinstance(exc, drain.Drained)
        print(f"\n{'drained' if drained else 'cut short'}: every verdict so far is kept; run the same command "
              "again to resume", flush=True)
        batches.cut("drained" if drained else "cut", getattr(exc, "stats", None))
        code = 130
    finally:
        snapshot_store(out)
        snapshot_rewrites(out)
    if not args.report_only:
        batches.finished("after", _finished(out, tasks, judge, rules_of, modes))
    if args.pack:  # the state first: a call cut while it writes the report still sends its verdicts back
        pack(out, Path(args.pack))
    try:
        report(out, tasks, judge, rules_of, modes, batches)
    except KeyboardInterrupt:
        print("cut short while writing the report: the verdicts are kept (and packed); --report-only writes it",
              flush=True)
        return 130
    if args.pack:
        pack(out, Path(args.pack))
    return code


def _numbered(name: str, n: int | str) -> str:
    """``NAME.EXT`` as an earlier configuration's ``NAME.N.EXT``."""
    stem, ext = name.rsplit(".", 1)
    return f"{stem}.{n}.{ext}"


PER_CONFIG = ("confirm.json", builtin_baseline_plan.SKIPS, builtin_baseline_plan.DONE, "report.json",
              "report.md")  # kept as NAME.N.EXT
PACKED = ("tasks.jsonl", SNAPSHOT, REWRITES_TGZ, "confirm.json", "run.json", "config.yaml", "summary.json", "report.md",
          "report.json", "report.html", "cost_probe.json", builtin_baseline_plan.SKIPS, builtin_baseline_plan.DONE,
          builtin_rejudge.LOG,
          *(_numbered(name, n) for n in range(1, 10) for name in (CONFIG_FILE, *PER_CONFIG)))


def keep_earlier_config(out: Path, judge: EvalConfig, report_only: bool) -> None:
    """A run resumed with another judge identity (``--timing-budget``, a preset) judges afresh under
    the new config hash; its earlier verdicts stay in the store under the old one.  The earlier
    ``config.yaml`` is kept as ``config.N.yaml``, and with it the files that belong to that
    configuration (its re-timings ``confirm.json``, its baseline skips and its report) as
    ``NAME.N.EXT``: the new configuration re-times afresh, and both configurations' figures can
    still be read side by side."""
    saved = saved_config(out)
    changes = config_changes(saved.get("judge"), judge) if saved and not report_only else []
    if not changes:
        return
    kept = keep_previous_config(out)
    n = kept.name.split(".")[1]
    for name in PER_CONFIG:
        if (out / name).exists():
            (out / name).replace(out / _numbered(name, n))
    print(f"the judge's config changed ({'; '.join(changes)}): judging afresh under {judge.hash()}; the earlier "
          f"{CONFIG_FILE} is kept as {kept}", flush=True)


def _gpus(args) -> int:
    if args.report_only or args.device != "cuda":
        return 1
    from cudal1.harness import DevicePlan

    return len(DevicePlan.detect(args.device).lanes)


def _finished(out: Path, tasks: list, judge: EvalConfig, rules_of: dict, modes: list[str]) -> int:
    rows = task_rows(out, tasks, judge.hash(), rules_of, modes)
    return n_finished(rows)


def cost_probe(args, out: Path, tasks: list, judge: EvalConfig, rules_of: dict, modes: list[str]) -> None:
    from cudal1.harness import DevicePlan

    rows = task_rows(out, tasks, judge.hash(), rules_of, modes)
    probed = builtin_cost.probe(out, tasks, rows, modes, judge, DevicePlan.detect(args.device),
                                args.confirm_workers_per_gpu, args.cost_probe)
    print(builtin_cost.probe_markdown(probed), flush=True)


def pack(out: Path, archive: Path) -> None:
    """The run directory's state as one tar.gz (what a machine that returns few files sends back):
    unpack it into the run directory to resume or report there.  ``main`` packs before the report
    and again after it, so a call cut while it writes the report (a verdict that ended later than
    its task's ones said) still sends back every verdict; the archive is replaced whole."""
    import tarfile

    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")  # a pack cut halfway leaves the earlier one whole
    with tarfile.open(partial, "w:gz") as tar:
        for name in PACKED:
            if (out / name).exists():
                tar.add(out / name, arcname=name)
    partial.replace(archive)
    print(f"packed {out} into {archive} ({archive.stat().st_size // 1024} KiB)", flush=True)


def report(out: Path, tasks: list, judge: EvalConfig, rules_of: dict, modes: list[str], batches: Batches) -> None:
    summary = builtin_figures(out, tasks, judge.hash(), rules_of, modes)
    summary["losses"] = builtin_losses.loss_rows(out, tasks, judge.hash(), summary["rows"],
                                                 builtin_losses.graph_declines(out))
    summary["rejudged"] = builtin_rejudge.recorded(out)
    summary["cost"] = builtin_cost.summarize(builtin_cost.task_costs(out, tasks, judge.hash()),
                                             builtin_cost.call_costs(batches.run, batches.finished_by_call()),
                                             builtin_cost.running_seconds(out, judge.hash()),
                                             builtin_cost.standing(batches.run, builtin_rejudge.replaced(out),
                                                                   [t.task_id for t in tasks],
                                                                   n_finished(summary["rows"])),
                                             builtin_cost.alone_seconds(out, judge.hash(),
                                                                        {t.hash: t.task_id for t in tasks}))
    (out / "report.json").write_text(json.dumps(summary, indent=1, default=str))
    extra = builtin_losses.markdown(summary["losses"], summary["finished"]) + "\n\n" + \
        builtin_cost.markdown(summary["cost"])
    text = markdown(summary, modes, batches.run, extra)
    (out / "report.md").write_text(text + "\n")
    try:
        from cudal1.report import ReportError, render_report

        (out / "report.html").write_text(render_report([str(out)], "html"))
        print(f"HTML report: {out / 'report.html'}")
    except (ImportError, ReportError) as exc:
        print(f"no HTML report: {exc}")
    print(text)


if __name__ == "__main__":
    sys.exit(main())
