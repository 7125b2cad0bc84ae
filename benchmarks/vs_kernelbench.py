#!/usr/bin/env python
"""How long ``cudal1 verify`` takes against KernelBench's own evaluation harness on the same
CUDA-L1 records, both on fresh caches, on one GPU (see benchmarks/README.md).

cudal1 side
    ``cudal1 verify RECORDS --device cuda --gpus 0 --json`` as one subprocess, with an empty run
    directory and empty caches (``CUDAL1_CACHE_DIR``, ``TORCH_EXTENSIONS_DIR``, Inductor, Triton)
    under a temporary directory; wall seconds are measured around the whole process.  Its
    ``verify_report.json`` gives the audit class and status of every record, and its run store each
    judged record's ``wall_s`` / ``build_s`` (informational: the judge pipelines records, so these
    overlap and do not add up to the wall).
KernelBench side
    ``kernelbench.eval.eval_kernel_against_ref(ref_code, custom_code, num_correct_trials=5,
    num_perf_trials=100, measure_performance=True, timing_method="cuda_event", backend="cuda",
    precision=float32)`` for each record with code, serially, each in its own fresh ``python``
    process (this script's internal ``--kb-one`` mode, with ``--kernelbench-src`` on
    ``PYTHONPATH``), with a fresh ``build_dir``, ``TORCH_EXTENSIONS_DIR`` and Inductor/Triton
    caches, killed after ``--kb-timeout`` seconds.  Per record: wall seconds of the process,
    seconds inside the call, compiled, correctness, runtime and reference runtime (KernelBench's
    means; its timing stats are in ms), and the tail of any error.  KernelBench is not a
    dependency: point ``--kernelbench-src`` at a checkout's ``src`` directory (it must hold
    ``kernelbench/eval.py``), whose requirements are installed in the interpreter (``--kb-python``).

Both sides see one GPU (``CUDA_VISIBLE_DEVICES`` set to ``--gpu``); ``--order`` says which runs
first, ``--only`` runs one side.  Before either side, one untimed probe process imports torch (and
``kernelbench.eval``) to check the set-up and read the GPU name.  Everything (arguments,
environment, commands, per-side totals, per-record rows, log tails) goes to ``--out`` as JSON; a
per-record table and then the short table of totals are printed last.  ``--dry-run`` prints the
plan (records, the commands that would run) and needs no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

# The --kb-one mode runs in KernelBench's environment: module level is standard library only
# (cudal1.tables is imported where the tables are printed).

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
PROG = "vs_kernelbench"
ERROR_TAIL = 600  # characters of error text kept per record
LOG_TAIL = 3000  # characters of a process log kept in the JSON
SIDE_NAMES = {"cudal1": "cudal1 verify", "kb": "KernelBench"}


class BenchError(Exception):
    """A one-line, user-facing error (printed as ``vs_kernelbench: ...``, exit 2)."""


# ---- records --------------------------------------------------------------------------------------

def record_key(rec: dict[str, Any], index: int) -> str:
    level, tid = rec.get("level_id"), rec.get("task_id")
    if isinstance(level, int) and isinstance(tid, int):
        return f"level{level}/{tid}"
    return str(rec.get("task_name") or tid or f"record{index}")


def read_records(path: Path, limit: int | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """(records, their JSONL lines) of a CUDA-L1 release file, the first ``limit`` only.
    Each record: index, key, level, ref_code, custom_code (None when the record has no code)."""
    from cudal1.jsonl import JsonlError, iter_jsonl
    from cudal1.releases import missing_code

    if not path.is_file():
        raise BenchError(f"no records file {path} (give --records PATH or set $CUDAL1_CUDA_L1)")
    records: list[dict[str, Any]] = []
    lines: list[str] = []
    try:
        for n, rec in iter_jsonl(path):
            if limit is not None and len(records) >= limit:
                break
            if not isinstance(rec.get("ref_code"), str):
                raise BenchError(f"{path}:{n}: not a CUDA-L1 record (needs ref_code and custom_code)")
            code = rec.get("custom_code")
            records.append({"index": len(records), "key": record_key(rec, len(records)), "level": rec.get("level_id"),
                            "ref_code": rec["ref_code"], "custom_code": None if missing_code(code) else code})
            lines.append(json.dumps(rec))
    except JsonlError as exc:
        raise BenchError(str(exc)) from None
    if not records:
        raise BenchError(f"{path}: no records")
    return records, lines


def check_kernelbench_src(path: str | None) -> Path:
    """The KernelBench ``src`` directory (holding ``kernelbench/eval.py``)."""
    if not path:
        raise BenchError("--kernelbench-src PATH is required (a KernelBench checkout's src directory; "
                         "or --only cudal1)")
    src = Path(path).expanduser().resolve()
    if not src.is_dir():
        raise BenchError(f"--kernelbench-src {path}: no such directory")
    if not (src / "kernelbench" / "eval.py").is_file():
        hint = " (did you mean its src/ directory?)" if (src / "src" / "kernelbench" / "eval.py").is_file() else ""
        raise BenchError(f"--kernelbench-src {path}: no kernelbench/eval.py there{hint}")
    return src


# ---- the KernelBench driver (--kb-one) -----------------------------------------------------------

def kb_result_dict(res: Any) -> dict[str, Any] | None:
    """A ``KernelExecResult`` (pydantic v2 or v1, or a plain dict) as JSON-safe data; None stays
    None (KernelBench returns None when it asks for a retry, e.g. a build lock error)."""
    if res is None:
        return None
    if hasattr(res, "model_dump"):
        data = res.model_dump()
    elif hasattr(res, "dict"):
        data = res.dict()
    elif isinstance(res, dict):
        data = dict(res)
    else:
        data = {k: getattr(res, k) for k in ("compiled", "correctness", "metadata", "runtime", "runtime_stats",
                                            "ref_runtime", "ref_runtime_stats") if hasattr(res, k)}
    return json.loads(json.dumps(data, default=str))


def kb_one(job_path: str) -> int:
    """One KernelBench evaluation in this (fresh) process; the outcome goes to ``job["result"]``."""
    job = json.loads(Path(job_path).read_text())
    out: dict[str, Any] = {"ok": False, "result": None, "import_s": None, "eval_s": None}
    t0 = time.monotonic()
    try:
        import torch
        from kernelbench.eval import eval_kernel_against_ref

        out["import_s"] = time.monotonic() - t0
        t1 = time.monotonic()
        try:
            res = eval_kernel_against_ref(
                job["ref_code"], job["custom_code"], seed_num=job["seed"], num_correct_trials=job["correct_trials"],
                num_perf_trials=job["perf_trials"], measure_performance=True, timing_method="cuda_event",
                verbose=False, build_dir=job["build_dir"], device=torch.device("cuda", 0), backend="cuda",
                precision=torch.float32)
        finally:
            out["eval_s"] = time.monotonic() - t1
        out["result"] = kb_result_dict(res)
        out["ok"] = True
    except BaseException as exc:  # noqa: BLE001 - every failure is a result to record
        out["error_name"] = type(exc).__name__
        out["error"] = traceback.format_exc()[-4000:]
    dest = Path(job["result"])
    tmp = dest.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, default=str))
    tmp.replace(dest)
    return 0


def error_tail(text: Any, limit: int = ERROR_TAIL) -> str:
    """The last non-empty lines of ``text``, at most ``limit`` characters, joined on one line."""
    lines = [ln.strip() for ln in str(text or "").strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    out = ""
    for ln in reversed(lines):
        cand = ln if not out else f"{ln} | {out}"
        if len(cand) > limit:
            break
        out = cand
    return out or lines[-1][-limit:]


def last_line(text: Any, limit: int = 300) -> str:
    """The last non-empty line of ``text`` (an exception's message, a traceback's verdict)."""
    lines = [ln.strip() for ln in str(text or "").splitlines() if ln.strip()]
    return lines[-1][:limit] if lines else ""


def _positive(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 else None


KB_ERROR_KEYS = ("compilation_error", "runtime_error", "correctness_issue", "error_during_performance")


def kb_row(rec: dict[str, Any], *, rc: int | None, timed_out: bool, wall_s: float | None,
           driver: dict[str, Any] | None, log_tail: str = "", timeout_s: float | None = None) -> dict[str, Any]:
    """One record's KernelBench row from its process outcome and the driver's result file.

    ``outcome``: correct, incorrect, runtime_error, compile_error (KernelBench's ``compiled`` false),
    no_result (KernelBench returned None), error (an exception in the driver, e.g. an import
    error), crashed (no result file: the process died), timeout, missing_code (not run).
    ``error`` is one short line; ``error_tail`` the end of the error text and ``log_tail`` the end
    of the process's output (both only when the record is not correct)."""
    row: dict[str, Any] = {"index": rec["index"], "key": rec["key"], "outcome": "", "wall_s": wall_s, "rc": rc,
                           "timed_out": timed_out, "import_s": None, "eval_s": None, "compiled": None,
                           "correctness": None, "runtime": None, "ref_runtime": None, "speedup": None,
                           "excessive_speedup": False, "correctness_trials": None, "error": "", "error_tail": "",
                           "log_tail": ""}
    if rec.get("custom_code") is None:
        return row | {"outcome": "missing_code", "wall_s": None}
    logged = {"log_tail": error_tail(log_tail)}
    if timed_out:
        return row | logged | {"outcome": "timeout", "error": "; ".join(
            filter(None, [f"killed after {timeout_s:g} s" if timeout_s else "killed (timeout)", last_line(log_tail)]))}
    if driver is None:
        return row | logged | {"outcome": "crashed", "error": "; ".join(
            filter(None, [f"exit {rc} without a result", last_line(log_tail)]))}
    row |= {"import_s": driver.get("import_s"), "eval_s": driver.get("eval_s")}
    if not driver.get("ok"):
        text = driver.get("error") or log_tail
        return row | logged | {"outcome": "error", "error": last_line(text), "error_tail": error_tail(text)}
    res = driver.get("result")
    if res is None:
        return row | logged | {"outcome": "no_result",
                               "error": "eval_kernel_against_ref returned None (KernelBench asks for a retry)"}
    meta = res.get("metadata") or {}
    compiled, correct = bool(res.get("compiled")), bool(res.get("correctness"))
    runtime, ref_runtime = _positive(res.get("runtime")), _positive(res.get("ref_runtime"))
    if correct:
        outcome = "correct"
    elif not compiled:
        outcome = "compile_error"
    elif meta.get("runtime_error") or meta.get("runtime_error_name"):
        outcome = "runtime_error"
    else:
        outcome = "incorrect"
    keys = [k for k in KB_ERROR_KEYS if meta.get(k)]
    error = "; ".join((f"{meta[k + '_name']}: " if meta.get(k + "_name") else "") + last_line(meta[k]) for k in keys)
    row |= {"outcome": outcome, "compiled": compiled, "correctness": correct, "runtime": runtime,
            "ref_runtime": ref_runtime, "speedup": ref_runtime / runtime if runtime and ref_runtime else None,
            "excessive_speedup": bool(meta.get("excessive_speedup")),
            "correctness_trials": meta.get("correctness_trials"), "error": error[:300],
            "error_tail": error_tail("\n".join(str(meta[k]) for k in keys))}
    return row if correct else row | logged


def kb_totals(rows: list[dict[str, Any]], wall_s: float | None, records: int | None = None) -> dict[str, Any]:
    """Totals over KernelBench rows; ``wall_s`` is the wall of the whole serial loop, ``records``
    the number of records (default: the rows; more when the loop was interrupted)."""
    run = [r for r in rows if r["outcome"] != "missing_code"]
    return {"records": len(rows) if records is None else records, "run": len(run), "wall_s": wall_s,
            "record_wall_sum_s": sum(r["wall_s"] or 0.0 for r in run),
            "eval_sum_s": sum(r["eval_s"] or 0.0 for r in run),
            "import_sum_s": sum(r["import_s"] or 0.0 for r in run),
            "per_record_s": wall_s / len(run) if wall_s is not None and run else None,
            "compiled": sum(bool(r["compiled"]) for r in run), "correct": sum(bool(r["correctness"]) for r in run),
            "timeouts": sum(r["outcome"] == "timeout" for r in run),
            "outcomes": dict(Counter(r["outcome"] for r in rows))}


# ---- the cudal1 side ------------------------------------------------------------------------------

def last_json_line(text: str) -> dict[str, Any] | None:
    """The last line of ``text`` that parses as a JSON object (``cudal1 verify --json``'s summary)."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


def store_walls(db: Path) -> dict[str, list[dict[str, Any]]]:
    """task_id -> [{wall_s, build_s, status}] from a verify run store (empty when unreadable)."""
    import contextlib
    import sqlite3

    out: dict[str, list[dict[str, Any]]] = {}
    if not db.is_file():
        return out
    try:
        with contextlib.closing(sqlite3.connect(db)) as con:
            rows = con.execute("SELECT t.task_id, e.status, e.result_json FROM evaluations e "
                               "JOIN tasks t ON t.hash = e.task_hash ORDER BY e.id").fetchall()
    except sqlite3.Error:
        return out
    for task_id, status, blob in rows:
        try:
            res = json.loads(blob)
        except (TypeError, json.JSONDecodeError):
            res = {}
        out.setdefault(task_id, []).append(
            {"status": status, "wall_s": res.get("wall_s"), "build_s": res.get("build_s")}
        )
    return out


def cudal1_rows(records: list[dict[str, Any]], report: dict[str, Any] | None,
                walls: dict[str, list[dict[str, Any]]] | None = None) -> list[dict[str, Any]]:
    """One row per record from ``verify_report.json`` (its rows are in record order)."""
    got = (report or {}).get("records") or []
    walls = {k: list(v) for k, v in (walls or {}).items()}
    rows = []
    for rec in records:
        r = got[rec["index"]] if rec["index"] < len(got) else {}
        w = walls.get(rec["key"], [])
        timing = w.pop(0) if w and r.get("status") else {}
        rows.append(
            {
                "index": rec["index"], "key": rec["key"], "class": r.get("class"), "status": r.get("status"),
                "measured": r.get("measured"), "claimed": r.get("claimed"), "flags": r.get("flags") or [],
                "message": r.get("message") or "", "wall_s": timing.get("wall_s"),
                "build_s": timing.get("build_s"),
            }
        )
    return rows


def cudal1_totals(rows: list[dict[str, Any]], wall_s: float | None, rc: int | None, timed_out: bool = False,
                  summary: dict[str, Any] | None = None) -> dict[str, Any]:
    with_code = [r for r in rows if r["class"] != "missing_code"]
    classes = Counter(r["class"] for r in rows if r["class"])
    return {
        "records": len(rows), "judged": sum(r["status"] is not None for r in rows), "wall_s": wall_s,
        "rc": rc, "timed_out": timed_out,
        "per_record_s": wall_s / len(with_code) if wall_s is not None and with_code else None,
        "classes": dict(classes),
        "statuses": dict(Counter(r["status"] for r in rows if r["status"])),
        "batch": (summary or {}).get("batch"),
    }


# ---- commands and processes ----------------------------------------------------------------------

def gpu_device(index: int, visible: str | None) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value for the ``index``-th GPU visible now."""
    if visible is not None and visible.strip():
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        if index >= len(ids):
            raise BenchError(f"--gpu {index}: only {len(ids)} GPU(s) in CUDA_VISIBLE_DEVICES={visible}")
        return ids[index]
    return str(index)


def cache_env(root: Path, gpu: str, cudal1: bool = True) -> dict[str, str]:
    """Environment additions: one GPU and empty caches under ``root`` (cudal1's build cache too
    with ``cudal1``)."""
    env = {"CUDA_VISIBLE_DEVICES": gpu, "TORCH_EXTENSIONS_DIR": str(root / "torch_extensions"),
           "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"), "TRITON_CACHE_DIR": str(root / "triton"),
           "PYTHONUNBUFFERED": "1"}
    return env | ({"CUDAL1_CACHE_DIR": str(root / "cudal1-cache")} if cudal1 else {})


def verify_command(records: Path, out: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "cudal1.cli.main", "verify", str(records), "--device", "cuda", "--gpus", "0",
            "--out", str(out), "--json", *extra]


def kb_command(python: str, job: Path) -> list[str]:
    return [python, str(Path(__file__).resolve()), "--kb-one", str(job)]


def kb_pythonpath(src: Path) -> str:
    return os.pathsep.join(p for p in (str(src), os.environ.get("PYTHONPATH")) if p)


def show(cmd: list[str], env: dict[str, str]) -> str:
    return " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + shlex.join(cmd)


def _tail(path: Path, limit: int = LOG_TAIL) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


class Runner:
    """Runs one child at a time in its own process group, so a timeout or SIGTERM ends its
    builds (nvcc, ninja) and workers too."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def run(self, cmd: list[str], log: Path, env: dict[str, str], cwd: Path, timeout: float | None) -> tuple[int, bool]:
        with open(log, "wb") as f:
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=os.environ | env, cwd=cwd, start_new_session=True)
            try:
                rc, timed_out = self.proc.wait(timeout=timeout), False
            except subprocess.TimeoutExpired:
                self.kill()
                rc, timed_out = self.proc.wait(), True
            except BaseException:  # SIGTERM (raised as KeyboardInterrupt) or Ctrl-C: the child goes too
                self.kill(grace_s=5.0)
                raise
            finally:
                pid, self.proc = self.proc.pid, None
        reap_group(pid)  # after the clock: what the child left running in its group (teardown) ends first
        return rc, timed_out

    def kill(self, grace_s: float = 0.0) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            if grace_s:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=grace_s)
                    return
                except subprocess.TimeoutExpired:
                    pass
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def reap_group(pgid: int, wait_s: float = 10.0) -> None:
    """Wait up to ``wait_s`` for the process group ``pgid`` (a child started here with
    ``start_new_session``) to empty, then kill what is left of it."""
    deadline = time.monotonic() + wait_s
    try:
        while time.monotonic() < deadline:
            os.killpg(pgid, 0)
            time.sleep(0.1)
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


PROBE = """
import json, sys
out = {"python": sys.version.split()[0]}
import torch
out["torch"] = torch.__version__
out["cuda"] = torch.version.cuda
out["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
if %(kb)s:
    import kernelbench.eval  # noqa: F401
print(json.dumps(out))
"""


def probe(python: str, env: dict[str, str], kernelbench: bool) -> dict[str, Any]:
    """Untimed set-up check in a throw-away process: torch (and kernelbench.eval) import, GPU name."""
    try:
        done = subprocess.run([python, "-c", PROBE % {"kb": kernelbench}], capture_output=True, text=True,
                              env=os.environ | env, timeout=300, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BenchError(f"set-up probe with {python} failed: {exc}") from None
    found = last_json_line(done.stdout)
    if done.returncode != 0 or found is None:
        what = "torch and kernelbench.eval" if kernelbench else "torch"
        raise BenchError(
            f"cannot import {what} with {python}: {error_tail(done.stderr, 300) or f'exit {done.returncode}'}"
        )
    return found


def _git(*args: str, cwd: Path = REPO) -> str | None:
    try:
        done = subprocess.run(["git", *args], capture_output=True, text=True, cwd=cwd, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def kb_commit(kb_src: Path) -> str | None:
    """The KernelBench checkout's commit; None when ``kb_src`` is not in a git checkout of its own
    (a copy inside this repository would otherwise report this repository's commit)."""
    top = _git("rev-parse", "--show-toplevel", cwd=kb_src)
    if top is None or Path(top).resolve() == Path(_git("rev-parse", "--show-toplevel") or REPO).resolve():
        return None
    return _git("rev-parse", "--short", "HEAD", cwd=kb_src)


# ---- the benchmark ------------------------------------------------------------------------------

class Bench:
    def __init__(self, args: argparse.Namespace, records: list[dict[str, Any]], lines: list[str],
                 kb_src: Path | None) -> None:
        self.args, self.records, self.lines, self.kb_src = args, records, lines, kb_src
        self.started = datetime.now(timezone.utc)
        self.out_path = out_path(args.out, self.started)
        self.sides = side_order(args.order, args.only)
        self.gpu = gpu_device(args.gpu, os.environ.get("CUDA_VISIBLE_DEVICES"))
        self.root: Path | None = None
        self.runner = Runner()
        self.environment: dict[str, Any] = {}
        self.cudal1: dict[str, Any] | None = None
        self.kb: dict[str, Any] | None = None
        self.kb_rows: list[dict[str, Any]] = []
        self.kb_t0: float | None = None
        self.cudal1_t0: float | None = None

    @property
    def with_code(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["custom_code"] is not None]

    def records_file(self) -> Path:
        """The records both sides read: the file itself, or its first --limit records."""
        if self.args.limit is None:
            return Path(self.args.records).resolve()
        assert self.root is not None
        path = self.root / "records.jsonl"
        if not path.exists():
            path.write_text("".join(line + "\n" for line in self.lines))
        return path

    # -- the plan (also the dry run) --
    def plan_text(self, root: str) -> str:
        a, base = self.args, Path(root)
        recs = (f"{a.records} ({len(self.records)} records, {len(self.with_code)} with code"
                + (f"; the first {a.limit} as {base / 'records.jsonl'}" if a.limit is not None else "") + ")")
        from cudal1.tables import table

        lines = [f"records: {recs}",
                 table(["#", "task", "level", "code"], [[str(r["index"]), r["key"], str(r["level"]),
                                                         "yes" if r["custom_code"] is not None else "none (not run)"]
                                                        for r in self.records]),
                 f"order: {' then '.join(SIDE_NAMES[s] for s in self.sides)}; one GPU: CUDA_VISIBLE_DEVICES={self.gpu}"]
        for side in self.sides:
            if side == "cudal1":
                rec_file = base / "records.jsonl" if a.limit is not None else Path(a.records).resolve()
                cmd = verify_command(rec_file, base / "cudal1" / "verify", shlex.split(a.verify_args))
                lines += ["cudal1 verify: one process, wall measured around it:",
                          "  " + show(cmd, cache_env(base / "cudal1", self.gpu))]
            else:
                job = base / "kb" / "NNNN"
                env = cache_env(job, self.gpu, cudal1=False) | {
                    "PYTHONPATH": kb_pythonpath(self.kb_src) if self.kb_src else ""
                }
                lines += [f"KernelBench: one process per record with code ({len(self.with_code)}), serial, "
                          f"killed after {a.kb_timeout:g} s, fresh caches each:",
                          "  " + show(kb_command(a.kb_python, job / "job.json"), env),
                          f"  -> kernelbench.eval.eval_kernel_against_ref(ref_code, custom_code, seed_num={a.kb_seed}, "
                          f"num_correct_trials={a.kb_correct_trials}, num_perf_trials={a.kb_perf_trials}, "
                          f"measure_performance=True, timing_method='cuda_event', build_dir='{job / 'build'}', "
                          "device=cuda:0, backend='cuda', precision=torch.float32)"]
        lines.append(f"results: {self.out_path}")
        return "\n".join(lines)

    # -- the sides --
    def run_cudal1(self) -> None:
        assert self.root is not None
        side = self.root / "cudal1"
        side.mkdir(parents=True, exist_ok=True)
        vdir = side / "verify"
        cmd = verify_command(self.records_file(), vdir, shlex.split(self.args.verify_args))
        env = cache_env(side, self.gpu)
        log = side / "verify.log"
        self.cudal1 = {"command": show(cmd, env), "running": True}
        print(f"[cudal1] {len(self.with_code)} record(s) with code: {shlex.join(cmd[1:])} (log {log})", file=sys.stderr,
              flush=True)
        self.cudal1_t0 = time.monotonic()
        rc, timed_out = self.runner.run(cmd, log, env, REPO, self.args.verify_timeout)
        wall = time.monotonic() - self.cudal1_t0
        self.cudal1_done(vdir, log, rc, timed_out, wall)
        t = self.cudal1["totals"]
        print(f"[cudal1] rc={rc} wall {wall:.1f}s  " + " ".join(f"{k}={v}" for k, v in sorted(t["classes"].items())),
              file=sys.stderr, flush=True)

    def cudal1_done(self, vdir: Path, log: Path, rc: int | None, timed_out: bool, wall: float | None) -> None:
        report = None
        try:
            report = json.loads((vdir / "verify_report.json").read_text())
        except (OSError, json.JSONDecodeError):
            pass
        text = _tail(log, 200_000)
        rows = cudal1_rows(self.records, report, store_walls(vdir / "cudal1.sqlite"))
        self.cudal1 = (self.cudal1 or {}) | {
            "running": False, "totals": cudal1_totals(rows, wall, rc, timed_out, last_json_line(text)),
            "summary": (report or {}).get("summary"), "environment": (report or {}).get("environment"),
            "config": (report or {}).get("config"), "rows": rows, "log_tail": text[-LOG_TAIL:]}
        if rc != 0:
            print(f"[cudal1] exited {rc}{' (timed out)' if timed_out else ''}: {last_line(text, 400)}", file=sys.stderr)
        self.write()

    def run_kb(self) -> None:
        assert self.root is not None and self.kb_src is not None
        a, todo = self.args, self.with_code
        self.kb_rows, self.kb_t0 = [], time.monotonic()
        self.kb = {"settings": {"src": str(self.kb_src), "python": a.kb_python, "seed": a.kb_seed,
                                "num_correct_trials": a.kb_correct_trials, "num_perf_trials": a.kb_perf_trials,
                                "measure_performance": True, "timing_method": "cuda_event", "backend": "cuda",
                                "precision": "float32", "timeout_s": a.kb_timeout}, "running": True}
        for rec in self.records:
            if rec["custom_code"] is None:
                self.kb_rows.append(kb_row(rec, rc=None, timed_out=False, wall_s=None, driver=None))
                continue
            d = self.root / "kb" / f"{rec['index']:04d}"
            d.mkdir(parents=True, exist_ok=True)
            job = d / "job.json"
            result = d / "result.json"
            job.write_text(
                json.dumps(
                    {
                        "ref_code": rec["ref_code"], "custom_code": rec["custom_code"], "seed": a.kb_seed,
                        "correct_trials": a.kb_correct_trials, "perf_trials": a.kb_perf_trials,
                        "build_dir": str(d / "build"), "result": str(result),
                    }
                )
            )
            env = cache_env(d, self.gpu, cudal1=False) | {"PYTHONPATH": kb_pythonpath(self.kb_src)}
            t0 = time.monotonic()
            rc, timed_out = self.runner.run(kb_command(a.kb_python, job), d / "log.txt", env, d, a.kb_timeout)
            wall = time.monotonic() - t0
            driver = None
            if result.is_file():
                try:
                    driver = json.loads(result.read_text())
                except json.JSONDecodeError:
                    driver = None
            row = kb_row(rec, rc=rc, timed_out=timed_out, wall_s=wall, driver=driver, log_tail=_tail(d / "log.txt"),
                         timeout_s=a.kb_timeout)
            self.kb_rows.append(row)
            done = sum(r["outcome"] != "missing_code" for r in self.kb_rows)
            print(
                f"[kb {done:>3}/{len(todo)} {time.monotonic() - self.kb_t0:7.1f}s] {rec['key']:<14} "
                f"{row['outcome']:<13} "
                f"wall {wall:6.1f}s  speedup {_f(row['speedup'], 2, 'x')}"
                + (f"  {row['error'][:120]}" if row["error"] and row["outcome"] != "correct" else ""),
                file=sys.stderr,
                flush=True,
            )
            self.write()
        self.kb_done(time.monotonic() - self.kb_t0)
        t = self.kb["totals"]
        print(f"[kb] wall {t['wall_s']:.1f}s  compiled {t['compiled']}/{t['run']}  correct {t['correct']}/{t['run']}",
              file=sys.stderr, flush=True)

    def kb_done(self, wall: float | None, complete: bool = True) -> None:
        assert self.kb is not None
        self.kb |= {
            "running": False, "complete": complete,
            "totals": kb_totals(self.kb_rows, wall, len(self.records)), "rows": self.kb_rows,
        }
        self.write()

    # -- output --
    def payload(self, complete: bool) -> dict[str, Any]:
        return {
            "started": self.started.isoformat(), "finished": datetime.now(timezone.utc).isoformat(),
            "complete": complete, "args": vars(self.args), "environment": self.environment,
            "records_file": str(Path(self.args.records).resolve()), "gpu": self.gpu, "order": self.sides,
            "records": [
                {"index": r["index"], "key": r["key"], "level": r["level"], "has_code": r["custom_code"] is not None}
                for r in self.records
            ],
            "figures": figures(self.cudal1, self.kb),
            "cudal1": self.cudal1,
            "kernelbench": self.kb,
        }

    def write(self, complete: bool = False) -> None:
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.payload(complete), indent=1, default=str))
        tmp.replace(self.out_path)

    def report(self, interrupted: bool = False) -> None:
        from cudal1.tables import table

        print(
            table(
                [
                    "#",
                    "task", "cudal1 class", "status", "measured x", "KB outcome", "KB wall s", "KB speedup x",
                    "KB error",
                ],
                record_rows(self.records, self.cudal1, self.kb),
            )
        )
        print()
        env = self.environment
        print(
            f"measured on {env.get('gpu') or '-'} (CUDA_VISIBLE_DEVICES={self.gpu}), torch {env.get('torch') or '-'}, "
            f"CUDA {env.get('cuda') or '-'}, commit {env.get('commit') or '-'}{' (dirty)' if env.get('dirty') else ''}"
            + (f", KernelBench {env.get('kernelbench_commit') or '?'}" if self.kb_src else "")
        )
        print(f"full results: {self.out_path}")
        if interrupted:
            print("INTERRUPTED: the totals cover what finished")
        print()
        print(table(["figure", "cudal1", "KernelBench"], summary_rows(self.cudal1, self.kb)))
        sys.stdout.flush()


def figures(cudal1: dict[str, Any] | None, kb: dict[str, Any] | None) -> dict[str, Any]:
    c = (cudal1 or {}).get("totals") or {}
    k = (kb or {}).get("totals") or {}
    cw, kw = c.get("wall_s"), k.get("wall_s")
    return {"cudal1_wall_s": cw, "kernelbench_wall_s": kw,
            "ratio_kb_over_cudal1": kw / cw if cw and kw is not None else None}


def _f(x: Any, digits: int, unit: str = "") -> str:
    return "-" if x is None else f"{x:.{digits}f}{unit}"


def _counts(d: dict[str, int] | None) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted((d or {}).items())) or "-"


def record_rows(
    records: list[dict[str, Any]], cudal1: dict[str, Any] | None, kb: dict[str, Any] | None
) -> list[list[str]]:
    crow = {r["index"]: r for r in (cudal1 or {}).get("rows") or []}
    krow = {r["index"]: r for r in (kb or {}).get("rows") or []}
    out = []
    for rec in records:
        c, k = crow.get(rec["index"], {}), krow.get(rec["index"], {})
        out.append([str(rec["index"]), rec["key"], c.get("class") or "-", c.get("status") or "-",
                    _f(c.get("measured"), 2), k.get("outcome") or "-", _f(k.get("wall_s"), 1), _f(k.get("speedup"), 2),
                    (k.get("error") or "")[:60]])
    return out


def summary_rows(cudal1: dict[str, Any] | None, kb: dict[str, Any] | None) -> list[list[str]]:
    """The table printed last: records, wall, per record, ratio, outcome counts per side."""
    c = (cudal1 or {}).get("totals")
    k = (kb or {}).get("totals")
    fig = figures(cudal1, kb)
    rows = [
        [
            "records run",
            "-" if c is None else f"{c['judged']}/{c['records']}",
            "-" if k is None else f"{k['run']}/{k['records']}",
        ],
        [
            "wall s",
            "-" if c is None else _f(c["wall_s"], 1) + ("" if c.get("rc") == 0 else f" (rc={c.get('rc')})"),
            "-" if k is None else _f(k["wall_s"], 1),
        ],
        ["s / record", "-" if c is None else _f(c["per_record_s"], 2), "-" if k is None else _f(k["per_record_s"], 2)],
        ["KB / cudal1 wall", "", "-" if fig["ratio_kb_over_cudal1"] is None else f"{fig['ratio_kb_over_cudal1']:.2f}x"],
        [
            "compiled / correct",
            "-",
            "-"
            if k is None
            else f"{k['compiled']} / {k['correct']} of {k['run']}"
            + (f", {k['timeouts']} timed out" if k["timeouts"] else ""),
        ],
        ["verdicts", "-" if c is None else _counts(c["classes"]), "-" if k is None else _counts(k["outcomes"])],
    ]
    return rows


def side_order(order: str, only: str | None) -> list[str]:
    sides = ["cudal1", "kb"] if order == "cudal1-first" else ["kb", "cudal1"]
    return [s for s in sides if only in (None, s)]


def out_path(out: str | None, started: datetime) -> Path:
    name = f"vs_kernelbench_{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    if not out:
        return REPO / "runs" / "vs_kernelbench" / name
    path = Path(out)
    if path.is_dir() or out.endswith(os.sep):
        return path / name
    return path


# ---- main ---------------------------------------------------------------------------------------

def default_records() -> str:
    return os.environ.get("CUDAL1_CUDA_L1") or str(SHARED / "cuda-l1" / "sample.jsonl")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="vs_kernelbench.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--records", default=default_records(), metavar="PATH",
                   help="CUDA-L1 release JSONL (default $CUDAL1_CUDA_L1, else ../shared/cuda-l1/sample.jsonl)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="the first N records only")
    p.add_argument(
        "--kernelbench-src",
        default=None,
        metavar="PATH",
        help="a KernelBench checkout's src directory (holding kernelbench/eval.py); needed unless --only cudal1",
    )
    p.add_argument(
        "--order", choices=["cudal1-first", "kb-first"], default="cudal1-first",
        help="which side runs first (default cudal1-first)",
    )
    p.add_argument("--only", choices=["kb", "cudal1"], default=None, help="run one side only")
    p.add_argument(
        "--gpu", type=int, default=0, metavar="N",
        help="the GPU both sides use: index among the visible ones (default 0)",
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="PATH",
        help="JSON file, or an existing directory (default runs/vs_kernelbench/vs_kernelbench_<UTC time>.json)",
    )
    p.add_argument(
        "--tmp-dir",
        default=None,
        metavar="DIR",
        help="where the fresh caches and build dirs go (default: the system temp dir)",
    )
    p.add_argument(
        "--keep-temp",
        action="store_true",
        help="keep the temporary directory (logs, builds, the verify run) at the end",
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan (records, commands) and exit; no GPU needed")
    k = p.add_argument_group("KernelBench side")
    k.add_argument("--kb-timeout", type=float, default=300.0, metavar="S", help="per-record limit (default 300)")
    k.add_argument("--kb-python", default=sys.executable, metavar="PYTHON",
                   help="interpreter with KernelBench's requirements (default: this one)")
    k.add_argument("--kb-correct-trials", type=int, default=5, metavar="N", help="num_correct_trials (default 5)")
    k.add_argument("--kb-perf-trials", type=int, default=100, metavar="N", help="num_perf_trials (default 100)")
    k.add_argument("--kb-seed", type=int, default=42, metavar="N", help="seed_num (default 42)")
    c = p.add_argument_group("cudal1 side")
    c.add_argument("--verify-args", default="", metavar="'FLAGS'",
                   help="extra flags for cudal1 verify (e.g. '--preset kernelbench-v0')")
    c.add_argument(
        "--verify-timeout", type=float, default=None, metavar="S",
        help="limit for the whole verify process (default none)",
    )
    p.add_argument("--kb-one", default=None, metavar="JOB", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        p.error("--limit must be at least 1")
    return args


def run(args: argparse.Namespace) -> int:
    records, lines = read_records(Path(args.records), args.limit)
    kb_src = check_kernelbench_src(args.kernelbench_src) if args.only != "cudal1" else None
    try:
        shlex.split(args.verify_args)
    except ValueError as exc:
        raise BenchError(f"--verify-args: {exc}") from None
    bench = Bench(args, records, lines, kb_src)
    if args.dry_run:
        print(bench.plan_text("$TMP"))
        return 0
    if not bench.with_code:
        raise BenchError(f"{args.records}: no record has code")

    bench.root = Path(tempfile.mkdtemp(prefix="vs-kernelbench-", dir=args.tmp_dir))
    interrupted = False

    def on_term(signum: int, _frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        bench.runner.kill(grace_s=20.0)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        # untimed: the set-up check and the environment
        probe_env = cache_env(bench.root / "probe", bench.gpu)
        if kb_src is not None:
            probe_env["PYTHONPATH"] = kb_pythonpath(kb_src)
        bench.environment = probe(
            args.kb_python if kb_src is not None else sys.executable, probe_env, kb_src is not None
        )
        if not bench.environment.get("gpu"):
            raise BenchError(f"no CUDA GPU visible to torch (CUDA_VISIBLE_DEVICES={bench.gpu}); "
                             "--dry-run shows the plan without one")
        bench.environment |= {
            "commit": _git("rev-parse", "--short", "HEAD"),
            "dirty": bool(_git("status", "--porcelain")),
            "host": os.uname().nodename,
        }
        if kb_src is not None:
            bench.environment |= {"kernelbench_src": str(kb_src), "kernelbench_commit": kb_commit(kb_src)}
        print(bench.plan_text(str(bench.root)), file=sys.stderr, flush=True)
        bench.write()
        for side in bench.sides:
            bench.run_cudal1() if side == "cudal1" else bench.run_kb()
    except KeyboardInterrupt:
        interrupted = True
        bench.runner.kill(grace_s=5.0)
        if bench.kb is not None and bench.kb.get("running"):
            bench.kb_done(time.monotonic() - (bench.kb_t0 or time.monotonic()), complete=False)
        if bench.cudal1 is not None and bench.cudal1.get("running"):
            wall = time.monotonic() - bench.cudal1_t0 if bench.cudal1_t0 is not None else None
            bench.cudal1_done(bench.root / "cudal1" / "verify", bench.root / "cudal1" / "verify.log", None, False, wall)
    finally:
        if args.keep_temp:
            print(f"kept {bench.root}", file=sys.stderr)
        else:
            shutil.rmtree(bench.root, ignore_errors=True)
    bench.write(complete=not interrupted)
    bench.report(interrupted)
    if interrupted:
        return 130
    rc = ((bench.cudal1 or {}).get("totals") or {}).get("rc", 0)
    return 0 if rc == 0 else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.kb_one:
        return kb_one(args.kb_one)
    try:
        return run(args)
    except BenchError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
