"""GRPO recipes for one 8-GPU node and the memory arithmetic behind them (pure; no torch).

Contract: :data:`RECIPES` names, for a 7B and a 32B open coder model, the packaged GRPO preset and
accelerate config a run uses and how the node's GPUs are split between training and vLLM;
:func:`memory` estimates what each GPU holds from the model's shape and the preset (the figures in
docs/training.md are its output: ``python -m cudal1.train.recipes``).  ``tests/test_train_configs.py``
loads every recipe through TRL's and accelerate's own config classes and checks the estimate fits.

The arithmetic, per training GPU (P parameters, N training processes, bf16 weights with fp32 Adam):
weights ``2P`` (divided by N under ZeRO-3), gradients ``2P`` (/N from ZeRO-2), optimizer ``12P``
(fp32 master copy plus Adam's two moments, /N from ZeRO-1), the frozen reference model ``2P``
when beta > 0 (/N under ZeRO-3), activations with gradient checkpointing (each layer's input
kept, ``layers x b x T x hidden x 2`` bytes for a micro-batch of b sequences of T tokens, plus the
fp32 logits of the completion, ``b x T_completion x vocab x 4``), and under colocated vLLM its
share of the GPU.  Per vLLM GPU: weights ``2P / tp``; the rest of its share is KV cache, at
``layers x 2 x kv_heads x head_dim x 2 / tp`` bytes per token.

Not covered: allocator fragmentation, CUDA context and NCCL buffers (a few GiB; the fit check
keeps :data:`HEADROOM_GIB` free for them), DeepSpeed's prefetch buckets, and anything measured:
these are estimates, not a run's peak (no 7B or 32B run has been made with cudal1).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30
H200_GIB = 139.0  # usable memory of one H200 as torch reports it (143771 MiB on nvidia-smi, less the context)
HEADROOM_GIB = 8.0  # left free for the CUDA context, NCCL and fragmentation


@dataclass(frozen=True)
class ModelShape:
    """What the arithmetic needs of a model (its config.json)."""

    name: str
    params: float  # parameters
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    vocab: int


# From the models' published config.json files (parameter counts from their model cards).
QWEN25_CODER_7B = ModelShape("Qwen/Qwen2.5-Coder-7B-Instruct", 7.62e9, 28, 3584, 4, 128, 152064)
QWEN25_CODER_32B = ModelShape("Qwen/Qwen2.5-Coder-32B-Instruct", 32.8e9, 64, 5120, 8, 128, 152064)


@dataclass(frozen=True)
class Recipe:
    """One node's setup: which preset and accelerate config, and where generation runs."""

    name: str
    model: ModelShape
    grpo_preset: str  # cudal1/train/configs/grpo-<preset>.yaml
    accelerate: str  # cudal1/train/configs/<accelerate>.yaml
    zero_stage: int
    training_gpus: int  # accelerate's num_processes
    vllm_gpus: int = 0  # server mode: GPUs of `trl vllm-serve` (its tensor-parallel size)
    vllm_server_share: float = 0.9  # server mode: vLLM's --gpu-memory-utilization
    prompt_tokens: int = 8192  # the contrastive prompt with two exemplars, at most (an assumption)


RECIPES: dict[str, Recipe] = {
    "7b-8gpu": Recipe("7b-8gpu", QWEN25_CODER_7B, "default", "accelerate-zero2", zero_stage=2, training_gpus=8),
    "32b-8gpu": Recipe("32b-8gpu", QWEN25_CODER_32B, "32b-8gpu", "accelerate-zero3-6proc", zero_stage=3, training_gpus=6,
                       vllm_gpus=2),
}


def memory(recipe: Recipe, cfg) -> dict[str, float]:
    """Estimated GiB per training GPU (by part, and ``total``) and, in server mode, per vLLM GPU
    (``vllm_weights``, ``kv_tokens`` it can hold, ``step_tokens`` one step needs).  ``cfg`` is
    the recipe's :class:`~cudal1.train.config.GRPOConfig`."""
    from cudal1.train.grpo import per_device_batch

    m, n, z = recipe.model, recipe.training_gpus, recipe.zero_stage
    b = per_device_batch(cfg, n)
    tokens = recipe.prompt_tokens + cfg.max_completion_length
    out = {
        "weights": 2 * m.params / (n if z >= 3 else 1),
        "gradients": 2 * m.params / (n if z >= 2 else 1),
        "optimizer": 12 * m.params / (n if z >= 1 else 1),
        "reference": (2 * m.params / (n if z >= 3 else 1)) if cfg.beta > 0 else 0.0,
        "activations": m.layers * b * tokens * m.hidden * 2 + b * cfg.max_completion_length * m.vocab * 4,
        "vllm": cfg.vllm_gpu_memory_utilization * H200_GIB * GIB if cfg.use_vllm and cfg.vllm_mode == "colocate" else 0.0,
    }
    gib = {k: v / GIB for k, v in out.items()}
    gib["total"] = sum(gib.values())
    gib["micro_batch"] = b
    kv_per_token = m.layers * 2 * m.kv_heads * m.head_dim * 2
    if recipe.vllm_gpus:
        tp = recipe.vllm_gpus
        weights = 2 * m.params / tp
        gib["vllm_weights"] = weights / GIB
        gib["kv_tokens"] = (recipe.vllm_server_share * H200_GIB * GIB - weights) / (kv_per_token / tp)
    elif cfg.use_vllm:
        tp = cfg.vllm_tensor_parallel_size
        gib["vllm_weights"] = 2 * m.params / tp / GIB
        gib["kv_tokens"] = (out["vllm"] - 2 * m.params / tp) / (kv_per_token / tp)
    gib["step_tokens"] = cfg.group_size * cfg.prompts_per_step * tokens
    return gib


def fits(recipe: Recipe, cfg) -> bool:
    """Whether the estimate leaves :data:`HEADROOM_GIB` free on a training GPU and vLLM can hold a
    step's sequences (per engine: the step's share of the engines)."""
    est = memory(recipe, cfg)
    engines = 1 if recipe.vllm_gpus else recipe.training_gpus // max(1, cfg.vllm_tensor_parallel_size)
    kv_ok = "kv_tokens" not in est or est["kv_tokens"] >= est["step_tokens"] / engines
    return est["total"] + HEADROOM_GIB <= H200_GIB and kv_ok


def table() -> str:
    """The estimates of every recipe, as docs/training.md quotes them."""
    from cudal1.train.config import load_config

    lines = []
    for recipe in RECIPES.values():
        cfg = load_config("grpo", recipe.grpo_preset)
        est = memory(recipe, cfg)
        parts = ", ".join(f"{k} {est[k]:.1f}" for k in ("weights", "gradients", "optimizer", "reference", "activations", "vllm"))
        line = (f"{recipe.name} ({recipe.model.name}, ZeRO-{recipe.zero_stage}, {recipe.training_gpus} training GPUs, "
                f"micro-batch {est['micro_batch']:.0f}): per training GPU {est['total']:.1f} GiB ({parts})")
        if "kv_tokens" in est:
            line += (f"; vLLM weights {est['vllm_weights']:.1f} GiB per GPU, KV cache for {est['kv_tokens'] / 1e3:.0f}k tokens "
                     f"per engine, a step needs {est['step_tokens'] / 1e3:.0f}k in all")
        lines.append(line + f"; fits: {fits(recipe, cfg)}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
