"""The local Qwen-style chat model: BPE tokenizer, ChatML template, Qwen3 architecture, two EOS ids."""

from __future__ import annotations

import json

import pytest

from ebpo.models.chat_tokenizer import CHATML_TEMPLATE, IM_END, IM_START, PAD_TOKEN, train_bpe_tokenizer

SAMPLES = [
    "What is 12 + 30? Answer: 42",
    "  two  spaces, a tab\tand\n\nnew lines  ",
    "don't we'll café 中文 ½",
    f"{IM_START}user\nHi{IM_END}\n{IM_START}assistant\n",
]


def test_chatml_renders_as_qwen_writes_it():
    tokenizer = train_bpe_tokenizer(["Hi there"], vocab_size=270)
    user = [{"role": "user", "content": "Hi"}]
    assert tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tokenizer.apply_chat_template(user, tokenize=False) == "<|im_start|>user\nHi<|im_end|>\n"
    with_system = [{"role": "system", "content": "Be brief."}, *user]
    assert tokenizer.apply_chat_template(with_system, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_vocabulary_specials_bytes_then_merges():
    tokenizer = train_bpe_tokenizer(["aaaa bbbb aaaa bbbb"] * 5, vocab_size=300)
    vocab = tokenizer.get_vocab()
    assert [vocab[t] for t in (PAD_TOKEN, IM_START, IM_END)] == [0, 1, 2]
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token) == (0, 2, None)
    # 3 specials + 256 bytes, then one id per learnt merge (fewer than asked: the text has few pairs)
    merges = len(vocab) - 259
    assert 0 < merges < 300 - 259
    assert tokenizer.convert_tokens_to_ids(tokenizer.tokenize("aaaa")) == [vocab["aaaa"]]
    # a special token in text is one id, never split into bytes
    assert tokenizer(f"x{IM_END}")["input_ids"][-1] == 2
    with pytest.raises(ValueError, match="vocab_size=258 is below 259"):
        train_bpe_tokenizer(["x"], vocab_size=258)


def test_decode_inverts_encode_and_skips_specials():
    tokenizer = train_bpe_tokenizer(SAMPLES, vocab_size=300)
    for text in SAMPLES:
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.decode(ids) == text
    ids = tokenizer(SAMPLES[-1])["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\nHi\nassistant\n"


def test_saved_model_loads_with_auto_classes_unchanged(chat_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from helpers.chat_model import chat_texts

    built = train_bpe_tokenizer(chat_texts(), vocab_size=320)  # what the fixture saved
    loaded = AutoTokenizer.from_pretrained(chat_model_dir)
    assert type(loaded).__name__ == "Qwen2Tokenizer"  # the class Qwen3 checkpoints name
    assert json.loads(loaded.backend_tokenizer.to_str()) == json.loads(built.backend_tokenizer.to_str())
    assert loaded.chat_template == CHATML_TEMPLATE
    assert (loaded.eos_token, loaded.pad_token, loaded.bos_token) == (IM_END, PAD_TOKEN, None)
    assert loaded.padding_side == built.padding_side == "right"
    for text in SAMPLES + chat_texts(5):
        assert loaded(text)["input_ids"] == built(text)["input_ids"]

    model = AutoModelForCausalLM.from_pretrained(chat_model_dir)
    assert model.config.model_type == "qwen3"
    assert model.config.vocab_size == len(loaded)
    attention = model.model.layers[0].self_attn
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # grouped-query attention
    assert attention.q_norm is not None and attention.k_norm is not None
    generation = GenerationConfig.from_pretrained(chat_model_dir)
    assert generation.eos_token_id == [loaded.convert_tokens_to_ids(IM_END), loaded.pad_token_id] == [2, 0]
    assert generation.pad_token_id == 0
