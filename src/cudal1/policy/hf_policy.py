"""``hf`` policy: sampling from a local transformers model directory (what training writes).

Contract: loads ``model_path`` (or ``model`` when that is a directory) with ``AutoTokenizer`` and
``AutoModelForCausalLM`` from local files only (never downloads); a peft adapter directory (a LoRA
run's ``checkpoint-N``: ``adapter_config.json``, no ``config.json``) is loaded onto the local base
model it names and merged.  It renders each prompt with the
tokenizer's chat template (``add_generation_prompt=True``), left-pads batches of ``batch_size``
prompts and samples ``n`` sequences per prompt with ``num_return_sequences``
(``temperature``/``top_p``; ``temperature == 0`` is greedy, so its ``n`` samples coincide) up to
``max_tokens`` new tokens.  ``seed`` seeds torch once at construction.  Recorded per completion:
``usage`` (the prompt's tokens and the tokens generated up to and including the first end token),
``latency_s`` (the whole batch's generation time) and ``meta["finish_reason"]`` (``stop`` or
``length``).  An exception in a batch (out of memory, ...) turns that batch's samples into error
completions; generation is serialised by a lock (one model, one device).

Not covered: tokenizers without a chat template get a plain ``role: content`` rendering (with a
warning); no tensor/data parallelism, quantisation or paged KV cache — serve big models with vLLM
and use the ``openai`` policy.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from cudal1.extras import require
from cudal1.policy.base import PolicyConfig, error_completion, resolve_config
from cudal1.types import Completion, Prompt

log = logging.getLogger(__name__)

_DTYPES = ("auto", "float32", "bfloat16", "float16")


class HFPolicy:
    """Local transformers generation (see the module docstring)."""

    name = "hf"

    def __init__(self, config: PolicyConfig | None = None, **options: Any) -> None:
        require("the hf policy", "transformers", extra="train")
        import torch
        import transformers

        self.config = cfg = resolve_config(config, options)
        path = cfg.model_path or cfg.model
        if not path or not Path(path).is_dir():
            raise ValueError(f"the hf policy needs model_path, a local model directory (got {path!r})")
        if cfg.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, not {cfg.dtype!r}")
        self._torch = torch
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
        self.model = Path(path).name
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        tokenizer.padding_side = "left"  # decoder-only models continue from the right edge
        if tokenizer.pad_token is None:
            if tokenizer.eos_token is None:
                raise ValueError(f"tokenizer in {path} has neither a pad nor an eos token")
            tokenizer.pad_token = tokenizer.eos_token
        dtype = self._dtype()
        dtype_kw = "dtype" if _version_at_least(transformers.__version__, 4, 56) else "torch_dtype"
        model = _load_model(transformers, path, {dtype_kw: dtype, "local_files_only": True})
        self._model = model.to(self.device).eval()
        self._tokenizer = tokenizer
        self._eos_ids = _eos_ids(tokenizer, model)
        self._lock = threading.Lock()
        self._warned_template = False
        if cfg.seed is not None:
            torch.manual_seed(cfg.seed)

    def generate(self, prompts: list[Prompt], n: int | None = None) -> list[list[Completion]]:
        """For each prompt, ``n`` sampled completions; a failing batch yields error completions."""
        n = self.config.n if n is None else n
        if n < 1:
            return [[] for _ in prompts]
        results: list[list[Completion]] = []
        size = self.config.batch_size
        with self._lock:
            for start in range(0, len(prompts), size):
                batch = prompts[start : start + size]
                try:
                    results.extend(self._generate_batch(batch, n))
                except Exception as exc:
                    log.exception("hf policy: generation failed for a batch of %d prompts", len(batch))
                    error = f"generation failed: {type(exc).__name__}: {str(exc)[:500]}"
                    results.extend([error_completion(self.name, error, self.model) for _ in range(n)] for _ in batch)
        return results

    def close(self) -> None:
        if getattr(self, "_model", None) is not None:
            self._model = None
            if self.device == "cuda":
                self._torch.cuda.empty_cache()

    # ---- internals ----------------------------------------------------------------------
    def _generate_batch(self, batch: list[Prompt], n: int) -> list[list[Completion]]:
        if self._model is None:
            raise RuntimeError("policy is closed")
        cfg, tok, torch = self.config, self._tokenizer, self._torch
        texts = [self._render(prompt) for prompt in batch]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        kwargs: dict[str, Any] = {
            "max_new_tokens": cfg.max_tokens,
            "num_return_sequences": n,
            "pad_token_id": tok.pad_token_id,
        }
        if cfg.temperature > 0:
            kwargs.update(do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p)
        else:
            kwargs.update(do_sample=False)
        start = time.monotonic()
        with torch.inference_mode():
            out = self._model.generate(**enc, **kwargs)
        latency = time.monotonic() - start
        width = enc["input_ids"].shape[1]
        prompt_tokens = enc["attention_mask"].sum(dim=1).tolist()
        results: list[list[Completion]] = []
        for i in range(len(batch)):  # generate() groups the n sequences of each input together
            row_completions = []
            for j in range(n):
                ids = out[i * n + j, width:].tolist()
                length, finish = _generated_length(ids, self._eos_ids)
                text = tok.decode(ids[:length], skip_special_tokens=True)
                usage = {"prompt_tokens": int(prompt_tokens[i]), "completion_tokens": length}
                meta = {"finish_reason": finish, "batch_size": len(batch)}
                row_completions.append(
                    Completion(text=text, policy=self.name, model=self.model, usage=usage, latency_s=latency, meta=meta)
                )
            results.append(row_completions)
        return results

    def _render(self, prompt: Prompt) -> str:
        tok = self._tokenizer
        if getattr(tok, "chat_template", None):
            return tok.apply_chat_template(prompt.messages(), tokenize=False, add_generation_prompt=True)
        if not self._warned_template:
            self._warned_template = True
            log.warning("hf policy: tokenizer has no chat template; using a plain 'role: content' rendering")
        lines = [f"{m['role']}: {m['content']}" for m in prompt.messages()]
        return "\n\n".join(lines) + "\n\nassistant: "

    def _dtype(self) -> Any:
        torch, name = self._torch, self.config.dtype
        if name == "auto":
            if self.device == "cuda" and torch.cuda.is_bf16_supported():
                return torch.bfloat16
            return torch.float32
        return getattr(torch, name)


def _load_model(transformers: Any, path: str, kwargs: dict[str, Any]) -> Any:
    """The causal LM in ``path``; a peft adapter directory is applied to its base and merged."""
    adapter = (Path(path) / "adapter_config.json").is_file() and not (Path(path) / "config.json").is_file()
    if not adapter:
        return transformers.AutoModelForCausalLM.from_pretrained(path, **kwargs)
    require("loading a LoRA adapter checkpoint", "peft", extra="train")
    from peft import AutoPeftModelForCausalLM

    return AutoPeftModelForCausalLM.from_pretrained(path, **kwargs).merge_and_unload()


def _eos_ids(tokenizer: Any, model: Any) -> set[int]:
    ids: set[int] = set()
    for value in (tokenizer.eos_token_id, getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


def _generated_length(ids: list[int], eos_ids: set[int]) -> tuple[int, str]:
    """Tokens generated up to and including the first end token, and why generation stopped."""
    for index, token in enumerate(ids):
        if token in eos_ids:
            return index + 1, "stop"
    return len(ids), "length"


def _version_at_least(version: str, major: int, minor: int) -> bool:
    try:
        parts = [int(p) for p in version.split(".")[:2]]
    except ValueError:
        return True
    return tuple(parts) >= (major, minor)
