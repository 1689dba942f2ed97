"""Inference backends of the :class:`~llm_marl.policy.Policy` protocol, and :func:`load_policy`.

* ``hf`` — :class:`~llm_marl.backends.hf.HFPolicy`: transformers, LoRA adapters, log-probs (training).
* ``llamacpp`` — :class:`~llm_marl.backends.llamacpp.LlamaCppPolicy`: llama.cpp on a GGUF file,
  batched decoding (the default for the embedded SmolLM2-135M).
* ``openai`` — :class:`~llm_marl.backends.openai_compat.OpenAIPolicy`: any OpenAI-compatible server.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from ..hardware import buffer_choice
from ..models import GGUF_WEIGHT_TYPES, gguf_path, gguf_weights, load
from ..native_probe import PROBE_ENV, probe_llamacpp
from ..policy import Policy
from .base import CountedGeneration, InferenceBackend, SeedSource
from .hf import HFPolicy
from .llamacpp import LlamaCppPolicy
from .openai_compat import OpenAIPolicy, ServerUnreachableError

BACKENDS = ("hf", "llamacpp", "openai")
logger = logging.getLogger("llm_marl")


def load_policy(backend: str, model: str, base_url: str | None = None, *, seed: int | None = 0,
                **kwargs: Any) -> Policy:
    """A ready policy: ``backend`` in ``"hf" | "llamacpp" | "openai"``, ``model`` a name, path or served id.

    ``llamacpp`` accepts a ``.gguf`` path or a model name that :func:`llm_marl.models.gguf_path`
    knows (e.g. ``"smollm2-135m"``). It is first probed in a child process
    (:func:`~llm_marl.native_probe.probe_llamacpp`) with the buffer setting it will run with; if the
    probe crashes, the model is loaded with the ``hf`` backend instead (llama.cpp-only options
    dropped) and one warning names the cause. ``hf`` loads through :func:`llm_marl.models.load`;
    ``openai`` needs ``base_url``. ``llamacpp`` also takes ``weights=`` (:func:`llamacpp_weights`: an
    embedded model runs as F16 by default). Extra keyword arguments go to the backend's constructor.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {list(BACKENDS)}")
    if backend == "openai":
        if not base_url:
            raise ValueError("the 'openai' backend needs base_url (e.g. --base-url http://127.0.0.1:8000/v1)")
        return OpenAIPolicy(base_url, model, seed=seed, **kwargs)
    if base_url:
        raise ValueError(f"base_url is only used by the 'openai' backend, got base_url={base_url!r} with {backend!r}")
    if backend == "llamacpp":
        path = llamacpp_weights(model, kwargs.pop("weights", None))
        buffers = buffer_choice(kwargs.pop("use_extra_bufts", None))      # probe what will run
        verdict = probe_llamacpp(path, buffers)
        if not verdict.ok:
            logger.warning("llama.cpp failed on this CPU: %s; using the 'hf' backend for %s instead (set "
                           "LLM_MARL_LLAMACPP_EXTRA_BUFFERS=on/off to change llama.cpp's weight buffers, %s=off to "
                           "skip this probe; verdict %s cached in $LLM_MARL_CACHE/probes)",
                           verdict.cause, model, PROBE_ENV, verdict.key)
            return _load_hf_policy(model, seed=seed)     # an embedded name or the .gguf path itself
        return LlamaCppPolicy(path, seed=seed, name=model, use_extra_bufts=buffers.use_extra_bufts, **kwargs)
    return _load_hf_policy(model, seed=seed, **kwargs)


EMBEDDED_LLAMACPP_WEIGHTS = "f16"   # benchmarks/weight_types.py: 1.74x the shipped Q4_1's episodes/s on AVX2


def llamacpp_weights(model: str, weights: str | None = None) -> Path:
    """The GGUF file llama.cpp runs for ``model`` (an embedded name or a ``.gguf`` path).

    ``weights``: ``"shipped"`` (the file as it is), or ``"f16"``, ``"q8_0"``, ``"f32"`` (converted once by
    :func:`llm_marl.models.gguf_weights`). Default: ``f16`` for an embedded model, whose shipped Q4_1 has no
    batched matrix kernel on AVX2; a ``.gguf`` path as given.
    """
    if weights is None:
        weights = "shipped" if str(model).endswith(".gguf") else EMBEDDED_LLAMACPP_WEIGHTS
    if weights == "shipped":
        return Path(model) if str(model).endswith(".gguf") else gguf_path(model)
    if weights not in GGUF_WEIGHT_TYPES:
        raise ValueError(
            f"unknown llama.cpp weights {weights!r}; choose 'shipped' or one of {sorted(GGUF_WEIGHT_TYPES)}"
        )
    if str(model).endswith(".gguf") and not Path(model).is_file():
        raise ValueError(f"GGUF file {str(model)!r} does not exist; pass the path of a .gguf model file")
    return gguf_weights(model, weights)


def _load_hf_policy(model: str, *, seed: int | None, **kwargs: Any) -> Policy:
    """The transformers backend: :func:`llm_marl.models.load` + ``HFPolicy``."""
    if seed is not None:
        torch.manual_seed(seed)
    loaded_model, tokenizer = load(model)
    return HFPolicy(loaded_model, tokenizer, name=model, **kwargs)


__all__ = ["BACKENDS", "CountedGeneration", "HFPolicy", "InferenceBackend", "LlamaCppPolicy", "OpenAIPolicy",
           "SeedSource", "ServerUnreachableError", "llamacpp_weights", "load_policy"]
