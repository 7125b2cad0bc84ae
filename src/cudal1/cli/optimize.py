"""``cudal1 optimize TASK_OR_SUITE``: contrastive search for a faster verified ``ModelNew``.

Round 0 judges the reference (1.00x); each round builds contrastive prompts from the task's
measured pool, samples a policy, judges every candidate and records everything in
``OUT/cudal1.sqlite``.  Writes ``OUT/best/<task>.py`` (only a candidate measured faster than the
reference: its 95% CI lies above 1.0), ``OUT/candidates/<task>.py`` (the best candidate that
looked faster but could not be confirmed), ``OUT/summary.json`` and the resolved configuration
``OUT/config.yaml`` (judge, search, policy; no API key) and prints a table.  Re-running with the same ``--out`` resumes
(generations that failed are asked again); other judge or search settings in an existing
``--out`` are refused unless ``--allow-config-change``.  With no ``--policy`` and no endpoint
(``--base-url`` or ``$CUDAL1_BASE_URL``), the builtin no-LLM policy is used.  Settings: the
defaults, then ``--config`` (a run's ``config.yaml``: judge, search and policy sections), then
``--search-config YAML`` for the search, then the flags given.  Exit 1 when the endpoint does
not answer (one request checks it before anything is judged) or the policy produced no
completion at all."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from cudal1.cli.options import (
    UsageError,
    add_backend_flags,
    add_judge_flags,
    add_out_flags,
    check_policy,
    config_from_args,
    config_sections,
    default_of,
    early_guard,
    load_suite,
    plan_from_args,
    resolve_device,
    run_out,
    with_default,
)
from cudal1.cli.output import batch_line, batch_summary, print_json, retry_warning, table
from cudal1.cli.profile import add_profile_flag
from cudal1.cli.progress import progress_for
from cudal1.prompts.select import STRATEGIES

if TYPE_CHECKING:
    from cudal1.policy.base import Policy

POLICIES = ("builtin", "openai", "hf", "replay")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("optimize", help="search for a faster verified ModelNew", description=__doc__)
    p.add_argument("target", metavar="TASK_OR_SUITE", help="a task .py, a task dir, a JSONL, or kernelbench:level1/1-5")
    p.add_argument("--source", default=None, metavar="PATH", help="KernelBench JSONL or directory for suite selectors")
    g = p.add_argument_group("policy")
    g.add_argument(
        "--policy", choices=POLICIES, default=None, help="default: openai if an endpoint is configured, else builtin"
    )
    g.add_argument(
        "--base-url", default=None, help="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1 (vLLM, SGLang)"
    )
    g.add_argument("--model", default=None, help="model name at the endpoint")
    g.add_argument("--api-key-env", default=None, metavar="VAR",
                   help=f"environment variable holding the API key (default: {_policy_default('api_key_env')})")
    g.add_argument("--temperature", type=float, default=None,
                   help=f"the LLM's sampling temperature (default: {_policy_default('temperature')})")
    g.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help=f"completion token limit (default: {_policy_default('max_tokens')})",
    )
    g.add_argument("--concurrency", type=int, default=None,
                   help=f"parallel requests to the endpoint (default: {_policy_default('concurrency')})")
    g.add_argument("--replay", default=None, metavar="FILE.jsonl", help="candidates (task, code) for --policy replay")
    g.add_argument("--model-path", default=None, metavar="DIR", help="local transformers model for --policy hf")
    g.add_argument("--passes", default=None, metavar="LIST",
                   help="builtin policy: comma-separated pass names, in the order to try them (default: all; "
                        "see the README's builtin-policy table)")
    g.add_argument(
        "--review",
        action="store_true",
        help="ask the same LLM for a second opinion on accepted candidates (flag reviewer_suspects; never a verdict)",
    )
    s = p.add_argument_group(
        "search", "flags override --search-config, which overrides --config, which overrides the defaults shown"
    )
    s.add_argument("--search-config", default=None, metavar="YAML",
                   help="search settings file: SearchConfig fields (rounds, samples, ...); unknown keys are errors")
    s.add_argument("--rounds", type=int, default=None, help=_help("rounds", "rounds after the reference round"))
    s.add_argument("--samples", type=int, default=None, help=_help("samples", "candidates per task per round"))
    s.add_argument("--exemplars", type=int, default=None, help=_help("exemplars", "measured exemplars per prompt"))
    s.add_argument("--strategy", choices=list(STRATEGIES), default=None,
                   help=_help("strategy", "exemplar selection"))
    s.add_argument(
        "--tau",
        type=float,
        default=None,
        help=_help(
            "tau", "exemplar selection: softmax temperature over speedup buckets (not the sampling --temperature)"
        ),
    )
    s.add_argument("--no-feedback", dest="feedback", action="store_const", const=False, default=None,
                   help="do not show failed candidates' errors")
    s.add_argument("--no-anchor", dest="anchor", action="store_const", const=False, default=None,
                   help="do not judge the reference itself (round 0): it counts as 1.00x without a verdict, one job "
                        "per task fewer, and the prompts show no 1.00x exemplar (for policies that do not read it, "
                        "like builtin)")
    s.add_argument("--budget-minutes", type=float, default=None, help=_help("budget_minutes", "wall-clock budget"))
    s.add_argument(
        "--max-evaluations", type=int, default=None, help=_help("max_evaluations", "budget of judged candidates")
    )
    s.add_argument("--search-seed", dest="search_seed", type=int, default=None,
                   help=_help("seed", "search seed (exemplar sampling)"))
    add_out_flags(
        p, "optimize", "best/<task>.py, candidates/<task>.py, summary.json, config.yaml, the run store cudal1.sqlite"
    )
    p.add_argument("--json", action="store_true", help="print summary.json's content as the last stdout line")
    p.add_argument("--report-to", choices=["tensorboard", "wandb", "mlflow"], default=None,
                   help="also log live metrics to this experiment tracker (off by default; needs its package)")
    add_profile_flag(p, tools=("cupti",), what=": the reference once and each round's best candidates, shown "
                     "to the model as a measured section of its prompt")
    add_judge_flags(p, sections=("judge", "search", "policy"))
    add_backend_flags(p)
    p.set_defaults(func=run)


def _policy_default(field: str) -> object:
    from cudal1.policy.base import PolicyConfig

    return default_of(PolicyConfig, field)


def _help(field: str, text: str) -> str:
    """``text`` with the default read from SearchConfig (the one place defaults are stated)."""
    from cudal1.search import SearchConfig

    return with_default(text, SearchConfig, field)


def search_config(args: argparse.Namespace):
    """SearchConfig: the defaults, then ``--config``'s search section, then ``--search-config``,
    then the flags that were given."""
    from cudal1.search import SearchConfig

    base = SearchConfig.from_dict(config_sections(args).get("search", {}))
    if args.search_config:
        base = base.replace(**SearchConfig.from_yaml(args.search_config).to_dict())
    return base.replace(rounds=args.rounds, samples=args.samples, exemplars=args.exemplars, strategy=args.strategy,
                        tau=args.tau, feedback=args.feedback, budget_minutes=args.budget_minutes,
                        max_evaluations=args.max_evaluations, seed=args.search_seed,
                        profile=True if getattr(args, "profile", None) else None, anchor=getattr(args, "anchor", None))


def policy_config(args: argparse.Namespace, device: str):
    """PolicyConfig: the defaults, then ``--config``'s policy section, then the flags given; the
    policy's name resolved (``--policy``, the file, else openai with an endpoint, else builtin)."""
    from cudal1.policy import PolicyConfig

    base = PolicyConfig.from_dict(config_sections(args).get("policy", {}))
    passes = [p.strip() for p in args.passes.split(",") if p.strip()] if args.passes else None
    cfg = base.replace(name=args.policy, base_url=args.base_url or os.environ.get("CUDAL1_BASE_URL"), model=args.model,
                       api_key_env=args.api_key_env, temperature=args.temperature, max_tokens=args.max_tokens,
                       concurrency=args.concurrency, replay_path=args.replay, model_path=args.model_path, passes=passes)
    if not cfg.name:
        cfg = cfg.replace(name="openai" if cfg.base_url else "builtin")
    return cfg.replace(device=device) if cfg.name == "builtin" else cfg


def make_policy(cfg, device: str):
    """The policy ``cfg`` names (:func:`cudal1.policy.make_policy`), or a one-line usage error;
    the builtin policy runs its candidates on ``device``."""
    from cudal1.policy import make_policy as make

    if cfg.name == "vllm":
        raise UsageError(
            "policy vllm (offline vLLM generation) is for cudal1 evaluate; optimize takes builtin, openai, hf or replay"
        )
    cfg = cfg.replace(device=device) if cfg.name == "builtin" else cfg
    check_policy(cfg)
    try:
        return make(cfg.name, cfg)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def check_passes(cfg) -> None:
    """The builtin policy's ``--passes`` names (a usage error naming the known ones)."""
    from cudal1.policy.builtin import check_passes as check

    try:
        check(list(cfg.passes))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


COMPILING_WORKERS_PER_GPU = 2  # default --workers-per-gpu for a builtin policy that proposes compiled candidates


def default_workers_per_gpu(args: argparse.Namespace, device: str, policy: Policy) -> int | None:
    """``--workers-per-gpu`` when given; else 2 on a local GPU for a policy whose candidates run
    torch.compile (minutes of CPU work inside a worker: one worker compiles while the other is
    timed; 4 ran KernelBench level-1 tasks out of memory beside each other); else None (the
    config's value)."""
    if args.workers_per_gpu is not None:
        return args.workers_per_gpu
    if device == "cuda" and args.backend == "local" and getattr(policy, "compiles", lambda: False)():
        return COMPILING_WORKERS_PER_GPU
    return None


def run(args: argparse.Namespace) -> int:
    from cudal1.recorded import RecordedJudge
    from cudal1.search import optimize

    judge = config_from_args(args)
    search = search_config(args)  # a ConfigError is a one-line usage error (cli.main)
    policy_cfg = policy_config(args, "auto")
    # everything that can refuse the run comes before the judge is imported: bad input is one line, at once
    early_guard(args, judge, search)
    tasks, skipped = load_suite(args, args.target, args.source)
    if args.report_to:
        from cudal1.report.trackers import TrackerUnavailable, check_tracker

        try:
            check_tracker(args.report_to)
        except (TrackerUnavailable, ValueError) as exc:
            raise UsageError(str(exc)) from None
    if args.review and policy_cfg.name not in ("openai", "hf"):
        raise UsageError("--review needs an LLM policy (openai or hf)")
    if policy_cfg.name == "builtin":
        check_passes(policy_cfg)  # the builtin policy itself is made once the device is known
    policy = None if policy_cfg.name == "builtin" else make_policy(policy_cfg, "auto")  # openai: the endpoint answers
    summary, tracker = None, None
    try:
        plan = plan_from_args(args, judge.device)
        judge = resolve_device(judge, plan)
        out = run_out(args, "optimize", args.target, judge, search, policy_cfg.name, checked=(search,))
        if policy is None:
            policy = make_policy(policy_config(args, plan.device), plan.device)
        judge = judge.replace(workers_per_gpu=default_workers_per_gpu(args, plan.device, policy))
        reviewer = None
        if args.review:
            from cudal1.policy.reviewer import LLMReviewer

            reviewer = LLMReviewer(policy)
        if args.report_to:
            from cudal1.report.trackers import make_tracker

            tracker = make_tracker(args.report_to, out, {"judge": judge.to_dict(), "target": args.target}, tasks)
        with progress_for(args, "optimize") as progress:
            progress.line(f"{len(tasks)} task(s), policy {policy.name}, judged on {plan.hardware_name()}; out {out}")

            def on_event(event) -> None:
                progress(event)
                if tracker is not None and event.kind == "verdict":
                    tracker(event.result)

            recorded = RecordedJudge(judge, plan=plan, reviewer=reviewer, on_event=on_event)
            summary = optimize(tasks, policy, search, recorded, out,
                               record={"command": "optimize", "target": args.target, "source": args.source},
                               extra={"skipped_tasks": [{"path": p, "error": e} for p, e in skipped]})
            if args.verbose:  # -v: where the judging time went (builds, lanes, GPU idle share)
                progress.line(batch_line(batch_summary(recorded.batch_stats)))
    finally:
        if policy is not None:
            policy.close()
        if tracker is not None:
            tracker.close(summary)
    return report_summary(args, summary, policy, out)


def report_summary(args: argparse.Namespace, summary: dict, policy: Policy, out: Path) -> int:
    """Print the run's table (or ``--json``) and say when generations failed or were retried;
    the exit status: 1 when the policy produced no completion at all, else 0."""
    import sys

    from cudal1.speedup import LEGEND, cell

    gen = summary["generation"]
    if args.json:
        print_json(summary)
    else:
        rows = [
            (
                r["task"],
                "degenerate" if r["degenerate"] else cell(r["best_speedup"], r["best_ci"], r["high_variance"]),
                f"{r['best_ci'][0]:.3g}-{r['best_ci'][1]:.3g}" if r["best_ci"] else "-",
                r["judged"],
                ", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items())) or "-",
                _kept(r),
            )
            for r in summary["tasks"]
        ]
        print(table(["task", "best x", "95% CI", "judged", "verdicts", "kept"], rows))
        gm = summary["geomean_best_speedup"]
        n = len(summary["tasks"])
        print(f"\nfaster than the reference (95% CI above 1.0): {summary['faster']} of {n} task(s); "
              f"by point value only: {summary['faster_point']}; geomean best speedup {gm and round(gm, 3)}")
        print("judged: candidates with a verdict, the reference not counted; best/ holds only programs measured "
              "faster (95% CI above 1.0), candidates/ faster-looking ones the run could not confirm")
        if any(r["uncertain"] or r["high_variance"] for r in summary["tasks"]):
            print(LEGEND)
        print(f"policy {policy.name}; stopped by {summary['stopped_by']}; {out}/summary.json")
    retry_warning(gen["retries"], args.quiet)
    if gen["failed"]:
        if gen["answered_total"] == 0:
            print(
                f"cudal1: error: no completion from the policy: {gen['failed']} of {gen['requested']} request(s) "
                "failed "
                f"(last: {gen['last_error'].splitlines()[0][:300]}); nothing was proposed; rerun with --out {out} "
                "to ask again",
                file=sys.stderr,
            )
            return 1
        print(
            f"cudal1: warning: {gen['failed']} of {gen['requested']} generation(s) failed "
            f"(last: {gen['last_error'].splitlines()[0][:300]}); rerun with --out {out} to ask again",
            file=sys.stderr,
        )
    return 0


def _kept(row: dict) -> str:
    """Where the task's program was kept: its best/ file, its candidates/ file (with its speedup), or -."""
    if row["best_path"]:
        return row["best_path"]
    maybe = row["uncertain_candidate"]
    if maybe:
        from cudal1.speedup import cell

        return f"{maybe['path']} ({cell(maybe['speedup'], maybe['ci'])}, not confirmed)"
    return "-"
