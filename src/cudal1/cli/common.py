"""Helpers shared by subcommands: config from flags, tables, progress, one-line errors."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any

from cudal1.tables import fmt, table  # noqa: F401 - the CLI's cells and tables
from cudal1.config import EvalConfig


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


def default_of(config_class: type, name: str) -> Any:
    """The default of field ``name`` of a config dataclass (the one place defaults are stated)."""
    f = config_class.__dataclass_fields__[name]
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default  # type: ignore[misc]


def with_default(text: str, config_class: type, name: str) -> str:
    """``text`` ending with the field's default, for a flag whose argparse default is None."""
    default = default_of(config_class, name)
    return f"{text} (default: {'none' if default is None else default})"


def add_judge_flags(p: argparse.ArgumentParser, sections: tuple[str, ...] = ("judge",)) -> None:
    """The judge's flags, and ``--config``: the command's settings file, in the format of the
    ``OUT/config.yaml`` it writes (a plain mapping of judge settings is read as ``judge``)."""
    p.set_defaults(config_sections=sections)
    g = p.add_argument_group("judge")
    g.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None, help=with_default("where to run", EvalConfig, "device"))
    g.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help=with_default("hard limit per phase (construct, correctness, timing)", EvalConfig, "timeout_s"))
    g.add_argument("--build-timeout", type=float, default=None, metavar="SECONDS",
                   help=with_default("hard limit for importing/building a candidate", EvalConfig, "build_timeout_s"))
    g.add_argument("--trials", type=int, default=None, metavar="N",
                   help=with_default("correctness trials with fresh inputs", EvalConfig, "correctness_trials"))
    g.add_argument("--timing-trials", type=int, default=None, metavar="N",
                   help=with_default("maximum timed calls per model", EvalConfig, "timing_trials"))
    g.add_argument("--preset", default=None, help="judge preset: default, fast, thorough, kernelbench-v0 (default: default)")
    g.add_argument("--config", default=None, metavar="YAML",
                   help=f"settings file ({', '.join(sections)} section{'s' * (len(sections) > 1)}), e.g. a run's OUT/config.yaml, which "
                        "reproduces that run; a plain mapping of judge settings also works; unknown keys are errors")
    g.add_argument("--seed", type=int, default=None, help="fix the input seed (default: secret, random per run)")


def add_backend_flags(p: argparse.ArgumentParser) -> None:
    """``--backend local|ray`` and ``--ray-address``, shared by the subcommands that judge batches."""
    g = p.add_argument_group("scale-out")
    g.add_argument("--backend", choices=["local", "ray"], default="local",
                   help="local: build processes and one timing lane per GPU here (default); ray: timing actors "
                        "and build tasks on a Ray cluster (pip install 'cudal1[distributed]')")
    g.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="Ray cluster to join (with --backend ray); default: start a local one (loopback only)")
    g.add_argument("--workers-per-gpu", type=int, default=None, metavar="N",
                   help="judge workers sharing each GPU (local backend; default 1): their start-up, imports and "
                        "builds overlap, timing stays exclusive (a GPU lease); launch-bound references time "
                        "slower under the extra host load (docs/harness.md)")


def plan_from_args(args: argparse.Namespace, device: str, gpus: list[int] | None = None) -> Any:
    """The device plan for ``--backend``: local GPUs, or the Ray cluster's (actors start here).
    Locally, the workers' forkserver is started here (:func:`~cudal1.harness.launcher.prestart`),
    so its preload overlaps the command's own imports and set-up."""
    backend = getattr(args, "backend", "local")
    address = getattr(args, "ray_address", None)
    if address and backend != "ray":
        raise UsageError("--ray-address needs --backend ray")
    if backend == "ray" and (getattr(args, "workers_per_gpu", None) or 1) > 1:
        raise UsageError("--workers-per-gpu is for the local backend (Ray runs one timing actor per GPU)")
    if backend == "ray":
        from cudal1.harness.ray_backend import cluster_plan

        return cluster_plan(device, address, gpus)
    from cudal1.harness.launcher import prestart

    prestart()
    from cudal1.harness import DevicePlan

    return DevicePlan.detect(device, gpus)


def batch_summary(stats: list[Any]) -> dict[str, Any] | None:
    """The ``BatchStats`` of a command's batches, totalled, as JSON (None when nothing was judged)."""
    if not stats:
        return None
    total = stats[0]
    for s in stats[1:]:
        total = total.merge(s)
    return total.to_dict()


def batch_line(batch: dict[str, Any] | None) -> str:
    """One line for people: where the judging time went."""
    if not batch:
        return "time: nothing judged (all from the run store)"
    idle, gpu_idle = batch.get("idle_share"), batch.get("gpu_idle_share")
    return (f"time ({batch['backend']}): {batch['wall_s']:.1f} s wall; {batch['builds']} builds "
            f"({batch['builds_shared']} shared, {batch['builds_cached']} cached; queue {batch['build_queue_s']:.1f} s, "
            f"build {batch['build_s']:.1f} s, {batch['build_workers']} x MAX_JOBS {batch['max_jobs']}); "
            f"judging {batch['judge_s']:.1f} s, of which in-worker imports/builds {batch.get('lane_build_s', 0.0):.1f} s; "
            f"lanes idle {'-' if idle is None else f'{100 * idle:.0f}%'} after their first job, "
            f"GPUs idle {'-' if gpu_idle is None else f'{100 * gpu_idle:.0f}%'} (no worker in a GPU phase)")


def config_sections(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The sections of ``--config`` this command reads (``{}`` without the flag); read once."""
    cached = getattr(args, "_config_sections", None)
    if cached is None:
        from cudal1.config import read_config_file

        path = getattr(args, "config", None)
        cached = read_config_file(path, getattr(args, "config_sections", ("judge",))) if path else {}
        args._config_sections = cached
    return cached


def config_from_args(args: argparse.Namespace) -> EvalConfig:
    """The judge config: the defaults, or ``--preset``, or ``--config``'s judge section; then the
    judge flags that were given."""
    if args.config and args.preset:
        raise UsageError("give --config or --preset, not both")
    if args.preset:
        config = EvalConfig.preset(args.preset)
    else:
        config = EvalConfig.from_dict(config_sections(args).get("judge", {}))
    return config.replace(
        device=args.device,
        timeout_s=args.timeout,
        build_timeout_s=args.build_timeout,
        correctness_trials=args.trials,
        timing_trials=args.timing_trials,
        input_seed=args.seed,
        workers_per_gpu=getattr(args, "workers_per_gpu", None),
    )


def out_dir(path: str | Path) -> Path:
    """``--out`` of a command that writes a run directory: a usage error when it names a file."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {path} is a file; it must be a directory (a run's output folder)")
    return out


def default_out(command: str, target: str, *configs: Any) -> Path:
    """The default output directory of a run: ``runs/<command>/<target>-<hash>``, the hash over
    the target and the settings that shape the run, so re-running the same command resumes it
    and a run with other settings gets a folder of its own."""
    import hashlib
    import re

    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(target.rstrip("/")).stem if ":" not in target else target).strip("-")
    blob = json.dumps([target] + [c.identity() if hasattr(c, "identity") else c for c in configs], sort_keys=True, default=str)
    return Path("runs") / command / f"{stem[:60] or command}-{hashlib.sha256(blob.encode()).hexdigest()[:8]}"


def add_out_flags(p: argparse.ArgumentParser, command: str, what: str) -> None:
    """``--out DIR`` (default: a folder per run under ``runs/<command>/``) and ``--allow-config-change``."""
    p.add_argument("--out", default=None, metavar="DIR",
                   help=f"output directory ({what}; re-running with the same --out resumes); default: "
                        f"runs/{command}/<target>-<hash of the settings>, printed at the start")
    p.add_argument("--allow-config-change", action="store_true",
                   help="let a run with other judge or search settings use an existing --out: everything is judged "
                        "again under the new settings, earlier verdicts stay in the store, and the earlier "
                        "config.yaml is kept as config.N.yaml (without this flag such a run is refused)")


def guard_config(out: Path, allow: bool, *configs: Any) -> None:
    """Refuse (one usage error) a run whose judge/search settings differ from those recorded in
    ``out``, unless ``allow``; with ``allow``, keep the recorded config.yaml as config.N.yaml."""
    from cudal1.config import config_changes, keep_previous_config, saved_config

    saved = saved_config(out) if (out / "cudal1.sqlite").exists() else None
    if not saved:
        return
    changes = [c for cfg in configs for c in config_changes(saved.get(cfg.SECTION), cfg)]
    if not changes:
        return
    if not allow:
        shown = "; ".join(changes[:3]) + (f"; and {len(changes) - 3} more" if len(changes) > 3 else "")
        raise UsageError(f"{out} holds a run with other settings ({shown}): give another --out, or "
                         "--allow-config-change to judge again under these settings in the same run")
    keep_previous_config(out)


def progress_for(args: argparse.Namespace, desc: str, total: int = 0):
    """The command's :class:`~cudal1.cli.progress.Progress` (silent with ``-q``; no bar with ``--json``)."""
    from cudal1.cli.progress import Progress

    quiet = bool(getattr(args, "quiet", False))
    return Progress(desc, total, quiet=quiet, bar=False if getattr(args, "json", False) else None)


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


def load_suite(args: argparse.Namespace, spec: str, source: str | None) -> tuple[list[Any], list[tuple[str, str]]]:
    """The tasks of ``spec``; in a task directory, files that do not load are skipped, each shown
    as one warning line on stderr (not with ``-q``) and returned as ``(path, error)``."""
    from cudal1.tasks import load_tasks

    skipped: list[tuple[str, str]] = []
    tasks = load_tasks(spec, source, skipped)
    if skipped and not getattr(args, "quiet", False):
        for path, error in skipped:
            print(f"cudal1: warning: skipped {path}: {error.removeprefix(path + ': ')}", file=sys.stderr)
        print(f"cudal1: warning: {len(skipped)} task file(s) skipped, {len(tasks)} loaded", file=sys.stderr)
    return tasks, skipped


def read_text(path: str, what: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


class LogProgress:
    """Progress for logs (stderr not a terminal): one line ``desc: done/total (elapsed)`` at most
    every ``every_s`` seconds and at the end, so a long batch in a log file shows it is alive."""

    def __init__(self, total: int, desc: str, every_s: float = 15.0) -> None:
        import time

        self.total, self.desc, self.every_s, self.n = total, desc, every_s, 0
        self._clock = time.monotonic
        self.t0 = self.last = self._clock()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self._clock()
        if now - self.last >= self.every_s or (self.total and self.n >= self.total):
            self.last = now
            print(f"{self.desc}: {self.n}/{self.total or '?'} ({now - self.t0:.0f} s)", file=sys.stderr, flush=True)

    def __enter__(self) -> "LogProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def progress(total: int, desc: str, enabled: bool = True):
    """A tqdm bar on stderr when it is a terminal (not for --json); periodic lines
    (:class:`LogProgress`) when stderr is a log file, --json or not."""
    from tqdm import tqdm

    if not sys.stderr.isatty():
        return LogProgress(total, desc)
    return tqdm(total=total, desc=desc, unit="job", file=sys.stderr, disable=not enabled or None)
