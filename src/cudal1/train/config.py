"""Training configuration on cudal1's config base (:class:`cudal1.config.Config`): frozen
dataclasses, YAML presets, strict keys (no torch, no TRL).

Contract: :func:`stage_config` builds a stage's config from its section of a settings file, then
applies overrides (CLI flags; ``None`` = not given; dotted keys reach nested fields);
:func:`load_config` reads that section from a packaged preset (``configs/<kind>-<name>.yaml``,
e.g. ``grpo-smoke``) or a YAML file — a plain mapping of the stage's fields, or a run's own
``OUT/config.yaml`` (so a saved file reproduces the run) — through the reader every command uses
(:func:`cudal1.config.read_config_file`).  Unknown keys, at any nesting level, raise
:class:`~cudal1.config.ConfigError`; so do bad values.  ``cudal1 train`` writes the resolved stage
config as one more section of ``OUT/config.yaml`` (:func:`cudal1.config.write_config_file`), beside
the judge's :class:`~cudal1.config.EvalConfig`.

What each stage reads:

* :class:`SFTConfig` — ``cudal1 train sft`` and every fine-tuning round of ``train ssl``;
* :class:`SSLConfig` — ``cudal1 train ssl`` (rounds of generate → judge → keep successes → SFT);
* :class:`GRPOConfig` — ``cudal1 train grpo`` (TRL's GRPOTrainer; reward shaping in ``reward``).

Field comments are the help text.  Names mirror TRL/transformers where one exists, so a reader
can map them one to one (``group_size`` → ``num_generations``, ``beta`` → ``beta`` ...).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from cudal1.config import SAMPLING_TEMPERATURE, Config, ConfigError, read_config_file
from cudal1.train.reward import RewardConfig


@dataclass(frozen=True)
class LoraConfig(Config):
    """LoRA adapters through peft (used when ``lora`` is on)."""

    SECTION = "lora_config"

    r: int = 16  # adapter rank
    alpha: int = 32  # scaling numerator (lora_alpha)
    dropout: float = 0.05  # dropout on the adapter input
    target_modules: str = "all-linear"  # peft target_modules: "all-linear" or comma-separated module names


@dataclass(frozen=True)
class SFTConfig(Config):
    """Supervised fine-tuning with TRL's SFTTrainer (loss on assistant turns only)."""

    SECTION = "sft"

    learning_rate: float = 1e-5  # peak learning rate (cosine schedule after warmup)
    epochs: float = 2.0  # passes over the data
    max_steps: int = -1  # >0: stop after this many optimizer steps (overrides epochs)
    batch_size: int = 1  # sequences per device per step
    gradient_accumulation_steps: int = 8  # steps accumulated per optimizer update
    max_length: int = 8192  # tokens per sequence (longer ones are truncated)
    warmup_ratio: float = 0.03  # share of steps spent warming the learning rate up
    weight_decay: float = 0.0
    lora: bool = False  # train LoRA adapters instead of all weights
    lora_config: LoraConfig = field(default_factory=LoraConfig)
    bf16: bool = True  # bfloat16 mixed precision (ignored on CPU)
    gradient_checkpointing: bool = True  # trade compute for memory on long sequences
    logging_steps: int = 1  # write metrics every N optimizer steps
    save_steps: int = 200  # checkpoint every N optimizer steps
    save_total_limit: int = 3  # keep at most this many checkpoints
    seed: int = 0
    trl: dict[str, Any] = field(
        default_factory=dict
    )  # any other trl.SFTConfig field, passed through (checked by TRL's class)

    def validate(self) -> None:
        _positive(self, "learning_rate", "batch_size", "gradient_accumulation_steps", "max_length", "logging_steps",
                  "save_steps")
        if self.epochs <= 0 and self.max_steps <= 0:
            raise ConfigError("sft: give epochs > 0 or max_steps > 0")
        _mapping(self, "trl")


@dataclass(frozen=True)
class SSLConfig(Config):
    """Self-supervised rounds (CUDA-L1 stage 2): generate, judge, keep the successes, fine-tune."""

    SECTION = "ssl"

    rounds: int = 3  # generate → judge → fine-tune cycles
    samples: int = 8  # programs generated per task per round
    temperature: float = SAMPLING_TEMPERATURE  # sampling temperature
    top_p: float = 0.95
    max_new_tokens: int = 4096  # completion token limit
    batch_size: int = 8  # prompts per generation batch (transformers backend)
    max_keep_per_task: int = 0  # successes kept per task per round (0: all; duplicates always dropped)
    backend: str = "auto"  # auto (vLLM when installed, else transformers) | vllm | transformers
    vllm_tensor_parallel_size: int = 0
    vllm_gpu_memory_utilization: float = (
        0.9  # share of each engine GPU vLLM may take while generating (freed before the SFT)
    )
    vllm_max_model_length: int | None = None  # vLLM context length (prompt + completion); None: the model's own
    sft: SFTConfig = field(default_factory=SFTConfig)  # the fine-tuning of each round

    def validate(self) -> None:
        _positive(self, "rounds", "samples", "max_new_tokens", "batch_size")
        if self.backend not in ("auto", "vllm", "transformers"):
            raise ConfigError(f"ssl backend must be auto, vllm or transformers, not {self.backend!r}")
        _vllm_fields(self, allow_auto_tp=True)


@dataclass(frozen=True)
class GRPOConfig(Config):
    """Contrastive GRPO (CUDA-L1 stage 3) with TRL's GRPOTrainer and the judge as the reward."""

    SECTION = "grpo"

    group_size: int = 8  # completions per prompt (TRL num_generations); advantages are group-relative
    prompts_per_step: int = 4  # distinct prompts per optimizer step (all devices together)
    max_steps: int = 500  # optimizer steps
    learning_rate: float = 1e-6  # peak learning rate
    beta: float = 0.04  # KL coefficient against the reference model (0: no reference model is loaded)
    epsilon: float = 0.2  # PPO-style clipping of the probability ratio
    num_iterations: int = 1  # optimisation passes per generated batch (TRL mu)
    loss_type: str = "dapo"  # TRL loss aggregation: grpo | dr_grpo | dapo | bnpo ...
    scale_rewards: str = "group"  # TRL advantage scaling: group | batch | none
    temperature: float = SAMPLING_TEMPERATURE  # sampling temperature of the rollouts
    top_p: float = 1.0
    max_completion_length: int = 4096  # tokens per rollout
    gradient_accumulation_steps: int = 1
    exemplars: int = 2  # measured exemplars per contrastive prompt (drawn from the run store)
    strategy: str = "contrastive"  # exemplar selection: contrastive | random | best
    tau: float = 1.0  # exemplar selection: softmax temperature over speedup buckets (not the sampling temperature)
    feedback: bool = False  # also show one failed attempt with the judge's message
    reward: RewardConfig = field(default_factory=RewardConfig)
    use_vllm: bool = False  # generate with vLLM (TRL colocate or server mode)
    vllm_mode: str = (
        "colocate"  # colocate: an engine inside the training processes | server: `trl vllm-serve` on its own GPUs
    )
    vllm_gpu_memory_utilization: float = 0.3  # colocate: share of each GPU vLLM may take (weights + KV cache)
    vllm_tensor_parallel_size: int = 1  # colocate: GPUs (training ranks) per engine; must divide the process count
    vllm_max_model_length: int | None = (
        None  # colocate: vLLM context length (prompt + completion); None: the model's own
    )
    vllm_server_base_url: str | None = None  # server: where `trl vllm-serve` listens; None: TRL's http://0.0.0.0:8000
    lora: bool = False  # train LoRA adapters instead of all weights
    lora_config: LoraConfig = field(default_factory=LoraConfig)
    bf16: bool = True  # bfloat16 (ignored on CPU)
    gradient_checkpointing: bool = True
    logging_steps: int = 1
    save_steps: int = 50
    save_total_limit: int = 3
    seed: int = 0
    eval_every: int = 0  # evaluate on the eval tasks (train grpo --eval-split) every N steps; 0: never
    eval_samples: int = 8  # samples per eval task, one-shot (the k of pass@k and best-of-k)
    collapse_share: float = 0.9
    collapse_steps: int = (
        3  # that many collapsed steps in a row: the run reports a collapse and the step it began; 0: off
    )
    collapse_stop: bool = False  # end training when a collapse is reported (the final save still runs)
    trl: dict[str, Any] = field(
        default_factory=dict
    )  # any other trl.GRPOConfig field, passed through (checked by TRL's class)

    def validate(self) -> None:
        _positive(self, "group_size", "prompts_per_step", "max_steps", "learning_rate", "max_completion_length",
                  "gradient_accumulation_steps", "num_iterations", "logging_steps", "save_steps", "eval_samples")
        _mapping(self, "trl")
        _vllm_fields(self)
        if self.eval_every < 0:
            raise ConfigError("grpo: eval_every must be >= 0 (0: no evaluation during training)")
        if not 0 < self.collapse_share <= 1 or self.collapse_steps < 0:
            raise ConfigError("grpo: collapse_share must be in (0, 1] and collapse_steps >= 0 (0: no collapse watch)")
        if self.group_size < 2:
            raise ConfigError("grpo: group_size must be at least 2 (advantages are relative to the group)")
        if self.beta < 0:
            raise ConfigError("grpo: beta must be >= 0")
        if self.strategy not in ("contrastive", "random", "best"):
            raise ConfigError(f"grpo: unknown exemplar strategy {self.strategy!r}")
        if self.vllm_mode not in ("colocate", "server"):
            raise ConfigError(f"grpo: vllm_mode must be colocate or server, not {self.vllm_mode!r}")
        if self.scale_rewards not in ("group", "batch", "none"):
            raise ConfigError(f"grpo: scale_rewards must be group, batch or none, not {self.scale_rewards!r}")


KINDS: dict[str, type] = {"sft": SFTConfig, "ssl": SSLConfig, "grpo": GRPOConfig}


def _mapping(obj: Any, name: str) -> None:
    value = getattr(obj, name)
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ConfigError(f"{type(obj).__name__}.{name} must be a mapping of field names to values")


def _vllm_fields(obj: Any, allow_auto_tp: bool = False) -> None:
    tp, share, length = obj.vllm_tensor_parallel_size, obj.vllm_gpu_memory_utilization, obj.vllm_max_model_length
    if tp < (0 if allow_auto_tp else 1):
        raise ConfigError(
            f"{type(obj).__name__}.vllm_tensor_parallel_size must be {'>= 0' if allow_auto_tp else '>= 1'}"
        )
    if not 0 < share <= 1:
        raise ConfigError(f"{type(obj).__name__}.vllm_gpu_memory_utilization must be in (0, 1]")
    if length is not None and length < 1:
        raise ConfigError(f"{type(obj).__name__}.vllm_max_model_length must be positive (or null)")


def _positive(obj: Any, *names: str) -> None:
    for name in names:
        if not getattr(obj, name) > 0:
            raise ConfigError(f"{type(obj).__name__}.{name} must be positive")


def presets(kind: str) -> list[str]:
    """Names of the packaged presets for ``kind`` (``sft``, ``ssl``, ``grpo``)."""
    root = resources.files("cudal1.train") / "configs"
    prefix = f"{kind}-"
    return sorted(
        e.name[len(prefix) : -5] for e in root.iterdir() if e.name.startswith(prefix) and e.name.endswith(".yaml")
    )


def config_file(kind: str, source: str | os.PathLike[str]) -> Path:
    """The file ``source`` names: a path, or a packaged preset (``configs/<kind>-<source>.yaml``);
    ConfigError naming the known presets when it is neither."""
    path = Path(source)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return path
    ref = resources.files("cudal1.train") / "configs" / f"{kind}-{source}.yaml"
    if not ref.is_file():
        raise ConfigError(f"unknown {kind} preset {str(source)!r}; known: {', '.join(presets(kind))}")
    return Path(str(ref))


def stage_config(
    kind: str, section: Mapping[str, Any] | None = None, overrides: dict[str, Any] | None = None
) -> Config:
    """The ``kind`` config from its section of a settings file (``None``: the defaults) with
    ``overrides`` (``None`` values ignored; dotted keys reach nested fields, e.g. ``{"reward.clip": 2.0}``)."""
    if kind not in KINDS:
        raise ConfigError(f"unknown config kind {kind!r}; known: {', '.join(KINDS)}")
    return KINDS[kind].from_dict(section or {}, kind).replace(**(overrides or {}))


def load_config(
    kind: str, source: str | os.PathLike[str] | None = None, overrides: dict[str, Any] | None = None
) -> Any:
    """The ``kind`` config from ``source`` — a YAML path (a plain mapping of the stage's fields, or a
    run's ``OUT/config.yaml``, whose ``kind`` section is read) or a preset name such as ``smoke`` or
    ``default`` — with ``overrides`` (see :func:`stage_config`).  Files are read by
    :func:`cudal1.config.read_config_file`, as every command's ``--config`` is."""
    section = None
    if source is not None and str(source):
        section = read_config_file(config_file(kind, source), ("judge", kind), flat=kind).get(kind)
    return stage_config(kind, section, overrides)
