"""A Qwen-style chat model built locally: byte-level BPE tokenizer, ChatML template, Qwen3 architecture.

This is the real-model path in miniature: the tokenizer is trained with the ``tokenizers`` library under
the same normalizer and pre-tokenizer as Qwen's (NFC, Qwen's split regex, byte-level), carries a ChatML
chat template, and saves as ``Qwen2Tokenizer``, the class Qwen3 checkpoints name; the model is
``transformers``' own ``Qwen3ForCausalLM`` (grouped-query attention, q/k RMSNorm) and its
``generation_config`` lists two EOS ids, ``<|im_end|>`` and ``<|endoftext|>``, as Qwen's models do.
Saved with ``save_pretrained``, the directory loads with ``AutoTokenizer`` / ``AutoModelForCausalLM`` and
reports ``qwen3``.

Why ``Qwen2Tokenizer``: transformers 5 loads a directory whose config says ``qwen2``/``qwen3`` through
``Qwen2Tokenizer``, which rebuilds the pipeline from the vocabulary and merges with Qwen's own
normalizer and pre-tokenizer. Training under exactly that pipeline makes the loaded tokenizer encode as
the trained one does, whichever class loads it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

PAD_TOKEN: str = "<|endoftext|>"
IM_START: str = "<|im_start|>"
IM_END: str = "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, IM_START, IM_END)  # ids 0, 1, 2

# ChatML as Qwen writes it: ``<|im_start|>role\ncontent<|im_end|>\n`` per message, no system message unless
# one is given, and ``<|im_start|>assistant\n`` as the generation prompt.
CHATML_TEMPLATE: str = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)

BYTE_ALPHABET_SIZE = 256


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int):
    """A byte-level BPE ``PreTrainedTokenizerFast`` (a ``Qwen2Tokenizer``) trained on ``texts``.

    Vocabulary: ``<|endoftext|>`` (pad, id 0), ``<|im_start|>`` (1), ``<|im_end|>`` (EOS, 2), the 256
    byte symbols, then merges learnt from ``texts`` up to ``vocab_size`` (fewer when the texts run out of
    pairs). Any text encodes (bytes are the fallback) and ``decode(encode(s)) == s`` for NFC text. The
    chat template is :data:`CHATML_TEMPLATE`. Padding is on the right, as Qwen's tokenizers save it (it is
    not written by ``save_pretrained``): ``ebpo.generation`` left-pads prompts itself.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    minimum = len(SPECIAL_TOKENS) + BYTE_ALPHABET_SIZE
    if vocab_size < minimum:
        raise ValueError(
            f"vocab_size={vocab_size} is below {minimum} (3 special tokens + 256 bytes); raise it"
        )
    # Qwen2Tokenizer's own normalizer and pre-tokenizer, so that training and loading split text alike.
    qwen_pipeline = Qwen2Tokenizer().backend_tokenizer
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = qwen_pipeline.normalizer
    bpe.pre_tokenizer = qwen_pipeline.pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer)
    model_json = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model_json["merges"]]
    # merges as pairs and no unknown token (bytes cover every text), as Qwen's tokenizer.json has them
    options: dict[str, Any] = dict(
        vocab=model_json["vocab"],
        merges=merges,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        unk_token=None,
        bos_token=None,
        extra_special_tokens=[IM_START],
    )
    tokenizer = Qwen2Tokenizer(**options)
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def qwen3_config(
    vocab_size: int,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_positions: int = 512,
    **overrides: Any,
):
    """A small ``Qwen3Config``: grouped-query attention (``num_kv_heads`` < ``num_heads``), q/k RMSNorm (part
    of Qwen3's attention), tied embeddings, ``head_dim = hidden_size / num_heads``; EOS ``<|im_end|>``."""
    from transformers import Qwen3Config

    params: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 3,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=SPECIAL_TOKENS.index(PAD_TOKEN),
        bos_token_id=None,
        eos_token_id=SPECIAL_TOKENS.index(IM_END),
    )
    params.update(overrides)
    return Qwen3Config(**params)


def new_qwen3_model(tokenizer, *, seed: int = 0, **config_overrides: Any):
    """A randomly initialised (seeded) ``Qwen3ForCausalLM`` sized to ``tokenizer``, whose generation config
    stops at either EOS id, ``[<|im_end|>, <|endoftext|>]``, and pads with ``<|endoftext|>``."""
    import torch
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(qwen3_config(len(tokenizer), **config_overrides))
    model.generation_config.eos_token_id = [tokenizer.convert_tokens_to_ids(IM_END), tokenizer.pad_token_id]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return model


def build_chat_model(
    out_dir: str | Path,
    texts: Iterable[str],
    *,
    vocab_size: int = 320,
    seed: int = 0,
    **config_overrides: Any,
) -> Path:
    """Train a tokenizer on ``texts``, build a random Qwen3 model for it, save both into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_bpe_tokenizer(texts, vocab_size)
    model = new_qwen3_model(tokenizer, seed=seed, **config_overrides)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
