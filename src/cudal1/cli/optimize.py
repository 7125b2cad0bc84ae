"""``cudal1 optimize TASK_OR_SUITE``: contrastive search for a faster verified ``ModelNew``.

Round 0 judges the reference (1.00x); each round builds contrastive prompts from the task's
measured pool, samples a policy, judges every candidate and records everything in
``OUT/cudal1.sqlite``.  Writes ``OUT/best/<task>.py``, ``OUT/summary.json`` and the resolved
configuration ``OUT/config.yaml`` (judge, search, policy; no API key) and prints a table.
Re-running with the same ``--out`` resumes.  With no ``--policy`` and no endpoint (``--base-url``
or ``$CUDAL1_BASE_URL``), the builtin no-LLM policy is used.  Search settings: the
``SearchConfig`` defaults, then ``--search-config YAML``, then the flags given."""

from __future__ import annotations

import argparse
import os

from cudal1.cli.common import (UsageError, add_backend_flags, add_judge_flags, config_from_args, plan_from_args, print_json,
                               progress, table)
from cudal1.prompts.select import STRATEGIES

POLICIES = ("builtin", "openai", "hf", "replay")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("optimize", help="search for a faster verified ModelNew", description=__doc__)
    p.add_argument("target", metavar="TASK_OR_SUITE", help="a task .py, a task dir, a JSONL, or kernelbench:level1/1-5")
    p.add_argument("--source", default=None, metavar="PATH", help="KernelBench JSONL or directory for suite selectors")
    g = p.add_argument_group("policy")
    g.add_argument("--policy", choices=POLICIES, default=None, help="default: openai if an endpoint is configured, else builtin")
    g.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1 (vLLM, SGLang)")
    g.add_argument("--model", default=None, help="model name at the endpoint")
    g.add_argument("--api-key-env", default=None, metavar="VAR",
                   help=f"environment variable holding the API key (default {_policy_default('api_key_env')})")
    g.add_argument("--temperature", type=float, default=None, help="sampling temperature")
    g.add_argument("--max-tokens", type=int, default=None, help="completion token limit")
    g.add_argument("--concurrency", type=int, default=None, help="parallel requests to the endpoint")
    g.add_argument("--replay", default=None, metavar="FILE.jsonl", help="candidates (task, code) for --policy replay")
    g.add_argument("--model-path", default=None, metavar="DIR", help="local transformers model for --policy hf")
    g.add_argument("--passes", default=None, metavar="LIST",
                   help="builtin policy: comma-separated pass names, in the order to try them (default: all; "
                        "see the README's builtin-policy table)")
    g.add_argument("--review", action="store_true",
                   help="ask the same LLM for a second opinion on accepted candidates (flag reviewer_suspects; never a verdict)")
    s = p.add_argument_group("search", "flags override --search-config, which overrides the defaults shown")
    s.add_argument("--search-config", default=None, metavar="YAML",
                   help="search settings file: SearchConfig fields (rounds, samples, ...); unknown keys are errors")
    s.add_argument("--rounds", type=int, default=None, help=_help("rounds", "rounds after the reference round"))
    s.add_argument("--samples", type=int, default=None, help=_help("samples", "candidates per task per round"))
    s.add_argument("--exemplars", type=int, default=None, help=_help("exemplars", "measured exemplars per prompt"))
    s.add_argument("--strategy", choices=list(STRATEGIES), default=None,
                   help=_help("strategy", "exemplar selection"))
    s.add_argument("--tau", type=float, default=None, help=_help("temperature", "softmax temperature over speedup buckets"))
    s.add_argument("--no-feedback", dest="feedback", action="store_const", const=False, default=None,
                   help="do not show failed candidates' errors")
    s.add_argument("--budget-minutes", type=float, default=None, help=_help("budget_minutes", "wall-clock budget"))
    s.add_argument("--max-evaluations", type=int, default=None, help=_help("max_evaluations", "budget of judged candidates"))
    s.add_argument("--search-seed", dest="search_seed", type=int, default=None,
                   help=_help("seed", "search seed (exemplar sampling)"))
    p.add_argument("--out", default="runs/optimize", metavar="DIR", help="output directory (resumable)")
    p.add_argument("--json", action="store_true", help="print summary.json's content as the last stdout line")
    p.add_argument("--report-to", choices=["tensorboard", "wandb", "mlflow"], default=None,
                   help="also log live metrics to this experiment tracker (off by default; needs its package)")
    add_judge_flags(p)
    add_backend_flags(p)
    p.set_defaults(func=run)


def _policy_default(field: str) -> object:
    from cudal1.policy.base import PolicyConfig

    return PolicyConfig.__dataclass_fields__[field].default


def _help(field: str, text: str) -> str:
    """``text`` with the default read from SearchConfig (the one place defaults are stated)."""
    from cudal1.search.loop import SearchConfig

    default = SearchConfig.__dataclass_fields__[field].default
    return f"{text} (default {'none' if default is None else default})"


def search_config(args: argparse.Namespace):
    """SearchConfig: the defaults, then ``--search-config``, then the flags that were given."""
    from cudal1.search import SearchConfig

    base = SearchConfig.from_yaml(args.search_config) if args.search_config else SearchConfig()
    return base.replace(rounds=args.rounds, samples=args.samples, exemplars=args.exemplars, strategy=args.strategy,
                        temperature=args.tau, feedback=args.feedback, budget_minutes=args.budget_minutes,
                        max_evaluations=args.max_evaluations, seed=args.search_seed)


def choose_policy(args: argparse.Namespace) -> str:
    if args.policy:
        return args.policy
    return "openai" if (args.base_url or os.environ.get("CUDAL1_BASE_URL")) else "builtin"


def make_policy(name: str, args: argparse.Namespace, device: str):
    from cudal1.policy import PolicyConfig, make_policy as _make

    if name == "replay" and not args.replay:
        raise UsageError("--policy replay needs --replay FILE.jsonl")
    if name == "hf" and not args.model_path:
        raise UsageError("--policy hf needs --model-path DIR")
    if name == "openai" and not (args.base_url or os.environ.get("CUDAL1_BASE_URL") or os.environ.get("OPENAI_BASE_URL")):
        raise UsageError("--policy openai needs --base-url (or $CUDAL1_BASE_URL)")
    options = {k: v for k, v in {
        "base_url": args.base_url or os.environ.get("CUDAL1_BASE_URL"),
        "model": args.model, "api_key_env": args.api_key_env, "temperature": args.temperature,
        "max_tokens": args.max_tokens, "concurrency": args.concurrency, "replay_path": args.replay,
        "model_path": args.model_path,
    }.items() if v is not None}
    if name == "builtin":
        from cudal1.policy.builtin import BuiltinPolicy

        passes = [p.strip() for p in args.passes.split(",") if p.strip()] if args.passes else None
        try:
            return BuiltinPolicy(device=device, passes=passes)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if args.passes:
        raise UsageError("--passes applies to --policy builtin only")
    try:
        return _make(name, config=PolicyConfig(**options))
    except (ValueError, ImportError) as exc:
        raise UsageError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    from cudal1.search import optimize
    from cudal1.tasks import load_tasks

    judge = config_from_args(args)
    search = search_config(args)  # a ConfigError is a one-line usage error (cli.main)
    tasks = load_tasks(args.target, args.source)
    plan = plan_from_args(args, judge.device)
    tracker = None
    if args.report_to:
        from cudal1.report.trackers import TrackerUnavailable, make_tracker

        try:
            tracker = make_tracker(args.report_to, args.out, {"judge": judge.to_dict(), "target": args.target}, tasks)
        except TrackerUnavailable as exc:
            raise UsageError(str(exc)) from None
    policy = make_policy(choose_policy(args), args, plan.device)
    reviewer = None
    if args.review:
        if policy.name not in ("openai", "hf"):
            raise UsageError("--review needs an LLM policy (openai or hf)")
        from cudal1.policy.reviewer import LLMReviewer

        reviewer = LLMReviewer(policy)
    total = len(tasks) * (1 + search.rounds * search.samples)
    summary = None
    try:
        with progress(total, "optimize", not args.json) as bar:
            summary = optimize(tasks, policy, search, judge, args.out, hardware=plan.hardware_name(), plan=plan,
                               on_result=lambda r: (bar.update(1), tracker and tracker(r)), reviewer=reviewer)
    finally:
        policy.close()
        if tracker is not None:
            tracker.close(summary)
    if args.json:
        print_json(summary)
        return 0
    rows = [(r["task"], r["best_speedup"], r["evaluated"], ", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items())),
             "degenerate" if r["degenerate"] else (r["best_path"] or "-")) for r in summary["tasks"]]
    print(table(["task", "best x", "judged", "verdicts", "best"], rows))
    gm = summary["geomean_best_speedup"]
    print(f"\npolicy {getattr(policy, 'name', '?')}; stopped by {summary['stopped_by']}; "
          f"geomean best speedup {gm and round(gm, 3)}; {args.out}/summary.json")
    return 0
