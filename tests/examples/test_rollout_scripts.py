"""Helpers of the rollout benchmarks: the roofline's decode-step clock (tiny model), the reuse script's decode bound."""
import pytest

from llm_marl.backends.hf import HFPolicy
from llm_marl.models import tiny_model
from llm_marl.policy import SamplingParams
from tests.scripts import load_script

roofline = load_script("benchmarks/rollout_roofline.py")
reuse = load_script("benchmarks/rollout_reuse.py")

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


def test_decode_needed_for_ratio_two_solves_for_the_shared_decode_time():
    # 19 s of the run without reuse and 8 s of the one with it are not decode: (19 + d) / (8 + d) = 2 at d = 3
    line = reuse.decode_needed_line((26.0, 18.0, 7.0), (15.0, 7.5, 7.0))
    assert "decode phase 7.0 s without reuse, 7.0 s with it" in line and "needs it under 3.0 s" in line
    # when the rest of the run without reuse is not twice the rest with it, no decode time is short enough
    assert "out of reach" in reuse.decode_needed_line((20.0, 13.0, 7.0), (15.0, 7.5, 7.0))
