"""A tiny causal LM with a character-level tokenizer, built locally from a config.

Nothing is downloaded: the tokenizer is made with the ``tokenizers`` library over a fixed character set,
the model is a randomly initialised ``transformers`` Llama model, and both are written with
``save_pretrained`` so that any Hugging Face tool (``AutoModelForCausalLM.from_pretrained``, TRL, verl)
loads them from the directory. Tests and the built-in default use this instead of a hub model.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

# Every character a prompt or answer of the built-in tasks can contain, plus common math symbols.
CHARSET: str = string.digits + string.ascii_letters + " \n" + "+-*/=()?.,:;!'\"%<>^_{}[]\\$&|#@~`"
SPECIAL_TOKENS: dict[str, str] = {
    "pad_token": "<pad>",
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
}


def build_char_tokenizer(charset: str = CHARSET):
    """Character-level ``PreTrainedTokenizerFast``: one token per character, specials first (pad = 0).

    Decoding concatenates characters (``decoders.Fuse``), so ``decode(encode(s)) == s`` for any ``s``
    over ``charset``; characters outside it map to ``<unk>``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = list(SPECIAL_TOKENS.values())
    vocab = {tok: i for i, tok in enumerate(specials)}
    for ch in dict.fromkeys(charset):
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL_TOKENS["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL_TOKENS)
    fast.padding_side = "left"  # decoder-only generation pads on the left
    return fast


def tiny_config(
    vocab_size: int,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    max_positions: int = 512,
    **overrides,
):
    """A small Llama config for CPU tests.

    Llama rather than Qwen2: transformers 5 forces its own ``Qwen2Tokenizer`` pipeline onto any
    directory whose config says ``qwen2``, which would replace our character pre-tokenizer on load.
    """
    from transformers import LlamaConfig

    params: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 4,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    params.update(overrides)
    return LlamaConfig(**params)


def build_tiny_model(out_dir: str | Path, *, seed: int = 0, **config_overrides) -> Path:
    """Build a randomly initialised tiny model and its tokenizer into ``out_dir``; returns the path."""
    import torch
    from transformers import LlamaForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_char_tokenizer()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_config(len(tokenizer), **config_overrides))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
