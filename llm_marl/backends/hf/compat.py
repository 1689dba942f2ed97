"""What differs between transformers versions, in one place: the cache keyword and activation checkpointing."""

from __future__ import annotations

import functools
import inspect
from typing import Any


@functools.cache
def cache_parameter(model_class: type) -> str:
    """The name under which ``model_class.forward`` takes its KV cache: ``cache`` or ``past_key_values``."""
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def cache_keyword(model, cache) -> dict[str, Any]:
    """``{name: cache}`` for a causal LM's forward: transformers 5.24 renamed ``past_key_values`` to
    ``cache`` (the old name warns, and goes in 5.40); earlier versions know only the old name."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {cache_parameter(type(base)): cache}


def enable_activation_checkpointing(model) -> None:
    """Recompute ``model``'s decoder-layer activations in the backward pass, without reentrant autograd.

    transformers 5 names this ``activation_checkpointing_enable`` (``gradient_checkpointing_enable``
    warns there); earlier versions know only the old name.
    """
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
