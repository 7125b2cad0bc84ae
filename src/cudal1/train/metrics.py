"""Run records of every training stage: ``OUT/metrics.jsonl`` (``OUT/config.yaml`` is written as every
command writes it, :func:`cudal1.config.write_config_file`).

Contract: :func:`metrics_callback` returns a ``transformers.TrainerCallback`` that appends one
JSON object per logged step to ``OUT/metrics.jsonl`` with the stable keys ``step`` and ``loss``
(plus, for GRPO, ``reward_mean``, ``reward_std``, ``kl``, ``success_rate`` and ``judged`` — the
counts per outcome kind since the previous line — supplied by ``extra``), followed by
``stage``, ``lr`` and the trainer's raw log under ``trl``.  The file is appended to, never
rewritten: a resumed run continues it (lines logged after the checkpoint it resumes from appear
twice, with the same ``step``; readers keep the last).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable

# TRL/transformers log key -> our key
RENAMES = {"loss": "loss", "reward": "reward_mean", "reward_std": "reward_std", "kl": "kl", "learning_rate": "lr"}


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def metrics_record(logs: dict[str, Any], step: int, stage: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One metrics.jsonl line from a trainer log (pure; see the module docstring)."""
    rec: dict[str, Any] = {"step": int(step), "stage": stage, "loss": _clean(logs.get("loss"))}
    for src, dst in RENAMES.items():
        if src in logs and dst not in rec:
            rec[dst] = _clean(logs[src])
    rec.update(extra or {})
    rec["time"] = time.time()
    rec["trl"] = {k: _clean(v) for k, v in logs.items() if isinstance(v, (int, float, str))}
    return rec


def metrics_callback(out: str | Path, stage: str, extra: Callable[[int], dict[str, Any]] | None = None):
    """A TrainerCallback writing ``out/metrics.jsonl`` (needs ``transformers``).  ``extra(step)`` is
    called at every logged step on every rank (it may be a collective); rank 0 writes its keys."""
    from transformers import TrainerCallback

    path = Path(out) / "metrics.jsonl"

    class MetricsWriter(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            if "train_runtime" in logs or not ("loss" in logs or "reward" in logs):
                return
            more = (
                extra(int(state.global_step)) if extra else None
            )  # on every rank: ``extra`` may gather from all of them
            if not state.is_world_process_zero:
                return
            rec = metrics_record(logs, state.global_step, stage, more)
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as f:
                f.write(json.dumps(rec, default=str) + "\n")

    return MetricsWriter()


def read_metrics(out: str | Path) -> list[dict[str, Any]]:
    """metrics.jsonl as a list (later lines win for a repeated step)."""
    path = Path(out) / "metrics.jsonl"
    if not path.exists():
        return []
    by_step: dict[tuple[str, int], dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            by_step[(rec.get("stage", ""), rec["step"])] = rec
    return list(by_step.values())
