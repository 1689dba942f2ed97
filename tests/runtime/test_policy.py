"""HFPolicy's decode loop: shared-prompt prefill, mixed-adapter batches, log-probs that match a re-scoring."""
import pytest
import torch

from llm_marl.backends.hf import HFPolicy
from llm_marl.models import tiny_model
from llm_marl.policy import SamplingParams
from llm_marl.team import Team

CONVERSATIONS = [[{"role": "user", "content": "say 3"}], [{"role": "user", "content": "write a longer line, please"}]]


@pytest.fixture()
def team(one_torch_thread):
    torch.manual_seed(0)
    model, tokenizer = tiny_model(seed=0)
    team = Team.adapter_per_agent(model, tokenizer, 2)
    with torch.no_grad():                      # make agent_1's adapter differ from the base (LoRA B starts at 0)
        for name, param in team.policy("agent_0").model.named_parameters():
            if ".agent_1." in name and "lora_B" in name:
                param.normal_(0, 0.5)
    return team


def prefill_widths(policy: HFPolicy):
    """Record the batch size of every forward call of the policy's model."""
    sizes = []
    handle = policy.model.register_forward_pre_hook(
        lambda module, args, kwargs: sizes.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    return sizes, handle


def test_each_distinct_prompt_is_prefilled_once(team):
    policy = team.policy("agent_0")
    sizes, handle = prefill_widths(policy)
    try:
        out = policy.generate(CONVERSATIONS, SamplingParams(max_new_tokens=3, temperature=1.0, seed=0),
                              adapters=["agent_0", "agent_1"], num_samples=4)
    finally:
        handle.remove()
    assert [len(group) for group in out] == [4, 4]
    assert sizes[0][0] == 2 and sizes[0][1] > 1          # prefill: 2 distinct (prompt, adapter) rows, whole prompts
    assert all(size == (8, 1) for size in sizes[1:])     # then every one of the 8 rows decodes one token per step


def test_greedy_samples_equal_a_single_sample_and_follow_their_adapter(team):
    policy = team.policy("agent_0")
    greedy = SamplingParams(max_new_tokens=6, temperature=0)
    grouped = policy.generate([CONVERSATIONS[0]] * 2, greedy, adapters=["agent_0", "agent_1"], num_samples=3)
    for adapter, group in zip(("agent_0", "agent_1"), grouped):
        single = policy.generate([CONVERSATIONS[0]], greedy, adapters=[adapter])[0][0]
        assert all(g.completion_ids == single.completion_ids for g in group)
    assert grouped[0][0].completion_ids != grouped[1][0].completion_ids   # the two adapters really differ


@pytest.mark.parametrize("temperature", [0.7, 0.0], ids=["sampled", "greedy"])
def test_sampled_logprobs_match_rescoring_under_each_adapter(team, temperature):
    """The log-probs a generate call reports are the ones scoring gives (greedy: of the unscaled logits)."""
    policy = team.policy("agent_0")
    params = SamplingParams(max_new_tokens=5, temperature=temperature, top_p=0.9, seed=1)
    out = policy.generate(CONVERSATIONS, params, adapters=["agent_0", "agent_1"], num_samples=3)
    for adapter, group in zip(("agent_0", "agent_1"), out):
        with torch.no_grad():
            logp, mask = policy.token_logprobs([g.prompt_ids for g in group], [g.completion_ids for g in group],
                                               adapter=adapter, temperature=params.temperature)
        for row, g in enumerate(group):
            n = len(g.completion_ids)
            assert mask[row].sum() == n
            assert torch.allclose(logp[row, :n], torch.tensor(g.logprobs), atol=1e-4)


def test_seeded_sampling_is_reproducible(team):
    policy = team.policy("agent_0")
    params = SamplingParams(max_new_tokens=5, temperature=1.0, seed=7)
    first = policy.generate(CONVERSATIONS, params, num_samples=2)
    second = policy.generate(CONVERSATIONS, params, num_samples=2)
    assert [[g.completion_ids for g in group] for group in first] == [
        [g.completion_ids for g in group] for group in second
    ]


def test_shared_prompt_scoring_matches_one_forward_per_row_with_gradients(team):
    policy = team.policy("agent_0")
    short, long = (policy.encode(c) for c in CONVERSATIONS)
    prompts = [short, short, short, long, long]                       # two groups, prompts of different lengths
    completions = [[18, 19, 20, 21], [22], [23, 24], [25, 26, 27], [28, 29]]
    params = [p for n, p in policy.model.named_parameters() if ".agent_1." in n]

    def scored(rows):
        for p in params:
            p.grad = None
        logp, mask = policy.token_logprobs([prompts[r] for r in rows], [completions[r] for r in rows],
                                           adapter="agent_1", temperature=0.7)
        (logp.sum(-1) * torch.arange(1.0, len(rows) + 1)).sum().backward()
        return logp.detach(), mask, [p.grad.clone() for p in params]

    shared, mask, shared_grads = scored(range(5))
    assert mask.sum(-1).tolist() == [4, 1, 2, 3, 2]
    separate_grads = [torch.zeros_like(p) for p in params]
    for row in range(5):                                              # a single row never shares its prompt
        logp, _, grads = scored([row])
        assert torch.allclose(shared[row, :len(completions[row])], logp[0, :len(completions[row])], atol=1e-5)
        separate_grads = [total + (row + 1) * g for total, g in zip(separate_grads, grads)]
    for a, b in zip(shared_grads, separate_grads):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("completions", [[[18], [19], [20]], [[18, 19, 20], [21], [22, 23]]])
def test_lockstep_scoring_makes_the_same_two_forward_calls_and_the_same_logprobs(team, completions):
    policy = team.policy("agent_0")
    short, long = (policy.encode(c) for c in CONVERSATIONS)
    prompts = [short, long, list(reversed(short))]                   # no prompt repeats: usually one forward
    expected, expected_mask = policy.token_logprobs(prompts, completions, adapter="agent_1")
    policy.lockstep = True                                            # as under FSDP sharding
    try:
        sizes, handle = prefill_widths(policy)
        logp, mask = policy.token_logprobs(prompts, completions, adapter="agent_1")
        handle.remove()
    finally:
        policy.lockstep = False
    assert len(sizes) == 2                                            # prompts, then completions: whatever the rows
    width = expected.shape[1]
    assert mask[:, :width].tolist() == expected_mask.tolist() and not mask[:, width:].any()
    torch.testing.assert_close(logp[:, :width], expected, rtol=0, atol=1e-5)


def test_reserved_cache_returns_what_a_dynamic_cache_returns():
    from transformers import DynamicCache

    from llm_marl.backends.hf import reserved_cache

    torch.manual_seed(0)
    reserved, dynamic = reserved_cache(room=2), DynamicCache()
    steps = [torch.randn(2, 3, 4, 5), torch.randn(2, 3, 1, 5)]
    for cache in (reserved, dynamic):
        cache.update(steps[0], steps[0] + 1, 0)
        cache.batch_select_indices(torch.tensor([0, 0, 1]))          # copy prompts to rows, as the decode loop does
    for n in range(4):                                                 # outgrows the room: a new buffer, same values
        token = torch.randn(3, 3, 1, 5)
        got, want = reserved.update(token, -token, 0), dynamic.update(token, -token, 0)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert reserved.get_seq_length() == dynamic.get_seq_length() == 8


def test_reserved_cache_gathers_rows_into_buffers_with_room():
    """Dropping finished rows mid-decode: same values as a DynamicCache, and the next writes go into the
    gathered buffer's room (no second copy into a fresh buffer)."""
    from transformers import DynamicCache

    from llm_marl.backends.hf import reserved_cache

    torch.manual_seed(0)
    reserved, dynamic = reserved_cache(room=6), DynamicCache()
    prompt = torch.randn(4, 3, 5, 2)
    for cache in (reserved, dynamic):
        cache.update(prompt, prompt * 2, 0)
    for rows in (4, 4, 2, 2, 1):
        if rows < reserved.layers[0].keys.shape[0]:
            keep = torch.tensor([2, 0]) if rows == 2 else torch.tensor([1])
            reserved.batch_select_indices(keep)
            dynamic.batch_select_indices(keep)
            layer = reserved.layers[0]
            assert layer.keys.data_ptr() == layer.buffers[0].data_ptr()
            held = layer.buffers[0].data_ptr()
        token = torch.randn(rows, 3, 1, 2)
        got, want = reserved.update(token, -token, 0), dynamic.update(token, -token, 0)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        if rows < 4:
            assert reserved.layers[0].buffers[0].data_ptr() == held        # written in place, no new buffer
    assert reserved.get_seq_length() == dynamic.get_seq_length() == 10


def test_chosen_logprobs_equal_log_softmax_and_take_the_logits_buffer():
    from llm_marl.backends.hf import chosen_logprobs_

    logits = torch.randn(5, 1000, generator=torch.Generator().manual_seed(0)) * 8
    ids = torch.tensor([0, 999, 17, 500, 3])
    expected = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, None]).squeeze(-1)
    buffer = logits.clone()
    torch.testing.assert_close(chosen_logprobs_(buffer, ids), expected, rtol=1e-5, atol=1e-5)
    assert not torch.equal(buffer, logits)          # worked in place: the caller must not reuse its logits


def repeated_ngrams(ids, n):
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return len(grams) - len(set(grams))


def test_repeated_ngram_tokens_are_the_continuations_of_the_last_n_minus_1_tokens():
    from llm_marl.backends.hf.decode_loop import repeated_ngram_tokens

    assert repeated_ngram_tokens([5, 6, 7, 5, 6], 3) == [7]            # 5 6 -> 7 was seen after "5 6"
    assert repeated_ngram_tokens([5, 6, 7, 5, 6, 9, 5, 6], 3) == [7, 9]
    assert repeated_ngram_tokens([5, 6, 7], 3) == []                   # "6 7" never came before
    assert repeated_ngram_tokens([1, 2], 3) == []
    assert repeated_ngram_tokens([4, 4, 2], 1) == [2, 4]
    assert repeated_ngram_tokens([4], 2) == [] and repeated_ngram_tokens([4, 4], 2) == [4]


@pytest.mark.parametrize("temperature", [0.0, 0.1], ids=["greedy", "sampled"])
def test_no_repeat_ngram_keeps_a_looping_completion_free_of_repeated_ngrams(team, temperature):
    policy = team.policy("agent_0")
    plain = SamplingParams(max_new_tokens=40, temperature=temperature, seed=3)
    free = [g.completion_ids for g in policy.generate(CONVERSATIONS, plain, num_samples=2)[0]]
    assert any(repeated_ngrams(ids, 3) for ids in free), "the tiny model did not loop: nothing to guard against"
    guarded = policy.generate(CONVERSATIONS, SamplingParams(max_new_tokens=40, temperature=temperature, seed=3,
                                                            no_repeat_ngram=3), num_samples=2)
    for group in guarded:
        for g in group:
            assert len(g.completion_ids) > 6 and repeated_ngrams(g.completion_ids, 3) == 0
            assert all(lp > float("-inf") for lp in g.logprobs)


def test_no_repeat_ngram_is_refused_where_a_backend_cannot_apply_it():
    from llm_marl.backends.openai_compat import OpenAIPolicy

    with pytest.raises(ValueError, match="no_repeat_ngram must be >= 0"):
        SamplingParams(no_repeat_ngram=-1)
    server = OpenAIPolicy("http://127.0.0.1:9", "m")     # never contacted: the check comes first
    with pytest.raises(ValueError, match="does not apply no_repeat_ngram=3"):
        server.generate(CONVERSATIONS, SamplingParams(no_repeat_ngram=3))
