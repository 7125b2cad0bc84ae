"""``cudal1 optimize TASK_OR_SUITE``: contrastive search for a faster verified ``ModelNew``.

Round 0 judges the reference (1.00x); each round builds contrastive prompts from the task's
measured pool, samples a policy, judges every candidate and records everything in
``OUT/cudal1.sqlite``.  Writes ``OUT/best/<task>.py`` and ``OUT/summary.json`` and prints a
table.  Re-running with the same ``--out`` resumes.  With no ``--policy`` and no endpoint
(``--base-url`` or ``$CUDAL1_BASE_URL``), the builtin no-LLM policy is used."""

from __future__ import annotations

import argparse
import os

from cudal1.cli.common import UsageError, add_judge_flags, config_from_args, print_json, progress, table

POLICIES = ("builtin", "openai", "hf", "replay")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("optimize", help="search for a faster verified ModelNew", description=__doc__)
    p.add_argument("target", metavar="TASK_OR_SUITE", help="a task .py, a task dir, a JSONL, or kernelbench:level1/1-5")
    p.add_argument("--source", default=None, metavar="PATH", help="KernelBench JSONL or directory for suite selectors")
    g = p.add_argument_group("policy")
    g.add_argument("--policy", choices=POLICIES, default=None, help="default: openai if an endpoint is configured, else builtin")
    g.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1 (vLLM, SGLang)")
    g.add_argument("--model", default=None, help="model name at the endpoint")
    g.add_argument("--api-key-env", default="OPENAI_API_KEY", metavar="VAR", help="environment variable holding the API key")
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
    s = p.add_argument_group("search")
    s.add_argument("--rounds", type=int, default=3, help="rounds after the reference round (default 3)")
    s.add_argument("--samples", type=int, default=4, help="candidates per task per round (default 4)")
    s.add_argument("--exemplars", type=int, default=2, help="measured exemplars per prompt (default 2)")
    s.add_argument("--strategy", choices=["contrastive", "random", "best"], default="contrastive", help="exemplar selection")
    s.add_argument("--tau", type=float, default=1.0, help="softmax temperature over speedup buckets")
    s.add_argument("--no-feedback", action="store_true", help="do not show failed candidates' errors")
    s.add_argument("--budget-minutes", type=float, default=None, help="wall-clock budget")
    s.add_argument("--max-evaluations", type=int, default=None, help="budget of judged candidates")
    s.add_argument("--search-seed", dest="search_seed", type=int, default=0, help="search seed (exemplar sampling)")
    p.add_argument("--out", default="runs/optimize", metavar="DIR", help="output directory (resumable)")
    p.add_argument("--json", action="store_true", help="print summary.json's content as the last stdout line")
    add_judge_flags(p)
    p.set_defaults(func=run)


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


def hardware_name(plan) -> str:
    if plan.device != "cuda":
        return "CPU"
    from cudal1.harness.envinfo import gpu_inventory

    names = sorted({g.name for g in gpu_inventory() if g.index in plan.lanes})
    return ", ".join(names) or "CUDA GPU"


def run(args: argparse.Namespace) -> int:
    from cudal1.harness import DevicePlan
    from cudal1.search import SearchConfig, optimize
    from cudal1.tasks import load_tasks

    judge = config_from_args(args)
    tasks = load_tasks(args.target, args.source)
    try:
        search = SearchConfig(rounds=args.rounds, samples=args.samples, exemplars=args.exemplars, strategy=args.strategy,
                              temperature=args.tau, feedback=not args.no_feedback, budget_minutes=args.budget_minutes,
                              max_evaluations=args.max_evaluations, seed=args.search_seed)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    plan = DevicePlan.detect(judge.device)
    policy = make_policy(choose_policy(args), args, plan.device)
    reviewer = None
    if args.review:
        if policy.name not in ("openai", "hf"):
            raise UsageError("--review needs an LLM policy (openai or hf)")
        from cudal1.policy.reviewer import LLMReviewer

        reviewer = LLMReviewer(policy)
    total = len(tasks) * (1 + search.rounds * search.samples)
    try:
        with progress(total, "optimize", not args.json) as bar:
            summary = optimize(tasks, policy, search, judge, args.out, hardware=hardware_name(plan), plan=plan,
                               on_result=lambda r: bar.update(1), reviewer=reviewer)
    finally:
        policy.close()
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
