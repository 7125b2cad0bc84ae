"""A tiny chat model built at run time, for ``--smoke`` runs and tests (no downloads, ever).

Contract: :func:`build_tiny_model` trains a byte-level BPE tokenizer on the given texts with the
``tokenizers`` library, gives it ChatML special tokens and a chat template with
``{% generation %}`` markers (so TRL's assistant-only loss works and the turn's end token is
trained), builds a randomly initialised :class:`transformers.Qwen2ForCausalLM` from a config
(two layers by default) and saves both with ``save_pretrained`` to ``out``.  The directory is a
normal transformers model directory: TRL loads it by path (its reference model for β > 0 too),
and ``cudal1 optimize --policy hf --model-path DIR`` samples it.

Not covered: anything about quality — the model is a few hundred thousand parameters and learns
only what it is shown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

# ChatML, as Qwen models use it; assistant content (and its end token) inside generation markers.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}{{- message['content'] + '<|im_end|>' }}{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _qwen2_regex() -> str:
    try:
        from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX
    except ImportError:  # older transformers load tokenizer.json as saved: GPT-2's split is fine
        return r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    return PRETOKENIZE_REGEX


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048, fixed: Iterable[str] = ()):
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``texts`` (pad ``<|endoftext|>``,
    eos ``<|im_end|>``, ChatML chat template).  Each string of ``fixed`` (e.g. the prompt
    template's constant sentences) becomes one added token, so fixed prose costs one position.
    The same texts give the same tokenizer in every process (no hash-seeded order)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    # Pre-tokenize exactly as transformers' Qwen2 tokenizer does: AutoTokenizer rebuilds a qwen2
    # model's tokenizer with that recipe (transformers >= 5), so training with anything else
    # would make the loaded tokenizer disagree with the trained one.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_qwen2_regex()), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(texts), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", unk_token=None)
    from tokenizers import AddedToken

    # longest first, ties by the string: the token ids must not follow the set's (hash-seeded) order,
    # or each process would build a different model from the same texts
    fast.add_tokens(
        [AddedToken(f, special=False, normalized=False) for f in sorted(set(fixed), key=lambda f: (-len(f), f)) if f]
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def build_tiny_model(
    out: str | Path, texts: Iterable[str], *, hidden: int = 64, layers: int = 2, heads: int = 4,
    vocab_size: int = 2048, max_positions: int = 8192, seed: int = 0, fixed: Iterable[str] = (),
) -> Path:
    """Train a tokenizer on ``texts`` (``fixed`` strings as single tokens), build a ``layers``-layer
    Qwen2 model, save both to ``out``."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out = Path(out)
    tokenizer = train_tokenizer(texts, vocab_size, fixed)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=max_positions,
        tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def common_lines(texts: Iterable[str], min_chars: int = 24) -> list[str]:
    """Lines of at least ``min_chars`` characters that occur in every one of ``texts`` (a prompt
    template's fixed sentences, when ``texts`` are prompts rendered from it)."""
    common: set[str] | None = None
    for text in texts:
        lines = {line for line in text.split("\n") if len(line) >= min_chars}
        common = lines if common is None else common & lines
    return sorted(common or ())
