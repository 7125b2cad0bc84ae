"""GRPO recipes for one 8-GPU node and the memory arithmetic behind them (pure; no torch), and the
same arithmetic checked against the machine before a run trains (:func:`preflight`).

Contract: :data:`RECIPES` names, for a 7B and a 32B open coder model, the packaged GRPO preset and
accelerate config a run uses and how the node's GPUs are split between training and vLLM;
:func:`memory` estimates what each GPU holds from the model's shape and the preset (the figures in
docs/training.md are its output: ``python -m cudal1.train.recipes``).  ``tests/test_train_configs.py``
loads every recipe through TRL's and accelerate's own config classes and checks the estimate fits.

The arithmetic, per training GPU (P parameters, N training processes, bf16 weights with fp32 Adam):
weights ``2P`` (divided by N under ZeRO-3), gradients ``2P`` (/N from ZeRO-2), optimizer ``12P``
(fp32 master copy plus Adam's two moments, /N from ZeRO-1; on the host with optimizer offload),
the frozen reference model ``2P`` when beta > 0 (/N under ZeRO-3), activations with gradient
checkpointing (each layer's input kept, ``layers x b x T x hidden x 2`` bytes for a micro-batch of b
sequences of T tokens, plus the fp32 logits of the completion, ``b x T_completion x vocab x 4``),
and under colocated vLLM its share of the GPU.  With LoRA the base model is frozen (adapter
gradients and optimizer state are negligible) and TRL's reference is the base with the adapters
off: no second copy.  Per vLLM GPU: weights ``2P / tp``; the rest of its share is KV cache, at
``layers x 2 x kv_heads x head_dim x 2 / tp`` bytes per token.

**The judge** runs each rank's rollouts on the training GPUs between generation and the update:
then the GPU still holds the training state (weights, gradients, optimizer, reference) and the
colocated engine's share, unless TRL's ``vllm_enable_sleep_mode`` released it; the activations'
cached blocks are released before judging (:class:`~cudal1.train.stages.grpo.JudgeReward`).  A judge
worker needs the task's working set: up to :data:`JUDGE_WORKER_GIB` for KernelBench level 1 at
its current sizes (25-60 GiB measured on the H200).  A worker that runs out of memory gets an
``oom`` runtime error — a failure reward for a program that may be right.

**The LoRA merge** at the end of a LoRA run loads the base model on rank 0's host in its own dtype
(``2P`` bytes) and merges in place: host memory, no GPU (:data:`MERGE_OVERHEAD` for the save).

Not covered: allocator fragmentation, CUDA context and NCCL buffers (a few GiB; the fit check
keeps :data:`HEADROOM_GIB` free for them), DeepSpeed's prefetch buckets, the host memory of
optimizer offload beyond its ``12P``, and anything measured: these are estimates, not a run's
peak (no 7B or 32B run has been made with cudal1).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30
H200_GIB = 139.0  # usable memory of one H200 as torch reports it (143771 MiB on nvidia-smi, less the context)
HEADROOM_GIB = 8.0  # left free for the CUDA context, NCCL and fragmentation
JUDGE_WORKER_GIB = (
    60.0  # the most a judge worker held for a KernelBench level-1 task on the H200 (benchmarks/LOG.md, 2026-12-01)
)
NODE_HOST_GIB = 2048.0  # host memory of an 8-GPU node (an HGX H200 with 2 TiB)
MERGE_OVERHEAD = 1.1  # the LoRA merge's host peak over the base model's bytes (load, merge in place, save)


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


    @classmethod
    def from_config(cls, config: dict, name: str = "model") -> "ModelShape":
        """A decoder's shape from its ``config.json`` (LLaMA/Qwen2-style fields); parameters counted
        from them: embeddings, attention with grouped KV heads, a gated MLP, norms, the head."""
        h, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
        heads = config["num_attention_heads"]
        kv = config.get("num_key_value_heads") or heads
        hd = config.get("head_dim") or h // heads
        inter = config.get("intermediate_size") or 4 * h
        attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h + (heads + 2 * kv) * hd  # q, k, v (+ biases), o
        per_layer = attn + 3 * h * inter + 2 * h
        params = vocab * h * (1 if config.get("tie_word_embeddings") else 2) + layers * per_layer + h
        return cls(name, float(params), layers, h, kv, hd, vocab)


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
    optimizer_offload: bool = False  # DeepSpeed keeps the optimizer state on the host (offload_optimizer_device: cpu)
    gpu_gib: float = H200_GIB  # usable memory of each GPU
    host_gib: float = NODE_HOST_GIB  # host memory of the node
    judge_workers: int = 1  # judge workers per training GPU (--workers-per-gpu)


RECIPES: dict[str, Recipe] = {
    "7b-8gpu": Recipe("7b-8gpu", QWEN25_CODER_7B, "default", "accelerate-zero2", zero_stage=2, training_gpus=8),
    "32b-8gpu": Recipe(
        "32b-8gpu", QWEN25_CODER_32B, "32b-8gpu", "accelerate-zero3-6proc", zero_stage=3, training_gpus=6,
        vllm_gpus=2, optimizer_offload=True,
    ),
}


def memory(recipe: Recipe, cfg, judge_gib: float = JUDGE_WORKER_GIB) -> dict[str, float]:
    """Estimated GiB per training GPU (by part, and ``total``), while judging (``held_while_judging``,
    ``judge``: the workers' need, ``judge_total``), the LoRA merge's host need (``merge_host``), the
    optimizer's host share (``offload_host``, over the node) and, with vLLM, per engine GPU
    (``vllm_weights``, ``kv_tokens`` it can hold, ``step_tokens`` one step needs).  ``cfg`` is the
    recipe's :class:`~cudal1.train.config.GRPOConfig`."""
    from cudal1.train.stages.grpo import per_device_batch

    m, n, z = recipe.model, recipe.training_gpus, recipe.zero_stage
    b = per_device_batch(cfg, n)
    tokens = recipe.prompt_tokens + cfg.max_completion_length
    trained = 0.0 if cfg.lora else 1.0  # LoRA: the base is frozen; the adapters' state is negligible
    optimizer = 12 * m.params / (n if z >= 1 else 1) * trained
    out = {
        "weights": 2 * m.params / (n if z >= 3 else 1),
        "gradients": 2 * m.params / (n if z >= 2 else 1) * trained,
        "optimizer": 0.0 if recipe.optimizer_offload else optimizer,
        "reference": (2 * m.params / (n if z >= 3 else 1)) if cfg.beta > 0 and not cfg.lora else 0.0,
        "activations": m.layers * b * tokens * m.hidden * 2 + b * cfg.max_completion_length * m.vocab * 4,
        "vllm": cfg.vllm_gpu_memory_utilization * recipe.gpu_gib * GIB
        if cfg.use_vllm and cfg.vllm_mode == "colocate"
        else 0.0,
    }
    gib = {k: v / GIB for k, v in out.items()}
    gib["total"] = sum(gib.values())
    gib["micro_batch"] = b
    asleep = bool(cfg.trl.get("vllm_enable_sleep_mode"))
    gib["held_while_judging"] = gib["total"] - gib["activations"] - (gib["vllm"] if asleep else 0.0)
    gib["judge"] = recipe.judge_workers * judge_gib
    gib["judge_total"] = gib["held_while_judging"] + gib["judge"]
    gib["merge_host"] = 2 * m.params * MERGE_OVERHEAD / GIB if cfg.lora else 0.0
    gib["offload_host"] = optimizer * n / GIB if recipe.optimizer_offload else 0.0
    kv_per_token = m.layers * 2 * m.kv_heads * m.head_dim * 2
    if recipe.vllm_gpus:
        tp = recipe.vllm_gpus
        weights = 2 * m.params / tp
        gib["vllm_weights"] = weights / GIB
        gib["kv_tokens"] = (recipe.vllm_server_share * recipe.gpu_gib * GIB - weights) / (kv_per_token / tp)
    elif cfg.use_vllm and cfg.vllm_mode == "colocate":
        tp = cfg.vllm_tensor_parallel_size
        gib["vllm_weights"] = 2 * m.params / tp / GIB
        gib["kv_tokens"] = (out["vllm"] - 2 * m.params / tp) / (kv_per_token / tp)
    gib["step_tokens"] = cfg.group_size * cfg.prompts_per_step * tokens
    return gib


def shortfalls(recipe: Recipe, cfg, judge_gib: float = JUDGE_WORKER_GIB) -> list[str]:
    """What does not fit, one sentence each (empty: it fits): the training step, the judge beside
    the held training state, the engine's KV cache, the host (LoRA merge, optimizer offload)."""
    est = memory(recipe, cfg, judge_gib)
    room = recipe.gpu_gib - HEADROOM_GIB
    out = []
    if est["total"] > room:
        out.append(f"a training step needs {est['total']:.0f} GiB per GPU, {room:.0f} GiB usable")
    if est["judge_total"] > room:
        free = room - est["held_while_judging"]
        out.append(
            f"while judging, training holds {est['held_while_judging']:.0f} GiB per GPU, leaving {max(free, 0):.0f} "
            "GiB "
            f"for {recipe.judge_workers} judge worker(s) that need up to {est['judge']:.0f} GiB "
            "(vllm_enable_sleep_mode, optimizer offload or judging on other GPUs frees room)"
        )
    engines = 1 if recipe.vllm_gpus else recipe.training_gpus // max(1, cfg.vllm_tensor_parallel_size)
    if "kv_tokens" in est and est["kv_tokens"] < est["step_tokens"] / engines:
        out.append(f"a vLLM engine holds {max(est['kv_tokens'], 0) / 1e3:.0f}k tokens of KV cache, a step needs "
                   f"{est['step_tokens'] / engines / 1e3:.0f}k per engine")
    host = est["merge_host"] + est["offload_host"]
    if host > recipe.host_gib:
        out.append(f"the host needs {host:.0f} GiB (LoRA merge {est['merge_host']:.0f}, optimizer offload "
                   f"{est['offload_host']:.0f}), {recipe.host_gib:.0f} GiB there")
    return out


def fits(recipe: Recipe, cfg, judge_gib: float = JUDGE_WORKER_GIB) -> bool:
    """Whether nothing in :func:`shortfalls` is short."""
    return not shortfalls(recipe, cfg, judge_gib)


def check_run(config: dict, cfg, *, processes: int, zero_stage: int, optimizer_offload: bool, gpu_gib: float | None,
              host_gib: float, judge_workers: int, judge_on_training_gpus: bool) -> list[str]:
    """:func:`shortfalls` of a run about to train: the model's ``config.json`` (``config``), its
    :class:`~cudal1.train.config.GRPOConfig`, and the machine's facts (``gpu_gib`` None: no GPU, so
    only the host is checked)."""
    recipe = Recipe("this run", ModelShape.from_config(config), "", "", zero_stage, processes,
                    optimizer_offload=optimizer_offload, gpu_gib=gpu_gib or float("inf"), host_gib=host_gib,
                    judge_workers=judge_workers if judge_on_training_gpus else 0)
    return shortfalls(recipe, cfg)


def table() -> str:
    """The estimates of every recipe, as docs/training.md quotes them."""
    from cudal1.train.config import load_config

    lines = []
    for recipe in RECIPES.values():
        cfg = load_config("grpo", recipe.grpo_preset)
        est = memory(recipe, cfg)
        parts = ", ".join(
            f"{k} {est[k]:.1f}" for k in ("weights", "gradients", "optimizer", "reference", "activations", "vllm")
        )
        line = (
            f"{recipe.name} ({recipe.model.name}, ZeRO-{recipe.zero_stage}, {recipe.training_gpus} training GPUs, "
            f"micro-batch {est['micro_batch']:.0f}): per training GPU {est['total']:.1f} GiB ({parts}); while judging "
            f"{est['held_while_judging']:.1f} held + {est['judge']:.0f} judge = {est['judge_total']:.1f}"
        )
        if est["offload_host"]:
            line += f"; optimizer on the host {est['offload_host']:.0f} GiB"
        if "kv_tokens" in est:
            line += (
                f"; vLLM weights {est['vllm_weights']:.1f} GiB per GPU, KV cache for {est['kv_tokens'] / 1e3:.0f}k "
                "tokens "
                f"per engine, a step needs {est['step_tokens'] / 1e3:.0f}k in all"
            )
        lines.append(line + f"; fits: {fits(recipe, cfg)}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
