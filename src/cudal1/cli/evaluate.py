"""``cudal1 evaluate TASKS``: a fixed-budget evaluation of a checkpoint or an endpoint.

k one-shot samples per task (``--samples``, default 8), exactly one request per sample, no
search rounds: each answer is parsed and judged, and the run reports compile, correct and ok
rates, fast_p at 1.0/1.2/1.5/2.0 (best of k, with the judge's confidence rule), the geomean and
median best-of-k speedup, and pass@k (the unbiased estimator).  TASKS is anything ``optimize``
takes, plus the fixed split: ``kernelbench:held-out``, ``kernelbench:level1:held-out``.  The
model: ``--base-url URL --model NAME`` (any OpenAI-compatible endpoint: ``vllm serve``, SGLang, a
hosted API), ``--policy hf --model-path DIR`` (transformers; a LoRA checkpoint is merged on load)
or ``--policy vllm --model-path DIR`` (vLLM offline).  Writes the run store ``OUT/cudal1.sqlite``
(``cudal1 report OUT`` renders it), ``OUT/evaluation.json`` and ``OUT/config.yaml``; re-running
with the same ``--out`` asks only for what is missing.  ``--json``: the summary as the last
stdout line."""

from __future__ import annotations

import argparse
import os

from cudal1.cli.options import (
    UsageError,
    add_backend_flags,
    add_judge_flags,
    add_out_flags,
    check_policy,
    config_from_args,
    config_sections,
    early_guard,
    load_suite,
    out_dir,
    plan_from_args,
    resolve_device,
    run_out,
)
from cudal1.cli.output import print_json, retry_warning, table
from cudal1.cli.progress import progress_for
from cudal1.config import SAMPLING_TEMPERATURE

POLICIES = ("openai", "hf", "vllm")
DEFAULT_SAMPLES = 8


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate",
        help="fixed-budget evaluation of a model: k one-shot samples per task, pass@k and fast_p",
        description=__doc__,
    )
    p.add_argument(
        "target", metavar="TASKS", help="a task .py, a task dir, a JSONL, or a selector such as kernelbench:held-out"
    )
    p.add_argument("--source", default=None, metavar="PATH", help="KernelBench JSONL or directory for suite selectors")
    p.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, metavar="K",
                   help=f"one-shot samples per task, one request each (default: {DEFAULT_SAMPLES})")
    g = p.add_argument_group("model")
    g.add_argument(
        "--policy", choices=POLICIES, default=None, help="default: openai with --base-url, else hf with --model-path"
    )
    g.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1")
    g.add_argument("--model", default=None, help="model name at the endpoint")
    g.add_argument(
        "--model-path", default=None, metavar="DIR", help="local model directory (what training writes) for hf or vllm"
    )
    g.add_argument("--api-key-env", default=None, metavar="VAR", help="environment variable holding the API key")
    g.add_argument(
        "--temperature", type=float, default=None, help=f"sampling temperature (default: {SAMPLING_TEMPERATURE})"
    )
    g.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass (default: 0.95)")
    g.add_argument("--max-tokens", type=int, default=None, help="completion token limit (default: 8192)")
    g.add_argument("--concurrency", type=int, default=None, help="requests in flight to the endpoint (default: 8)")
    g.add_argument("--tensor-parallel-size", type=int, default=None, metavar="N",
                   help="vllm: GPUs per engine (default: all visible)")
    g.add_argument(
        "--sample-seed", type=int, default=None, help="sampling seed (sent to the server; seeds hf and vllm)"
    )
    add_out_flags(p, "evaluate", "evaluation.json, config.yaml, the run store cudal1.sqlite")
    p.add_argument("--json", action="store_true", help="print the summary as the last stdout line")
    add_judge_flags(p, sections=("judge", "policy"))
    add_backend_flags(p)
    p.set_defaults(func=run)


def policy_config(args: argparse.Namespace):
    """PolicyConfig: ``--config``'s policy section, then the flags; the name resolved."""
    from cudal1.policy import PolicyConfig

    base = PolicyConfig.from_dict(config_sections(args).get("policy", {}))
    name = (
        args.policy
        or base.name
        or ("openai" if (args.base_url or base.base_url) else "hf" if args.model_path else None)
    )
    if name not in POLICIES:
        raise UsageError("evaluate needs a model: --base-url URL --model NAME, or --policy hf|vllm --model-path DIR")
    return base.replace(
        name=name, base_url=args.base_url or os.environ.get("CUDAL1_BASE_URL"), model=args.model,
        model_path=args.model_path, api_key_env=args.api_key_env, temperature=args.temperature,
        top_p=args.top_p, max_tokens=args.max_tokens, concurrency=args.concurrency, seed=args.sample_seed,
        tensor_parallel_size=args.tensor_parallel_size,
    )


def make_policy(cfg):
    """The policy ``cfg`` names (:func:`cudal1.policy.make_policy`), or a one-line usage error."""
    from cudal1.policy import make_policy as make

    try:
        return make(cfg.name, cfg)
    except ValueError as exc:
        raise UsageError(str(exc).splitlines()[0]) from None


MODEL_KEYS = ("base_url", "model", "model_path", "temperature", "top_p", "max_tokens", "seed", "dtype")


def guard_model(out, cfg, name: str) -> None:
    """Refuse an ``--out`` that holds answers of another model or other sampling settings: they
    would be counted as this model's (``--allow-config-change`` does not apply: answers, unlike
    verdicts, cannot be redone under new settings)."""
    from cudal1.config import saved_config

    saved = saved_config(out) if (out / "cudal1.sqlite").exists() else None
    if not saved:
        return
    before = dict(saved.get("policy") or {}) | {"name": (saved.get("run") or {}).get("policy")}
    now = cfg.to_dict() | {"name": name}
    changed = [
        f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in ("name",) + MODEL_KEYS if before.get(k) != now.get(k)
    ]
    if changed:
        raise UsageError(f"{out} holds an evaluation of another model or sampling ({'; '.join(changed[:3])}): "
                         "give another --out")


def run(args: argparse.Namespace) -> int:
    from cudal1.config import write_config_file
    from cudal1.recorded import RecordedJudge
    from cudal1.train.evaluation.evaluate import run_evaluate

    if args.samples < 1:
        raise UsageError("--samples must be at least 1")
    judge = config_from_args(args)
    policy_cfg = policy_config(args)
    name = policy_cfg.name
    early_guard(args, judge)  # bad input is refused before the judge is imported
    if args.out:
        guard_model(out_dir(args.out), policy_cfg, name)
    tasks, _ = load_suite(args, args.target, args.source)
    check_policy(policy_cfg)  # bad settings, or a dead endpoint, end here: before anything is judged
    plan = plan_from_args(args, judge.device)
    judge = resolve_device(judge, plan)
    out = run_out(args, "evaluate", args.target, judge, policy_cfg, args.samples)
    guard_model(out, policy_cfg, name)
    policy = make_policy(policy_cfg)
    record = {
        "command": "evaluate", "target": args.target, "source": args.source, "samples": args.samples,
        "policy": name,
    }
    write_config_file(out, judge=judge, policy=policy_cfg, run=record)
    try:
        with progress_for(args, "evaluate", 0) as progress:
            progress.line(f"{len(tasks)} task(s) x {args.samples} sample(s), policy {name}, "
                          f"judged on {plan.hardware_name()}; out {out}")
            recorded = RecordedJudge(judge, plan=plan, on_event=progress)
            summary = run_evaluate(tasks, policy, args.samples, recorded, out,
                                   record=record | {"policy_config": policy_cfg.to_dict()})
    finally:
        policy.close()
    summary["policy"] = name
    retry_warning(getattr(policy, "retries", 0), args.quiet)
    if args.json:
        print_json(summary)
    else:
        _print(summary)
    if summary["failed_requests"] and summary["samples"] == 0:
        import sys

        print(
            f"cudal1: error: every request failed ({summary['failed_requests']}); rerun with --out {out} to ask again",
            file=sys.stderr,
        )
        return 1
    return 0


def _print(s: dict) -> None:
    rows = [
        (t, r["samples"], r["compiled"], r["correct"], r["ok"], r["best_speedup"]) for t, r in s["per_task"].items()
    ]
    print(table(["task", "samples", "compiled", "correct", "ok", "best x"], rows))
    passes = ", ".join(f"{k} {v:.3f}" for k, v in s.items() if k.startswith("pass@") and v is not None)
    fast = ", ".join(f"fast_{p} {v:.3f}" for p, v in s["fast_p"].items() if v is not None)
    sp = s["speedup"]
    print(
        f"\n{s['tasks']} task(s), {s['samples']} sample(s): compiled {s['compile_rate']:.3f}, correct "
        f"{s['correct_rate']:.3f}, "
        f"ok {s['ok_rate']:.3f}"
        if s["samples"]
        else f"\n{s['tasks']} task(s), no sample scored"
    )
    print(f"{passes}; {fast} (best of {s['samples_per_task']}, 95% CI above p)")
    r = lambda v: v and round(v, 3)  # noqa: E731
    print(
        f"best-of-k speedup over all {sp['tasks']} task(s), {sp['unsolved']} unsolved at 1.0x: geomean "
        f"{r(sp['geomean'])}, "
        f"median {r(sp['median'])}; solved only ({sp['solved']}): geomean {r(sp['solved_geomean'])}, "
        f"median {r(sp['solved_median'])}; {s['out']}/evaluation.json"
    )
    if s["failed_requests"]:
        import sys

        print(f"cudal1: warning: {s['failed_requests']} request(s) failed; rerun with the same --out to ask again",
              file=sys.stderr)
