"""A tiny Qwen3 chat model for tests: byte-level BPE tokenizer with the ChatML template, two EOS ids.

Built by ``ebpo.models.chat_tokenizer`` from arith prompts and answers (so its merges are those of the text
the tests feed it); random weights. ``tests/conftest.py`` builds it once per session (``chat_model_dir``).
"""

from __future__ import annotations

from pathlib import Path

from ebpo.models.chat_tokenizer import build_chat_model
from ebpo.tasks import get_task


def chat_texts(n: int = 200) -> list[str]:
    """Prompts and answers of ``n`` arith training problems: the tokenizer's training text."""
    records = get_task("arith").generate("train", n, seed=0)
    return [r.prompt for r in records] + [f"Answer: {r.answer}" for r in records]


def build_test_chat_model(out_dir: Path) -> Path:
    """320-token vocabulary, d 32, 2 layers, 4 query heads over 2 key/value heads: built in about a second."""
    return build_chat_model(out_dir, chat_texts(), vocab_size=320, seed=0, hidden_size=32, num_layers=2)
