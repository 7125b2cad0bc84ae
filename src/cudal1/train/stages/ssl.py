"""Stage 2 (CUDA-L1's second): self-supervised rounds — generate, judge, keep the successes, fine-tune.

Contract: :func:`run_ssl` runs ``cfg.rounds`` rounds starting from ``model``.  Each round ``r``:

1. generates ``cfg.samples`` programs per task from the current model — with vLLM when it is
   installed (``backend: auto``/``vllm``), else transformers (the ``hf`` policy) — for the task's
   prompt (the contrastive template without exemplars; :mod:`cudal1.train.generation`);
2. judges them all (:class:`~cudal1.train.judging.RolloutJudge`; records in ``OUT/cudal1.sqlite``);
3. keeps the successes: ``ok`` and not on a degenerate task, speed ignored (the paper's stage keeps
   programs that are executable and correct); one per distinct program, at most
   ``max_keep_per_task`` per task when set;
4. writes them to ``OUT/round<r>/data.jsonl`` (chat format with provenance, like ``collect``) and
   fine-tunes on them with :func:`~cudal1.train.stages.sft.run_sft` into ``OUT/round<r>/model``.

``OUT/metrics.jsonl`` gets one line per round (``step`` = round, ``loss`` = the round's last SFT
loss, ``success_rate``, ``kept``, ``judged``); each round's SFT writes its own metrics next to its
model.  ``OUT/model`` links to the latest model (plain transformers directory).  ``resume`` skips
rounds whose model is complete, and re-judging a recorded program costs nothing (the store).
A round with no success keeps the model unchanged.

Several processes (``torchrun``/``accelerate launch``): every rank generates and judges.  The
round's task x sample slots are sharded (:func:`~cudal1.train.generation.shard`): each rank (or,
with vLLM tensor parallelism ``t``, each group of ``t`` ranks running one engine together)
generates its own block, each rank judges its share of it and records it in the one run store
(WAL; rank 0 creates it first).  The kept successes and the counts are gathered to rank 0, which
writes ``data.jsonl``, ``summary.json``, ``metrics.jsonl`` and the ``model`` link; then every rank
fine-tunes on the round's data together (data-parallel :func:`~cudal1.train.stages.sft.run_sft`).  Every
rank's summary carries the round's totals.

Not covered: the vLLM path is not exercised by the CPU tests (vLLM needs a GPU).
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any

from cudal1.recorded import RecordedJudge
from cudal1.train import dist, require_train
from cudal1.train.config import SSLConfig
from cudal1.train.generation import GenerationSettings, engine_tp, generate, shard, use_vllm
from cudal1.train.judging import RolloutJudge
from cudal1.train.reward import Outcome
from cudal1.types import EvalResult, Prompt, Task

log = logging.getLogger(__name__)


def generation_settings(cfg: SSLConfig) -> GenerationSettings:
    return GenerationSettings(backend=cfg.backend, temperature=cfg.temperature, top_p=cfg.top_p,
                              max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size,
                              tensor_parallel_size=cfg.vllm_tensor_parallel_size,
                              gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
                              max_model_length=cfg.vllm_max_model_length)


def _success(res: EvalResult | None, outcome: Outcome) -> bool:
    """A kept program: ``ok`` and not on a degenerate task (speed ignored: executable and correct is the bar)."""
    return res is not None and outcome.kind == "ok" and not outcome.degenerate


def chat_record(prompt: Prompt, text: str, task: Task, res: EvalResult, source: str) -> dict[str, Any]:
    """One training record: chat messages plus provenance (the format ``collect`` writes)."""
    import dataclasses

    return {
        "messages": prompt.messages() + [{"role": "assistant", "content": text}],
        "task": task.task_id, "task_hash": task.hash, "source": source, "status": res.status.value,
        "speedup": res.speedup,
        "speedup_ci": list(res.speedup_ci) if res.speedup_ci else None,
        "flags": list(res.flags),
        "candidate_hash": res.candidate_hash,
        "config_hash": res.config_hash,
        "environment": dataclasses.asdict(res.environment),
    }


def run_ssl(model: str, tasks: list[Task], cfg: SSLConfig, judge: RecordedJudge, out: str | Path, *,
            resume: bool = False, report_to: Any = "none", allow_held_out: bool = False,
            kernelbench: str | Path | None = None) -> dict[str, Any]:
    """Run the self-supervised rounds (see the module docstring), judging through ``judge`` (its
    store is ``OUT/cudal1.sqlite`` unless it has one).  Returns a summary.  Held-out tasks are
    refused (:mod:`cudal1.train.heldout`) unless ``allow_held_out``."""
    require_train("cudal1 train ssl")
    from cudal1.train.common import check_model

    if not allow_held_out:
        from cudal1.train.heldout import HeldOut, refuse

        refuse(tasks, "train ssl", HeldOut.load(kernelbench))
    check_model(model)
    from cudal1.prompts import build_prompt
    from cudal1.train.metrics import read_metrics
    from cudal1.train.stages.sft import run_sft

    out = Path(out)
    main = dist.is_main()
    with dist.main_first():  # rank 0 creates the store (schema, WAL) before the others open it
        out.mkdir(parents=True, exist_ok=True)
        judge.open_store(out / "cudal1.sqlite")
    try:
        rollouts = RolloutJudge(judge, "ssl")
        prompts = [build_prompt(t, [], judge.hardware) for t in tasks]
        rounds = []
        current = str(model)
        for r in range(1, cfg.rounds + 1):
            rdir = out / f"round{r}"
            done = rdir / "summary.json"
            if resume and done.is_file():  # every rank sees the same files: the previous round ended in a barrier
                rounds.append(json.loads(done.read_text()))
                current = rounds[-1]["model"]
                continue
            data = rdir / "data.jsonl"
            mine = _generate_and_judge(current, tasks, prompts, cfg, rollouts, r)
            totals = _merge(dist.all_gather(mine), cfg.max_keep_per_task)
            if main:
                rdir.mkdir(parents=True, exist_ok=True)
                with open(data, "w") as f:
                    f.writelines(json.dumps(rec, default=str) + "\n" for rec in totals["kept"])
            dist.barrier()  # data.jsonl is complete before any rank reads it
            n_kept = len(totals["kept"])
            loss = None
            if n_kept:  # every rank fine-tunes (data-parallel); rank 0 saves, run_sft returns once it has
                sft = run_sft(current, str(data), cfg.sft, rdir / "model", report_to=report_to, stage=f"ssl-round{r}",
                              allow_held_out=True)  # the round's programs answer ``tasks``, checked above
                current, loss = str(rdir / "model"), sft["loss_last"]
            elif main:
                log.warning("ssl round %d: no successes; the model is unchanged", r)
            success = totals["successes"] / max(1, totals["generated"])
            info = {"round": r, "model": current, "generated": totals["generated"], "success_rate": success,
                    "kept": n_kept, "judged": totals["judged"], "loss": loss, "data": str(data),
                    "judged_per_rank": totals["per_rank"]}
            if main:
                _append_metrics(out, {"step": r, "stage": "ssl", "loss": loss, "success_rate": success, "kept": n_kept,
                                      "judged": totals["judged"], "model": current})
                done.write_text(json.dumps(info, indent=1))
                log.info("ssl round %d: success rate %.2f, kept %d", r, success, n_kept)
            rounds.append(info)
            dist.barrier()  # summary.json is written before any rank looks at the next round
    finally:
        judge.close_store()
    if main:
        _link_latest(out, current)
        read_metrics(out)  # validates the file
    return {"out": str(out), "rounds": rounds, "model": current,
            "success_rate": [r["success_rate"] for r in rounds]}


def _generate_and_judge(model: str, tasks: list[Task], prompts: list[Prompt], cfg: SSLConfig, judge: RolloutJudge,
                        r: int) -> dict[str, Any]:
    """This rank's part of round ``r``: generate its block of the task x sample slots, judge its
    share, and return plain data for the gather (counts, successes, kept records by slot)."""
    settings = generation_settings(cfg)
    world = dist.world_size()
    # ranks per engine: under several processes a vLLM engine spans ``tp`` ranks (one GPU each); a
    # single process's engine spans its GPUs by itself
    tp = engine_tp(settings, world) if world > 1 and use_vllm(settings.backend) else 1
    part = shard(len(tasks) * cfg.samples, dist.rank(), world, tp)
    slots = list(part.generate)
    texts = generate(model, [prompts[i // cfg.samples] for i in slots], settings,
                     seed=cfg.sft.seed + 1000 * r + part.group, world=world)
    text_of = dict(zip(slots, texts))
    mine = part.judge
    items = [(tasks[i // cfg.samples], text_of[i]) for i in mine]
    verdicts = judge.judge(items, round_=r, prompts=[prompts[i // cfg.samples] for i in mine], label=f"ssl:r{r}")
    counts = dict(judge.drain_counts())
    kept = [(slot, task.hash, res.candidate_hash,
             chat_record(prompts[slot // cfg.samples], text, task, res, f"ssl:round{r}:{Path(model).name}"))
            for slot, (task, text), (res, outcome) in zip(mine, items, verdicts) if _success(res, outcome)]
    successes = len(kept)
    return {"generated": len(mine), "successes": successes, "judged": counts, "kept": kept}


def _merge(parts: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """The round's totals from every rank's part: counts summed; successes in slot order, one per
    (task, program), at most ``limit`` per task (0: all)."""
    judged: Counter[str] = Counter()
    for part in parts:
        judged.update(part["judged"])
    seen: set[tuple[str, str]] = set()
    per_task: Counter[str] = Counter()
    kept = []
    for _, task_hash, cand_hash, record in sorted((k for part in parts for k in part["kept"]), key=lambda k: k[0]):
        if (task_hash, cand_hash) in seen or (limit and per_task[task_hash] >= limit):
            continue
        seen.add((task_hash, cand_hash))
        per_task[task_hash] += 1
        kept.append(record)
    return {"generated": sum(p["generated"] for p in parts), "successes": sum(p["successes"] for p in parts),
            "judged": dict(judged), "kept": kept, "per_rank": [p["generated"] for p in parts]}


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
