"""The flags the subcommands share and what they resolve to: judge/backend/output flags,
``--config`` sections, the judge config, the device plan, the run directory (its default name
and the guard against mixing settings in it), the task suite, and the one-line usage error."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cudal1.config import EvalConfig

if TYPE_CHECKING:
    from cudal1.harness import DevicePlan


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


class RunFailure(Exception):
    """The command could not do its work, through no fault in its input (an endpoint that does
    not answer): printed as one line, exit code 1."""


def default_of(config_class: type, name: str) -> Any:
    """The default of field ``name`` of a config dataclass (the one place defaults are stated)."""
    f = config_class.__dataclass_fields__[name]
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default  # type: ignore[misc]


def with_default(text: str, config_class: type, name: str) -> str:
    """``text`` ending with the field's default, for a flag whose argparse default is None."""
    default = default_of(config_class, name)
    return f"{text} (default: {'none' if default is None else default})"


def check_policy(cfg) -> None:
    """Before anything is judged: a policy configuration it cannot run with is one usage error
    (:func:`cudal1.policy.policy_problem`), and an openai policy's endpoint gets one request, so a
    dead one ends the command in seconds (:class:`RunFailure`, exit 1), not after the references
    are judged and every request has been retried."""
    from cudal1.policy import policy_problem

    problem = policy_problem(cfg)
    if problem:
        raise UsageError(problem)
    if cfg.name != "openai":
        return
    from cudal1.policy.openai_policy import EndpointUnreachable, endpoint_url
    from cudal1.policy.openai_policy import check_endpoint as check

    try:
        check(endpoint_url(cfg.base_url))
    except EndpointUnreachable as exc:
        raise RunFailure(f"the endpoint {exc}; nothing was judged") from None


def add_judge_flags(p: argparse.ArgumentParser, sections: tuple[str, ...] = ("judge",), flat: str = "judge",
                    also: str = "") -> None:
    """The judge's flags, and ``--config``: the command's settings file, in the format of the
    ``OUT/config.yaml`` it writes (a plain mapping is read as the ``flat`` section; ``also``: more
    the help says ``--config`` takes)."""
    p.set_defaults(config_sections=sections, config_flat=flat)
    g = p.add_argument_group("judge")
    g.add_argument(
        "--device", choices=["auto", "cpu", "cuda"], default=None,
        help=with_default("where to run", EvalConfig, "device"),
    )
    g.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help=with_default("hard limit per phase (construct, correctness, timing)", EvalConfig, "timeout_s"))
    g.add_argument("--build-timeout", type=float, default=None, metavar="SECONDS",
                   help=with_default("hard limit for importing/building a candidate", EvalConfig, "build_timeout_s"))
    g.add_argument("--trials", type=int, default=None, metavar="N",
                   help=with_default("correctness trials with fresh inputs", EvalConfig, "correctness_trials"))
    g.add_argument("--timing-trials", type=int, default=None, metavar="N",
                   help=with_default("maximum timed calls per model", EvalConfig, "timing_trials"))
    g.add_argument("--timing-figure", choices=["gpu", "host"], default=None,
                   help=with_default("what the speedup compares: gpu = the call's device time without host latency, "
                                     "host = host-inclusive (the larger of the GPU time and the host's time to issue "
                                     "the call)", EvalConfig, "timing_figure"))
    g.add_argument(
        "--preset", default=None, help="judge preset: default, fast, thorough, kernelbench-v0 (default: default)"
    )
    g.add_argument("--config", default=None, metavar="YAML",
                   help=f"settings file ({', '.join(sections)} section{'s' * (len(sections) > 1)}), e.g. a run's "
                        f"OUT/config.yaml, which reproduces that run; a plain mapping of {flat} settings also works"
                        f"{also}; unknown keys are errors")
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
                   help="judge workers sharing each GPU (local backend; default 1, and 2 for optimize with the builtin "
                        "policy when it proposes torch.compile candidates): their start-up, imports and "
                        "builds overlap, timing stays exclusive (a GPU lease); launch-bound references time "
                        "slower under the extra host load (docs/harness.md)")


def add_out_flags(p: argparse.ArgumentParser, command: str, what: str) -> None:
    """``--out DIR`` (default: a folder per run under ``runs/<command>/``) and ``--allow-config-change``."""
    p.add_argument("--out", default=None, metavar="DIR",
                   help=f"output directory ({what}; re-running with the same --out resumes); default: "
                        f"runs/{command}/<target>-<hash of the settings>, printed at the start")
    p.add_argument("--allow-config-change", action="store_true",
                   help="let a run with other judge or search settings use an existing --out: everything is judged "
                        "again under the new settings, earlier verdicts stay in the store, and the earlier "
                        "config.yaml is kept as config.N.yaml (without this flag such a run is refused)")


def plan_from_args(args: argparse.Namespace, device: str, gpus: list[int] | None = None) -> DevicePlan:
    """The device plan for ``--backend``: local GPUs, or the Ray cluster's (actors start here).
    Locally, the workers' forkserver is started here (:func:`~cudal1.harness.parent.launcher.prestart`),
    so its preload overlaps the command's own imports and set-up."""
    backend = getattr(args, "backend", "local")
    address = getattr(args, "ray_address", None)
    if address and backend != "ray":
        raise UsageError("--ray-address needs --backend ray")
    if backend == "ray" and (getattr(args, "workers_per_gpu", None) or 1) > 1:
        raise UsageError("--workers-per-gpu is for the local backend (Ray runs one timing actor per GPU)")
    if backend == "ray":
        from cudal1.harness.parent.ray_backend import cluster_plan

        return cluster_plan(device, address, gpus)
    from cudal1.harness.parent.launcher import prestart

    prestart()
    from cudal1.harness import DevicePlan

    return DevicePlan.detect(device, gpus)


def config_sections(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The sections of ``--config`` this command reads (``{}`` without the flag); read once."""
    cached = getattr(args, "_config_sections", None)
    if cached is None:
        from cudal1.config import read_config_file

        path = getattr(args, "config", None)
        sections, flat = getattr(args, "config_sections", ("judge",)), getattr(args, "config_flat", "judge")
        cached = read_config_file(path, sections, flat) if path else {}
        args._config_sections = cached
    return cached


def config_from_args(args: argparse.Namespace, base: EvalConfig | None = None) -> EvalConfig:
    """The judge config: ``--preset``, or ``--config``'s judge section, else ``base`` (default: the
    defaults); then the judge flags that were given."""
    section = config_sections(args).get("judge")
    if section is not None and args.preset:
        raise UsageError("give --config with judge settings or --preset, not both")
    if args.preset:
        config = EvalConfig.preset(args.preset)
    elif section is not None or base is None:
        config = EvalConfig.from_dict(section or {})
    else:
        config = base
    return config.replace(
        device=args.device,
        timeout_s=args.timeout,
        build_timeout_s=args.build_timeout,
        correctness_trials=args.trials,
        timing_trials=args.timing_trials,
        timing_figure=getattr(args, "timing_figure", None),
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
    blob = json.dumps(
        [target] + [c.identity() if hasattr(c, "identity") else c for c in configs], sort_keys=True, default=str
    )
    return Path("runs") / command / f"{stem[:60] or command}-{hashlib.sha256(blob.encode()).hexdigest()[:8]}"


def guard_config(out: Path, allow: bool, *configs: Any, early: bool = False) -> None:
    """Refuse (one usage error) a run whose judge/search settings differ from those recorded in
    ``out``, unless ``allow``; with ``allow``, keep the recorded config.yaml as config.N.yaml.

    ``early``: the check made before the device is resolved (so that bad input is refused before
    the judge is imported): a judge device of ``auto`` is taken to be the recorded one, and
    nothing is kept or allowed yet; the check after :func:`resolve_device` is the full one."""
    from cudal1.config import config_changes, keep_previous_config, saved_config

    saved = saved_config(out) if (out / "cudal1.sqlite").exists() else None
    if not saved or (early and allow):
        return
    if early:
        recorded = (saved.get("judge") or {}).get("device")
        configs = tuple(c.replace(device=recorded) if isinstance(c, EvalConfig) and c.device == "auto" and recorded
                        else c for c in configs)
    changes = [c for cfg in configs for c in config_changes(saved.get(cfg.SECTION), cfg)]
    if not changes:
        return
    if not allow:
        shown = "; ".join(changes[:3]) + (f"; and {len(changes) - 3} more" if len(changes) > 3 else "")
        raise UsageError(f"{out} holds a run with other settings ({shown}): give another --out, or "
                         "--allow-config-change to judge again under these settings in the same run")
    keep_previous_config(out)


def resolve_device(config: EvalConfig, plan: DevicePlan) -> EvalConfig:
    """The judge config with ``device: auto`` replaced by the device the plan resolved, so that
    ``--device cpu`` and the default ``auto`` on a machine without a GPU are the same settings:
    the same default run folder, the same recorded config, the same verdicts to resume from."""
    return config.replace(device=plan.device) if config.device == "auto" else config


def run_out(args: argparse.Namespace, command: str, target: str, judge: EvalConfig, *others: Any,
            checked: tuple[Any, ...] = ()) -> Path:
    """A run's directory once the device is resolved: ``--out``, else :func:`default_out` over
    ``judge`` (resolved) and ``others``; refused when it holds a run whose judge or ``checked``
    settings differ (:func:`guard_config`)."""
    out = out_dir(args.out or default_out(command, target, judge, *others))
    guard_config(out, args.allow_config_change, judge, *checked)
    return out


def early_guard(args: argparse.Namespace, judge: EvalConfig, *checked: Any) -> None:
    """Before the judge is imported: ``--out`` must be a directory, and one that holds a run with
    other judge or ``checked`` settings is refused (see :func:`guard_config`'s ``early``)."""
    if args.out:
        guard_config(out_dir(args.out), args.allow_config_change, judge, *checked, early=True)


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
