"""Before a GRPO run trains: does it fit the machine? (:mod:`.recipes`' arithmetic on this run.)

Contract: :func:`memory_shortfalls` reads the model's ``config.json`` (a local directory; a hub
name is not looked up), the engine from the trainer's arguments (``deepspeed`` in the ``trl:``
block, else what ``accelerate launch`` put in the environment: ZeRO stage, optimizer offload;
FSDP counts as ZeRO-3), the process count, this GPU's memory, the host's, and whether the judge
runs on the training GPUs (a local CUDA judge does; a Ray cluster's or a CPU judge does not), and
returns :func:`cudal1.train.recipes.shortfalls` for them: one sentence per thing that does not fit
— a training step, the judge's workers beside the held training state, the KV cache, the LoRA
merge's host memory.  The caller warns (rank 0) and records them in the run's summary; nothing is
refused: the arithmetic is an estimate.

Not covered: a ``config.json`` whose architecture the arithmetic does not know (no
``hidden_size``/``num_hidden_layers``...): nothing is checked then.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cudal1.config import EvalConfig
    from cudal1.harness import DevicePlan
    from cudal1.train.config import GRPOConfig


def _engine(args: Any) -> tuple[int, bool]:
    """(ZeRO stage, optimizer offloaded) of the trainer's arguments or of accelerate's environment."""
    ds = getattr(args, "deepspeed", None)
    if isinstance(ds, str) and Path(ds).is_file():
        ds = json.loads(Path(ds).read_text())
    if isinstance(ds, dict):
        zero = ds.get("zero_optimization") or {}
        offload = (zero.get("offload_optimizer") or {}).get("device", "none")
        return int(zero.get("stage") or 0), offload not in ("none", None)
    env = os.environ
    if env.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        return (int(env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "0") or 0),
                env.get("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "none") not in ("none", ""))
    if env.get("ACCELERATE_USE_FSDP", "").lower() == "true" or getattr(args, "fsdp", None):
        return 3, False
    return 0, False


def _host_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("inf")


def memory_shortfalls(model: str, cfg: GRPOConfig, args: Any, judge_config: EvalConfig, plan: DevicePlan | None,
                      processes: int) -> list[str]:
    """What does not fit for this run (see the module docstring)."""
    config_file = Path(model) / "config.json"
    if not config_file.is_file():
        return []
    config = json.loads(config_file.read_text())
    if not all(k in config for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")):
        return []
    import torch

    from cudal1.train.recipes import check_run

    cuda = torch.cuda.is_available()
    gpu_gib = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2**30 if cuda else None
    zero, offload = _engine(args)
    judge_here = cuda and judge_config.device in ("cuda", "auto") and (plan is None or plan.backend != "ray")
    return check_run(config, cfg, processes=processes, zero_stage=zero, optimizer_offload=offload, gpu_gib=gpu_gib,
                     host_gib=_host_gib(), judge_workers=max(1, int(getattr(judge_config, "workers_per_gpu", 1) or 1)),
                     judge_on_training_gpus=judge_here)


__all__ = ["memory_shortfalls"]
