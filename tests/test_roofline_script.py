"""``benchmarks/rollout_roofline.py``'s decode-step clock, on the tiny model: every decode step and no prefill."""
import pytest

from llm_marl.backends.hf import HFPolicy
from llm_marl.models import tiny_model
from llm_marl.policy import SamplingParams
from tests.scripts import load_script

roofline = load_script("benchmarks/rollout_roofline.py")

CONVERSATIONS = [[{"role": "user", "content": f"count: {n} 1 2 3 1 2 3 1 2"}] for n in range(3)]


@pytest.mark.parametrize("draft_tokens", [0, 6])
def test_decode_step_clock_times_every_decode_step_and_no_prefill(one_torch_thread, draft_tokens):
    model, tokenizer = tiny_model(seed=0)
    policy = HFPolicy(model, tokenizer, reuse_cache=False, draft_tokens=draft_tokens)
    clock = roofline.DecodeSteps(policy.model)
    policy.generate(CONVERSATIONS, SamplingParams(max_new_tokens=12, temperature=0), num_samples=2)
    clock.close()
    assert policy.decode_steps > 0
    assert len(clock.steps) == policy.decode_steps              # the prefill forward is not a decode step
    rows, widths, contexts, seconds = zip(*clock.steps)
    assert rows[0] == 6 and all(0 < r <= 6 for r in rows)
    assert all(1 <= w <= 1 + draft_tokens for w in widths)
    assert contexts[1] > contexts[0] and all(s > 0 for s in seconds)
    if draft_tokens:
        assert max(widths) > 1
    summary = clock.best_step_summary(per_token=1e6, config=model.config, peak=1e12)
    assert "at 6 rows x 1 position" in summary and "best_step_fraction=" in summary

    policy.generate(CONVERSATIONS, SamplingParams(max_new_tokens=4, temperature=0))
    assert len(clock.steps) == len(rows)                        # closed: nothing recorded after
