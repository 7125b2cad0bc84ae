"""Stage 2: self-supervised rounds — generate, judge, keep the successes, fine-tune (CUDA-L1 §3.2).

Contract: :func:`run_ssl` runs ``cfg.rounds`` rounds starting from ``model``.  Each round ``r``:

1. generates ``cfg.samples`` programs per task from the current model — with vLLM when it is
   installed (``backend: auto``/``vllm``), else transformers (the ``hf`` policy) — for the task's
   prompt (the contrastive template without exemplars);
2. judges them all (:class:`~cudal1.train.judging.RolloutJudge`; records in ``OUT/cudal1.sqlite``);
3. keeps the successes: ``ok`` and not on a degenerate task, speed ignored (as in CUDA-L1); one
   per distinct program, at most ``max_keep_per_task`` per task when set;
4. writes them to ``OUT/round<r>/data.jsonl`` (chat format with provenance, like ``collect``) and
   fine-tunes on them with :func:`~cudal1.train.sft.run_sft` into ``OUT/round<r>/model``.

``OUT/metrics.jsonl`` gets one line per round (``step`` = round, ``loss`` = the round's last SFT
loss, ``success_rate``, ``kept``, ``judged``); each round's SFT writes its own metrics next to its
model.  ``OUT/model`` links to the latest model (plain transformers directory).  ``resume`` skips
rounds whose model is complete, and re-judging a recorded program costs nothing (the store).
A round with no success keeps the model unchanged.

Several processes (``torchrun``/``accelerate launch``): rank 0 alone generates, judges, opens the
run store and writes ``data.jsonl``, ``summary.json``, ``metrics.jsonl`` and the ``model`` link;
the other ranks wait at a barrier (``CUDAL1_DIST_TIMEOUT_S``, :mod:`.dist`) and then every rank
fine-tunes on the round's data together (data-parallel :func:`~cudal1.train.sft.run_sft`).  This
is the simplest correct split: generation and judging get no faster with more ranks (the judge
still spreads its work over the GPUs of ``plan``), only the fine-tuning does.  Only rank 0's
returned summary has ``success_rate``/``generated``/``judged`` (``None`` on the others).

Not covered: the vLLM path is not exercised by the CPU tests (vLLM needs a GPU).
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from cudal1.config import EvalConfig
from cudal1.train import dist, require_train
from cudal1.train.config import SSLConfig
from cudal1.train.judging import RolloutJudge
from cudal1.types import EvalResult, Prompt, Task

log = logging.getLogger(__name__)


def generate(model: str, prompts: list[Prompt], cfg: SSLConfig, seed: int) -> list[list[str]]:
    """``cfg.samples`` texts per prompt from ``model`` (vLLM when chosen and installed, else transformers)."""
    import importlib.util

    use_vllm = cfg.backend == "vllm" or (cfg.backend == "auto" and importlib.util.find_spec("vllm") is not None)
    if cfg.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ValueError("ssl backend 'vllm' needs the vllm package (pip install vllm)")
    if use_vllm:
        return _generate_vllm(model, prompts, cfg, seed)
    from cudal1.policy.hf_policy import HFPolicy

    policy = HFPolicy(model_path=model, temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_new_tokens,
                      batch_size=cfg.batch_size, seed=seed)
    try:
        batches = policy.generate(prompts, cfg.samples)
    finally:
        policy.close()
    return [[c.text for c in batch] for batch in batches]


def _generate_vllm(model: str, prompts: list[Prompt], cfg: SSLConfig, seed: int) -> list[list[str]]:
    from vllm import LLM, SamplingParams

    # under several processes rank 0 generates alone, on its own GPU (the others hold theirs)
    llm = LLM(model=model, seed=seed, tensor_parallel_size=1 if dist.distributed() else max(1, _gpus()))
    params = SamplingParams(n=cfg.samples, temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_new_tokens,
                            seed=seed)
    outputs = llm.chat([p.messages() for p in prompts], params, use_tqdm=False)
    texts = [[o.text for o in out.outputs] for out in outputs]
    del llm
    return texts


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def keep_successes(items: list[tuple[Task, str]], verdicts: list, limit: int = 0) -> list[tuple[Task, str, EvalResult]]:
    """Successful (task, text, result) triples: ok, not degenerate, one per program, ≤ ``limit`` per task."""
    seen: set[tuple[str, str]] = set()
    per_task: Counter[str] = Counter()
    kept = []
    for (task, text), (res, outcome) in zip(items, verdicts):
        if res is None or outcome.kind != "ok" or outcome.degenerate:
            continue
        key = (task.hash, res.candidate_hash)
        if key in seen or (limit and per_task[task.hash] >= limit):
            continue
        seen.add(key)
        per_task[task.hash] += 1
        kept.append((task, text, res))
    return kept


def chat_record(prompt: Prompt, text: str, task: Task, res: EvalResult, source: str) -> dict[str, Any]:
    """One training record: chat messages plus provenance (the format ``collect`` writes)."""
    import dataclasses

    return {
        "messages": prompt.messages() + [{"role": "assistant", "content": text}],
        "task": task.task_id, "task_hash": task.hash, "source": source, "status": res.status.value,
        "speedup": res.speedup, "speedup_ci": list(res.speedup_ci) if res.speedup_ci else None, "flags": list(res.flags),
        "candidate_hash": res.candidate_hash, "config_hash": res.config_hash,
        "environment": dataclasses.asdict(res.environment),
    }


def run_ssl(model: str, tasks: list[Task], cfg: SSLConfig, judge_config: EvalConfig, out: str | Path, *,
            plan: Any = None, hardware: str = "CPU", resume: bool = False, report_to: Any = "none",
            on_result: Callable[[EvalResult], None] | None = None) -> dict[str, Any]:
    """Run the self-supervised rounds (see the module docstring).  Returns a summary."""
    require_train("cudal1 train ssl")
    from cudal1.prompts import build_prompt
    from cudal1.store import RunStore
    from cudal1.train.metrics import read_metrics
    from cudal1.train.sft import run_sft

    out = Path(out)
    main = dist.is_main()
    store = judge = None
    if main:  # the only rank that generates, judges and writes the round's files
        out.mkdir(parents=True, exist_ok=True)
        store = RunStore(out / "cudal1.sqlite")
        judge = RolloutJudge(store, judge_config, plan=plan, policy="ssl", on_result=on_result)
    prompts = [build_prompt(t, [], hardware) for t in tasks]
    rounds = []
    current = str(model)
    dist.barrier()
    for r in range(1, cfg.rounds + 1):
        rdir = out / f"round{r}"
        done = rdir / "summary.json"
        if resume and done.is_file():  # every rank sees the same files: the previous round ended in a barrier
            rounds.append(json.loads(done.read_text()))
            current = rounds[-1]["model"]
            continue
        data = rdir / "data.jsonl"
        if main:
            items, verdicts, counts, kept = _generate_and_judge(current, tasks, prompts, cfg, judge, r)
            rdir.mkdir(parents=True, exist_ok=True)
            by_task = {t.hash: p for t, p in zip(tasks, prompts)}
            with open(data, "w") as f:
                for task, text, res in kept:
                    f.write(json.dumps(chat_record(by_task[task.hash], text, task, res,
                                                   f"ssl:round{r}:{Path(current).name}"), default=str) + "\n")
        dist.barrier()  # the other ranks waited here for the round's data
        n_kept = sum(1 for line in data.read_text().splitlines() if line.strip())
        loss = None
        if n_kept:  # every rank fine-tunes (data-parallel); rank 0 saves, run_sft returns once it has
            sft = run_sft(current, str(data), cfg.sft, rdir / "model", report_to=report_to, stage=f"ssl-round{r}")
            current, loss = str(rdir / "model"), sft["loss_last"]
        elif main:
            log.warning("ssl round %d: no successes; the model is unchanged", r)
        info = {"round": r, "model": current, "generated": None, "success_rate": None, "kept": n_kept,
                "judged": None, "loss": loss, "data": str(data)}
        if main:
            success = sum(o.success or (o.kind == "ok" and not o.degenerate) for _, o in verdicts) / max(1, len(verdicts))
            info |= {"generated": len(items), "success_rate": success, "judged": counts}
            _append_metrics(out, {"step": r, "stage": "ssl", "loss": loss, "success_rate": success, "kept": n_kept,
                                  "judged": counts, "model": current})
            done.write_text(json.dumps(info, indent=1))
            log.info("ssl round %d: success rate %.2f, kept %d", r, success, n_kept)
        rounds.append(info)
        dist.barrier()  # summary.json is written before any rank looks at the next round
    if main:
        _link_latest(out, current)
        store.close()
        read_metrics(out)  # validates the file
    return {"out": str(out), "rounds": rounds, "model": current,
            "success_rate": [r["success_rate"] for r in rounds]}


def _generate_and_judge(model: str, tasks: list[Task], prompts: list[Prompt], cfg: SSLConfig, judge: RolloutJudge,
                        r: int) -> tuple[list, list, dict[str, int], list]:
    """One round's samples from ``model``, their verdicts, the counts per outcome and the kept successes."""
    texts = generate(model, prompts, cfg, seed=cfg.sft.seed + r)
    items = [(t, text) for t, batch in zip(tasks, texts) for text in batch]
    item_prompts = [p for p, batch in zip(prompts, texts) for _ in batch]
    verdicts = judge.judge(items, round_=r, prompts=item_prompts, label=f"ssl:r{r}")
    counts = dict(judge.drain_counts())
    return items, verdicts, counts, keep_successes(items, verdicts, cfg.max_keep_per_task)


def _append_metrics(out: Path, rec: dict[str, Any]) -> None:
    import time

    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps(rec | {"time": time.time()}, default=str) + "\n")


def _link_latest(out: Path, model: str) -> None:
    link = out / "model"
    target = Path(model).resolve()
    if link.is_symlink() or link.exists():
        if link.is_symlink():
            link.unlink()
        else:
            return  # a real directory someone put there: leave it
    if target != link.resolve():
        os.symlink(target, link, target_is_directory=True)
