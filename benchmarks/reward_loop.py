"""What one GRPO step costs with real answers: generation (scripted), building, judging and the update.

A GRPO step of ``--rollouts`` (64) completions, 8 per prompt, through ``cudal1.train.stages.grpo.run_grpo`` —
TRL's GRPOTrainer, contrastive prompts from the run store, every rollout parsed, built, verified and
timed by the real judge — with generation replaced by a scripted OpenAI-compatible server
(``cudal1/train/smoke/server.py``) through TRL's ``rollout_func``: each prompt is posted to it and the answer
tokenized as the completion.  What the server answers is realistic in size and kind:

* answers of about ``--answer-tokens`` (4096) tokens: a Performance Analysis (padding prose up to
  the length), an Algorithm Design and the program;
* programs with real ``load_inline`` kernels: CUDA-L1's released kernels for their tasks (``ref_code``)
  when a local copy of the release exists (``--cuda-l1``: default ``$CUDAL1_CUDA_L1``, else
  ``.data/sample.jsonl``, else ``../shared/cuda-l1/sample.jsonl``; the records whose program calls
  ``load_inline``), and the bundled CUDA row-scale kernel on the ``diag_scale`` task;
* per group (``--mix``, default ``correct=3,wrong=1,broken=1,repeat=2,nocode=1``): the kernel with a
  comment that makes its CUDA source new (a fresh build, as a new answer is), the same with its
  output scaled by 1.01 (builds, then ``incorrect``), a CUDA source with an ``#error`` (a failing
  build), a repeat of an answer earlier in the step (the verdict cache), and prose without code.

The policy is a decoder of a real model's shape with random weights built at run time
(``--model-shape``: ``0.5b``, ``1.5b`` (GPU default) or ``7b`` Qwen2.5 shapes, ``tiny``; no download)
and a BPE tokenizer trained on the answers; ``--lora`` trains adapters.  Per step it prints and
writes (``OUT/reward_loop.json``): generation seconds (the scripted server and tokenizing), judge
seconds (``metrics.jsonl``'s ``judge_s``: parse, build, verify, time), builds (fresh
``load_inline`` builds and their CPU-side seconds), the update (the rest of TRL's ``step_time``:
reference and policy log-probabilities, the backward, the optimizer), the verdicts, and rollouts
per GPU-hour (rollouts / step seconds x 3600 x GPUs).  The table comes last.  Before the first step
the references of the tasks are judged (``setup``, outside the step's figures).

    python3 benchmarks/reward_loop.py --out /tmp/reward_loop                 # a GPU: one step, 64 rollouts
    python3 benchmarks/reward_loop.py --cpu-small --out /tmp/reward_loop     # CPU: 8 rollouts, no CUDA kernels

``--cpu-small`` runs the same pipeline on a CPU in about a minute: the tiny policy, 16 rollouts of
512-token answers with the bundled PyTorch programs (correct, wrong, failing) instead of CUDA kernels
(the CPU judge does not build them); its figures describe the CPU, not a GPU step.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # train_gpu_programs

SHAPES = {  # Qwen2.5 shapes (config.json of the published models); weights are random
    "tiny": dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4
    ),
    "0.5b": dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2
    ),
    "1.5b": dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2
    ),
    "7b": dict(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4
    ),
}
MIX = "correct=3,wrong=1,broken=1,repeat=2,nocode=1"
WRONG = """

_CorrectModelNew = ModelNew


class ModelNew(_CorrectModelNew):  # the same kernel, its output off by 1%
    def forward(self, *args, **kwargs):
        return super().forward(*args, **kwargs) * 1.01
"""
PROSE = (
    "The reference launches one kernel per operation and writes every intermediate to global memory, so its time is "
    "set by memory traffic rather than arithmetic. Fusing the elementwise tail into the main kernel keeps values in "
    "registers, and coalesced loads with one thread per output element use the bandwidth fully. The launch overhead "
    "of several small kernels also matters at these sizes, so one launch per call is the goal. "
)


def release_programs(path: Path | None) -> list[tuple[object, str]]:
    """(task, program) of the release records whose program builds a ``load_inline`` extension."""
    if path is None or not path.is_file():
        return []
    from cudal1.releases import read_records

    return [(r.task, r.code) for r in read_records(path) if r.code and "load_inline" in r.code and r.task is not None]


def fresh(code: str, tag: str) -> str:
    """``code`` made new: a comment in its first C/C++ source block (a new build, as a new answer's
    kernel is), or, for a program without one, a Python comment (a new candidate, nothing to build)."""
    if "load_inline" in code:
        new = re.sub(r"(#include[^\n]*\n)", lambda m: m.group(1) + f"// {tag}\n", code, count=1)
        if new != code:
            return new
    return f"# {tag}\n{code}"


def broken(code: str, tag: str) -> str:
    """``code`` that fails to build: an ``#error`` in its C/C++ source, else a Python syntax error."""
    if "load_inline" in code:
        new = re.sub(
            r"(#include[^\n]*\n)",
            lambda m: m.group(1) + f"#error cudal1 benchmark: a failing build ({tag})\n",
            code,
            count=1,
        )
        if new != code:
            return new
    return f"{code}\nclass Broken(:  # {tag}\n"


def mix(spec: str) -> list[str]:
    kinds = []
    for part in spec.split(","):
        name, count = part.split("=")
        if name not in ("correct", "wrong", "broken", "repeat", "nocode"):
            raise SystemExit(f"reward_loop: unknown answer kind {name!r} in --mix")
        kinds += [name] * int(count)
    return kinds


def answer(code: str | None, pad_to: int, tok) -> str:
    """A three-section answer of about ``pad_to`` tokens."""
    from cudal1.train.smoke import answer as format_answer

    body = (format_answer(code, "", "Keep the task's semantics; move the work into one fused pass.") if code
            else "### Performance Analysis\n\n### Algorithm Design\nI would rather describe it than write code.\n")
    need = max(0, pad_to - len(tok(body).input_ids))
    prose, unit = "", len(tok(PROSE).input_ids)
    prose = PROSE * max(1, need // unit)
    text = body.replace("### Performance Analysis\n", f"### Performance Analysis\n{prose}\n", 1)
    return text


def answer_sets(tasks_programs: list, kinds: list[str], groups: int, pad_to: int, tok) -> dict[str, list[str]]:
    """Per task name, the answers its prompts get in turn (``groups`` groups of ``kinds``)."""
    out: dict[str, list[str]] = {}
    for task, code in tasks_programs:
        answers: list[str] = []
        for g in range(groups):
            for i, kind in enumerate(kinds):
                tag = f"{task.name} group {g} answer {i}"
                if kind == "correct":
                    answers.append(answer(fresh(code, tag), pad_to, tok))
                elif kind == "wrong":
                    answers.append(answer(fresh(code, tag) + WRONG, pad_to, tok))
                elif kind == "broken":
                    answers.append(answer(broken(code, tag), pad_to, tok))
                elif kind == "repeat":
                    answers.append(answers[0] if answers else answer(code, pad_to, tok))
                else:
                    answers.append(answer(None, pad_to, tok))
        out[task.name] = answers
    return out


def build_policy(out: Path, shape: str, texts: list[str], cuda: bool) -> tuple[Path, object]:
    """A random-weight decoder of ``shape`` and a BPE tokenizer trained on ``texts``, saved to ``out``."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from cudal1.train.smoke.tiny import train_tokenizer

    tok = train_tokenizer(texts, vocab_size=8192 if shape == "tiny" else 16384)
    config = Qwen2Config(
        vocab_size=len(tok) if shape == "tiny" else max(len(tok), 151936),
        max_position_embeddings=32768, tie_word_embeddings=False, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, bos_token_id=None, **SHAPES[shape],
    )
    torch.manual_seed(0)
    with torch.device("cuda" if cuda else "cpu"):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16 if cuda else torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    del model
    if cuda:
        torch.cuda.empty_cache()
    return out, tok


def scripted_rollout(url: str, tok, max_len: int, spent: list[float]):
    """TRL's ``rollout_func``: each prompt posted to the scripted server, its answer tokenized."""
    import urllib.request

    def rollout(prompts, trainer):
        t0 = time.perf_counter()
        prompt_ids, completion_ids = [], []
        for messages in prompts:
            body = json.dumps({"model": "scripted", "messages": messages, "max_tokens": max_len}).encode()
            req = urllib.request.Request(f"{url}/chat/completions", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as resp:
                text = json.loads(resp.read())["choices"][0]["message"]["content"]
            prompt_ids.append(
                tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
            )
            completion_ids.append(tok(text, add_special_tokens=False).input_ids[: max_len - 1] + [tok.eos_token_id])
        spent.append(time.perf_counter() - t0)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    return rollout


def server_script(answers: dict[str, list[str]]):
    """The server's script: the next answer of the task the prompt names (``# Task: NAME``)."""
    served: dict[str, int] = {}

    def script(body: dict, index: int) -> str:
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        name = re.search(r"^# Task: (.+)$", user, re.MULTILINE).group(1).strip()
        n = served.get(name, 0)
        served[name] = n + 1
        got = answers[name]
        return got[n % len(got)]

    return script


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="/tmp/cudal1_reward_loop")
    p.add_argument("--rollouts", type=int, default=None, help="completions per step (default 64; --cpu-small 16)")
    p.add_argument("--group", type=int, default=8, help="completions per prompt")
    p.add_argument("--steps", type=int, default=1, help="GRPO steps (each reported)")
    p.add_argument("--answer-tokens", type=int, default=None, help="tokens per answer (default 4096; --cpu-small 512)")
    p.add_argument("--mix", default=MIX, help=f"answer kinds per group, summing to --group (default {MIX})")
    p.add_argument(
        "--model-shape", choices=sorted(SHAPES), default=None, help="policy shape (default 1.5b; --cpu-small tiny)"
    )
    p.add_argument("--lora", action="store_true", help="train LoRA adapters instead of all weights")
    p.add_argument("--cuda-l1", type=Path, default=None, help="CUDA-L1 release JSONL whose load_inline kernels to use")
    p.add_argument("--judge-preset", default="fast")
    p.add_argument("--workers-per-gpu", type=int, default=1)
    p.add_argument("--cpu-small", action="store_true", help="the CPU mode (see the module docstring)")
    args = p.parse_args(argv)

    import torch

    cuda = torch.cuda.is_available() and not args.cpu_small
    if not cuda and not args.cpu_small:
        print("reward_loop: needs a CUDA GPU (or --cpu-small)", file=sys.stderr)
        return 2
    rollouts = args.rollouts or (64 if cuda else 16)
    pad_to = args.answer_tokens or (4096 if cuda else 512)
    shape = args.model_shape or ("1.5b" if cuda else "tiny")
    kinds = mix(args.mix)
    if len(kinds) != args.group or rollouts % args.group:
        print(
            f"reward_loop: --mix must sum to --group ({args.group}) and --rollouts be a multiple of it", file=sys.stderr
        )
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import shutil

    shutil.rmtree(out / "cache", ignore_errors=True)  # fresh builds: nothing cached from an earlier run
    os.environ["CUDAL1_CACHE_DIR"] = str(out / "cache")
    from cudal1.config import EvalConfig
    from cudal1.harness import DevicePlan
    from cudal1.recorded import RecordedJudge
    from cudal1.train import smoke
    from cudal1.train.config import load_config
    from cudal1.train.smoke.server import ScriptedLLMServer
    from cudal1.train.stages.grpo import run_grpo

    t0 = time.monotonic()
    prompts = rollouts // args.group
    if cuda:
        from train_gpu_programs import CUDA_ROW_SCALE

        default = next(
            (
                c
                for c in (
                    os.environ.get("CUDAL1_CUDA_L1"),
                    ROOT / ".data" / "sample.jsonl",
                    ROOT.parent / "shared" / "cuda-l1" / "sample.jsonl",
                )
                if c and Path(c).is_file()
            ),
            None,
        )
        programs = [(smoke.smoke_task(4096), CUDA_ROW_SCALE)] + release_programs(
            args.cuda_l1 or (Path(default) if default else None)
        )
        programs = programs[:prompts]
    else:  # the CPU judge builds no CUDA: a bundled PyTorch program, and a Python syntax error for "broken"
        programs = [(smoke.smoke_task(), smoke.VARIANTS["broadcast"])]
    tasks = [t for t, _ in programs]
    corpus = [c for _, c in programs] + [PROSE, smoke.TASK_SOURCE] + [t.source for t in tasks]
    model, tok = build_policy(out / "policy", shape, corpus, cuda)
    groups = -(-prompts // len(tasks)) * args.steps + 1
    answers = answer_sets(programs, kinds, groups, pad_to, tok)
    lengths = [len(tok(a).input_ids) for got in answers.values() for a in got]  # a long kernel can pass pad_to
    judge = EvalConfig.preset(args.judge_preset).replace(
        device="cuda" if cuda else "cpu", workers_per_gpu=args.workers_per_gpu
    )
    if not cuda:
        judge = smoke.smoke_judge_config()
    plan = DevicePlan.detect(judge.device)
    gpus = len(plan.lanes) if cuda else 1
    accumulation = rollouts // 4 if cuda else 1  # 4 sequences per micro-step on the GPU
    cfg = load_config("grpo", "smoke", dict(
        group_size=args.group, prompts_per_step=prompts, max_steps=args.steps, gradient_accumulation_steps=accumulation,
        learning_rate=1e-6, beta=0.04, max_completion_length=max(lengths) + 16, bf16=cuda, gradient_checkpointing=cuda,
        save_steps=10_000, lora=args.lora, collapse_steps=0))
    spent: list[float] = []
    built: list = []
    print(f"setup: policy {shape} ({_parameters(model) / 1e9:.2f}B parameters), {len(tasks)} task(s), "
          f"answers of {min(lengths)}-{max(lengths)} tokens; {time.monotonic() - t0:.0f} s", flush=True)
    with ScriptedLLMServer(server_script(answers), lifetime_s=3600) as srv:
        t1 = time.monotonic()
        recorded = RecordedJudge(judge, plan=plan if cuda else None, hardware=plan.hardware_name() if cuda else "CPU",
                                 on_event=lambda e: built.append(e.result) if e.kind == "verdict" else None)
        summary = run_grpo(str(model), tasks, cfg, recorded, out / "grpo",
                           rollout=scripted_rollout(srv.url, tok, cfg.max_completion_length, spent),
                           allow_held_out=True)  # a benchmark: nothing here is evaluated later
        wall = time.monotonic() - t1
    steps = [json.loads(x) for x in (out / "grpo" / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if s.get("stage") == "grpo"]
    return report(
        out, steps, spent, built, rollouts, gpus, wall, summary,
        dict(
            shape=shape, lora=args.lora, answer_tokens=[min(lengths), max(lengths)], mix=args.mix,
            tasks=[t.task_id for t in tasks], gpu=plan.hardware_name() if cuda else "CPU",
            torch=torch.__version__, cuda=cuda,
        ),
    )


def _parameters(model_dir: Path) -> int:
    import math

    from safetensors import safe_open

    total = 0
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            total += sum(math.prod(st.get_slice(k).get_shape()) for k in st.keys())
    return total


def report(out: Path, steps: list, spent: list, built: list, rollouts: int, gpus: int, wall: float, summary: dict,
           info: dict) -> int:
    """The figures per step (``OUT/reward_loop.json``) and the table, last."""
    fresh = [r for r in built if (r.build_s or 0) >= 2.0]
    rows = []
    for i, s in enumerate(steps):
        step_s = float(s["trl"].get("step_time") or 0.0)
        gen = spent[i] if i < len(spent) else 0.0
        judge = float(s.get("judge_s") or 0.0)
        rows.append({"step": s["step"], "step_s": step_s, "generation_s": gen, "judge_s": judge,
                     "update_s": max(step_s - gen - judge, 0.0), "judged": s["judged"], "evaluated": s["evaluated"],
                     "rollouts_per_gpu_hour": rollouts * 3600 / (step_s * gpus) if step_s else None})
    result = info | {"rollouts_per_step": rollouts, "gpus": gpus, "steps": rows, "wall_s": wall,
                     "fresh_builds": len(fresh), "build_s_sum": sum(r.build_s for r in fresh),
                     "build_s_max": max((r.build_s for r in fresh), default=0.0), "verdicts": summary["judged"]}
    (out / "reward_loop.json").write_text(json.dumps(result, indent=1, default=str))
    print(
        f"\n{info['gpu']}, policy {info['shape']}{' LoRA' if info['lora'] else ''}, {rollouts} rollouts/step of "
        f"{info['answer_tokens'][0]}-{info['answer_tokens'][1]} tokens, mix {info['mix']}; {out / 'reward_loop.json'}"
    )
    print(
        f"fresh builds {len(fresh)}: {result['build_s_sum']:.0f} s of build time in all, {result['build_s_max']:.0f} "
        "s the "
        "longest (inside the judge's time, several at once)"
    )
    print(
        f"{'step':>4} {'generation_s':>12} {'judge_s':>8} {'update_s':>8} {'step_s':>7} {'rollouts/GPU-h':>14}  "
        "verdicts"
    )
    for r in rows:
        print(
            f"{r['step']:>4} {r['generation_s']:>12.1f} {r['judge_s']:>8.1f} {r['update_s']:>8.1f} {r['step_s']:>7.1f} "
            f"{r['rollouts_per_gpu_hour'] or 0:>14.0f}  {json.dumps(r['judged'], sort_keys=True)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
