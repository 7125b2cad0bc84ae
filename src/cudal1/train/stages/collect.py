"""Stage 0: verified training data — from teacher endpoints, or from a published set re-judged here.

Contract:

* :func:`collect_teachers` asks each OpenAI-compatible teacher for ``attempts`` answers per task
  (our contrastive prompt, no exemplars), judges every program, and keeps only **verified** ones:
  status ``ok`` and the task not flagged ``degenerate_task`` — never ``rejected``, incorrect or
  failing code.  At most ``per_task`` distinct programs per task are kept, fastest first
  (cudal1's defaults: 20 attempts per teacher, at most 2 kept per task).  A teacher that does not answer
  at all raises :class:`CollectError` naming its URL before anything is spent.
* :func:`collect_file` admits a published kernel set (CUDA-L1's release format, or ``task``/``code``
  lines resolved against a suite) only after re-judging every record on this machine.
* Held-out tasks (:mod:`cudal1.train.heldout`: by level and problem id, or by their source under any name)
  stay out unless ``allow_held_out``: :func:`collect_teachers` refuses a suite holding one
  (:class:`~cudal1.train.heldout.HeldOutError`, before any request), :func:`collect_file` leaves
  their records out and counts them (``held_out_left_out``).
* Both write JSONL: one object per line with ``messages`` (system, user, assistant) and provenance
  — ``source`` (``teacher:URL=MODEL`` or ``file:PATH``), ``task``, ``task_hash``, ``status``,
  ``speedup``, ``speedup_ci``, ``flags``, ``candidate_hash``, ``config_hash`` (the judge's) and
  ``environment``.  ``datasets.load_dataset("json", data_files=...)`` loads it; ``cudal1 train
  sft --data`` trains on it.
* Resumable: everything (prompts, answers, verdicts) goes to a run store next to the output
  (``DATA.sqlite``); a re-run asks each teacher only for the attempts a task still lacks, re-uses
  recorded verdicts, and rewrites the JSONL from the store.  Failed requests (after the policy's
  retries) are not recorded, so a re-run retries them.

Not covered: deduplication across teachers of programs that differ only in whitespace (they are
different candidates to the judge).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cudal1.recorded import RecordedJudge
from cudal1.train.judging import RolloutJudge
from cudal1.types import EvalResult, Prompt, Status, Task

log = logging.getLogger(__name__)


class CollectError(ValueError):
    """Bad collect input: an unreachable teacher, a malformed teacher spec or input file."""


@dataclass(frozen=True)
class Teacher:
    url: str  # OpenAI-compatible base URL, e.g. http://localhost:8000/v1
    model: str  # model name at that endpoint

    @property
    def label(self) -> str:
        return f"teacher:{self.url}={self.model}"


def parse_teacher(spec: str) -> Teacher:
    """``URL=MODEL`` (split at the last ``=``) → :class:`Teacher`."""
    url, sep, model = spec.rpartition("=")
    if not sep or not url.startswith(("http://", "https://")) or not model:
        raise CollectError(f"--teacher {spec!r}: expected URL=MODEL, e.g. http://localhost:8000/v1=Qwen/Qwen2.5-Coder-32B-Instruct")
    return Teacher(url.rstrip("/"), model)


def check_reachable(teacher: Teacher, timeout: float = 10.0) -> None:
    """Raise :class:`CollectError` naming the URL when nothing answers there
    (:func:`cudal1.policy.openai_policy.check_endpoint`)."""
    from cudal1.policy.openai_policy import EndpointUnreachable, check_endpoint

    try:
        check_endpoint(teacher.url, timeout)
    except EndpointUnreachable as exc:
        raise CollectError(f"teacher {exc}") from None


def answer_prompt(task: Task, hardware: str) -> Prompt:
    from cudal1.prompts import build_prompt

    return build_prompt(task, [], hardware)


def verified(res: EvalResult | None) -> bool:
    """Admissible as training data: ok, and not on a degenerate task."""
    return res is not None and res.status is Status.OK and "degenerate_task" not in res.flags


def _record(row: dict[str, Any], task: Task, res: EvalResult, source: str) -> dict[str, Any]:
    import dataclasses

    prompt = row["prompt"]
    messages = [
        {"role": "system", "content": prompt.get("system", "")},
        {"role": "user", "content": prompt.get("user", "")},
        {"role": "assistant", "content": row["response"]},
    ]
    return {"messages": messages, "source": source, "task": task.task_id, "task_hash": task.hash,
            "status": res.status.value, "speedup": res.speedup,
            "speedup_ci": list(res.speedup_ci) if res.speedup_ci else None, "flags": list(res.flags),
            "candidate_hash": res.candidate_hash, "config_hash": res.config_hash,
            "environment": dataclasses.asdict(res.environment)}


def select_records(judge: RecordedJudge, tasks: list[Task], sources: list[str], per_task: int) -> list[dict]:
    """The kept records: per task, verified distinct programs from ``sources``, fastest first, ≤ ``per_task``."""
    records = []
    for task in tasks:
        best: dict[str, tuple[float, dict]] = {}
        for row in judge.responses(task):
            if row["policy"] not in sources or not row["candidate_hash"] or row["candidate_hash"] in best:
                continue
            res = judge.verdict_of(task.hash, row["candidate_hash"])
            if verified(res):
                best[row["candidate_hash"]] = (res.speedup or 0.0, _record(row, task, res, row["policy"]))  # type: ignore[arg-type]
        ranked = sorted(best.values(), key=lambda sr: -sr[0])
        records.extend(rec for _, rec in ranked[: per_task if per_task > 0 else None])
    return records


def write_jsonl(path: Path, records: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        for rec in records:
            f.write(json.dumps(rec, default=str) + "\n")
    tmp.replace(path)


def code_answer(code: str) -> str:
    """A published program as the assistant turn: its Code Implementation section alone (a release
    states no analysis; inventing one would teach the model to write filler)."""
    from cudal1.prompts.compose import fenced

    return f"### Code Implementation\n{fenced(code)}\n"


def store_path(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(out.stem + ".sqlite")


def _summary(records: list[dict], judged: Counter, out: Path, **extra: Any) -> dict[str, Any]:
    return {"out": str(out), "store": str(store_path(out)), "kept": len(records),
            "tasks_with_data": len({r["task_hash"] for r in records}), "judged": dict(judged)} | extra


def collect_teachers(
    tasks: list[Task], teachers: list[Teacher], attempts: int, per_task: int, out: str | Path,
    judge: RecordedJudge, *, policy_options: dict[str, Any] | None = None, allow_held_out: bool = False,
    kernelbench: str | Path | None = None,
) -> dict[str, Any]:
    """Sample, judge and keep (see the module docstring), judging through ``judge`` (its store is
    ``DATA.sqlite`` beside ``out`` unless it has one).  Returns a summary."""
    from cudal1.policy import PolicyConfig, make_policy
    from cudal1.train.heldout import HeldOut, HeldOutError, refuse

    if attempts < 1:
        raise CollectError("--attempts must be at least 1")
    if not allow_held_out:
        try:
            refuse(tasks, "collect", HeldOut.load(kernelbench))
        except HeldOutError as exc:
            raise CollectError(str(exc)) from None
    for teacher in teachers:
        check_reachable(teacher)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    judged: Counter[str] = Counter()
    errors = 0
    settings = {"teachers": [t.label for t in teachers], "attempts": attempts, "per_task": per_task,
                "judge": judge.config.to_dict()}
    with judge.store_at(store_path(out)), judge.run("collect", settings):
        prompts = {t.hash: answer_prompt(t, judge.hardware) for t in tasks}
        for teacher in teachers:
            rollouts = RolloutJudge(judge, teacher.label)
            need = {t.hash: attempts - sum(r["policy"] == teacher.label for r in judge.responses(t)) for t in tasks}
            todo = [t for t in tasks if need[t.hash] > 0]
            if not todo:
                continue
            cfg = PolicyConfig(**(policy_options or {})).replace(base_url=teacher.url, model=teacher.model)
            policy = make_policy("openai", config=cfg)
            try:
                for task in todo:  # one task at a time: a kill loses at most one task's answers
                    batch = policy.generate([prompts[task.hash]], need[task.hash])[0]
                    good = [c for c in batch if not c.error]
                    errors += len(batch) - len(good)
                    if len(good) < len(batch):
                        log.warning("teacher %s: %d request(s) failed for %s: %s", teacher.url, len(batch) - len(good),
                                    task.task_id, next(c.error for c in batch if c.error))
                    verdicts = rollouts.judge([(task, c.text) for c in good], prompts=[prompts[task.hash]] * len(good))
                    judged.update(o.kind for _, o in verdicts)
            finally:
                policy.close()
        records = select_records(judge, tasks, [t.label for t in teachers], per_task)
        write_jsonl(out, records)
    return _summary(records, judged, out, request_errors=errors)


def _release_reader():
    """(read_records, its error type): the reader of published sets that ``cudal1 verify`` uses."""
    from cudal1.releases import ReleaseError, read_records

    return read_records, ReleaseError


def collect_file(path: str | Path, tasks: list[Task] | None, per_task: int, out: str | Path, judge: RecordedJudge, *,
                 allow_held_out: bool = False, kernelbench: str | Path | None = None) -> dict[str, Any]:
    """Re-judge a published set and keep only what verifies here (see the module docstring),
    judging through ``judge`` (its store is ``DATA.sqlite`` beside ``out`` unless it has one)."""
    from cudal1.train.heldout import HeldOut

    read_records, bad_input = _release_reader()
    try:
        records = read_records(path, tasks)
    except bad_input as exc:
        raise CollectError(str(exc)) from None
    held_out = []
    if not allow_held_out:
        held = HeldOut.load(kernelbench)
        held_out = [r for r in records if r.task is not None and held.reason(r.task)]
        records = [r for r in records if not (r.task is not None and held.reason(r.task))]
        if held_out:
            log.warning("collect: %d record(s) of held-out tasks left out (e.g. %s); --allow-held-out admits them",
                        len(held_out), held.reason(held_out[0].task))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    source = f"file:{path}"
    judged: Counter[str] = Counter()
    settings = {"from": str(path), "per_task": per_task, "judge": judge.config.to_dict()}
    with judge.store_at(store_path(out)), judge.run("collect", settings):
        items = [(r.task, code_answer(r.code)) for r in records
                 if r.task is not None and r.code is not None]
        done = {(row["task_hash"], row["response"]) for row in judge.responses() if row["policy"] == source}
        todo = [(t, text) for t, text in items if (t.hash, text) not in done]
        if todo:
            verdicts = RolloutJudge(judge, source).judge(
                todo, prompts=[answer_prompt(t, judge.hardware) for t, _ in todo]
            )
            judged.update(o.kind for _, o in verdicts)
        task_list = list({t.hash: t for t, _ in items}.values())
        kept = select_records(judge, task_list, [source], per_task)
        write_jsonl(out, kept)
    return _summary(kept, judged, out, input_records=len(records) + len(held_out),
                    missing_code=len(records) - len(items), held_out_left_out=len(held_out))
