"""`HFPerformanceOptions`: the HF policy's performance switches in one object, still accepted as keywords and
readable and settable as attributes."""
import pytest

from llm_marl.backends.hf import HFPerformanceOptions, HFPolicy
from llm_marl.backends.prompt_lookup import DRAFT_TOKENS
from llm_marl.models import tiny_model


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return tiny_model(seed=0)


def test_the_defaults_are_the_fast_settings():
    options = HFPerformanceOptions()
    assert (options.reuse_cache, options.splice_answers, options.grouped_lora, options.drop_finished_rows,
            options.input_major_weights) == (True, True, True, True, True)
    assert options.threads is None and options.cache_bytes == 2**30 and options.draft_tokens == DRAFT_TOKENS


def test_keywords_and_an_options_object_configure_the_same_policy(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    by_keyword = HFPolicy(model, tokenizer, reuse_cache=False, draft_tokens=2, cache_bytes=1000)
    by_options = HFPolicy(model, tokenizer, options=HFPerformanceOptions(reuse_cache=False, draft_tokens=2,
                                                                         cache_bytes=1000))
    assert by_keyword.options == by_options.options
    assert by_keyword.reuse_cache is False and by_keyword.draft_tokens == 2 and by_keyword.kv_cache.max_bytes == 1000
    mixed = HFPolicy(model, tokenizer, options=HFPerformanceOptions(grouped_lora=False), threads=1)
    assert mixed.grouped_lora is False and mixed.threads == 1           # a keyword changes the given options


def test_setting_an_attribute_updates_the_options_and_validates(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    given = HFPerformanceOptions()
    policy = HFPolicy(model, tokenizer, options=given)
    policy.reuse_cache = False
    policy.threads = 2
    assert policy.options.reuse_cache is False and policy.options.threads == 2
    assert given.reuse_cache is True                                    # the caller's object is left alone
    with pytest.raises(ValueError, match="threads must be >= 1"):
        policy.threads = 0
    with pytest.raises(ValueError, match="draft_tokens must be >= 0"):
        policy.draft_tokens = -1


def test_an_unknown_keyword_is_refused_with_the_known_ones(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    with pytest.raises(TypeError, match=r"unknown HFPolicy option\(s\) \['reuse_kv'\].*reuse_cache"):
        HFPolicy(model, tokenizer, reuse_kv=False)
