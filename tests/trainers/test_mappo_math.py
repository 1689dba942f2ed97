"""Hand-computed checks of the MAPPO math: influence-aware returns, incentives, GAE, PPO losses, critic input."""
import math

import numpy as np
import pytest
import torch

from trainers.common.incentives import IncentiveWeights, incentive_bonuses
from trainers.mappo.critic import critic_context
from trainers.mappo.ppo_math import (
    clipped_policy_loss,
    clipped_value_loss,
    entropy_from_logits,
    generalized_advantages,
    kl_per_token,
    token_rewards,
    whiten,
)
from trainers.mappo.rewards import influence_aware_returns, turn_rewards

# ---------------------------------------------------------------- influence-aware returns
SCORES_3_TURNS = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]    # s[t][i]; team means s̄ = 0.5, 0.5, 1.0


def test_influence_aware_three_turns_by_hand():
    r = influence_aware_returns(SCORES_3_TURNS, gamma=0.3)
    # R^0 = (s^0 + 0.3·s̄^1 + 0.09·s̄^2) / 1.39
    assert r[0, 0] == pytest.approx((1.0 + 0.3 * 0.5 + 0.09 * 1.0) / 1.39)
    assert r[0, 1] == pytest.approx((0.0 + 0.3 * 0.5 + 0.09 * 1.0) / 1.39)
    # R^1 = (s^1 + 0.3·s̄^2) / 1.3
    assert r[1, 0] == pytest.approx((0.0 + 0.3 * 1.0) / 1.3)
    assert r[1, 1] == pytest.approx((1.0 + 0.3 * 1.0) / 1.3)
    # R^2 = s^2 (the last turn has no future)
    np.testing.assert_allclose(r[2], [1.0, 1.0])


def test_influence_aware_future_mean_over_others():
    r = influence_aware_returns(SCORES_3_TURNS, gamma=0.3, future_mean="others")
    # agent 0's future team score is agent 1's: s_1^1 = 1, s_1^2 = 1
    assert r[0, 0] == pytest.approx((1.0 + 0.3 * 1.0 + 0.09 * 1.0) / 1.39)
    # agent 1's future team score is agent 0's: s_0^1 = 0, s_0^2 = 1
    assert r[0, 1] == pytest.approx((0.0 + 0.3 * 0.0 + 0.09 * 1.0) / 1.39)


def test_influence_aware_stops_at_last_turn_reached():
    # the episode stopped after 2 turns (x = 1): the sums run to x only
    r = influence_aware_returns([[1.0, 0.0], [0.0, 0.0]], gamma=0.3)
    assert r[0, 0] == pytest.approx(1.0 / 1.3)
    assert r[1, 0] == 0.0


def test_other_return_rules():
    np.testing.assert_allclose(influence_aware_returns(SCORES_3_TURNS, rule="current_turn"), SCORES_3_TURNS)
    np.testing.assert_allclose(
        influence_aware_returns([[0.0, 1.0], [1.0, 0.0]], rule="last_turn"), [[1.0, 0.0], [1.0, 0.0]]
    )
    # γ = 0 reduces the influence-aware rule to the current turn
    np.testing.assert_allclose(influence_aware_returns(SCORES_3_TURNS, gamma=0.0), SCORES_3_TURNS)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"rule": "sum"}, "rule must be one of"),
        ({"gamma": 1.5}, "gamma must be in"),
        ({"future_mean": "some"}, "future_mean must be one of"),
    ],
)
def test_return_rule_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        influence_aware_returns(SCORES_3_TURNS, **kwargs)


def test_return_bad_tables():
    with pytest.raises(ValueError, match="non-empty"):
        influence_aware_returns([])
    with pytest.raises(ValueError, match="needs at least 2 agents"):
        influence_aware_returns([[1.0]], future_mean="others")


# ---------------------------------------------------------------- incentives (3 agents: 2 others, ties possible)
def bonuses(correct, **weights):
    """The bonus table alone (the α penalties are tested in tests/trainers/test_paper_options.py)."""
    return incentive_bonuses(correct, IncentiveWeights(**{"penalties": False, **weights})).tolist()


def test_alpha0_critical_reasoning():
    # agent 0 right at t=1 while both others were wrong at t=0
    assert bonuses([[0, 0, 0], [1, 0, 0]], alpha0=1.0) == [[0, 0, 0], [1, 0, 0]]
    # majority of others right at t-1: no bonus
    assert bonuses([[0, 1, 1], [1, 1, 1]], alpha0=1.0) == [[0, 0, 0], [0, 0, 0]]


def test_alpha0_tie_in_majority_does_not_fire():
    # agent 0's others at t=0 are split 1-1 (a tie): neither α0 nor α1 fires for agent 0
    assert bonuses([[0, 1, 0], [1, 0, 0]], alpha0=1.0, alpha1=1.0) == [[0, 0, 0], [0, 0, 0]]


def test_alpha1_persuadability():
    # agent 0 wrong at t=0, others right at t=0, agent 0 right at t=1
    assert bonuses([[0, 1, 1], [1, 1, 1]], alpha1=2.0) == [[0, 0, 0], [2, 0, 0]]
    # already right at t-1: no bonus (that would be keeping, not being persuaded)
    assert bonuses([[1, 1, 1], [1, 1, 1]], alpha1=2.0) == [[0, 0, 0], [0, 0, 0]]


def test_beta0_useful_wrong_answer():
    # agents 0 and 2 wrong at t=0 and their correct-others count rises 0 -> 1 (agent 1 fixed its answer)
    assert bonuses([[0, 0, 0], [0, 1, 0]], beta0=1.0) == [[1, 0, 1], [0, 0, 0]]


def test_beta1_persuasion():
    # agent 0 right at t=0; its correct-others count rises 0 -> 1
    assert bonuses([[1, 0, 0], [1, 1, 0]], beta1=0.5) == [[0.5, 0, 0], [0, 0, 0]]


def test_incentive_edges_first_and_last_turn():
    # one turn only: α needs t >= 1 and β needs t < x, so nothing fires
    assert bonuses([[1, 0, 0]], alpha0=1.0, alpha1=1.0, beta0=1.0, beta1=1.0) == [[0, 0, 0]]


def test_incentives_added_to_returns_and_bad_inputs():
    correct = [[1, 0], [1, 1]]
    base = influence_aware_returns([[1.0, 0.0], [1.0, 1.0]], gamma=0.3)
    total = turn_rewards([[1.0, 0.0], [1.0, 1.0]], correct, gamma=0.3, incentives=IncentiveWeights(beta1=1.0))
    # agent 0 right at t=0, agent 1 (its only other) goes wrong -> right: β1 fires at (0, 0)
    np.testing.assert_allclose(total - base, [[1.0, 0.0], [0.0, 0.0]])
    with pytest.raises(ValueError, match="binary correctness"):
        incentive_bonuses([[None, 1], [1, 1]], IncentiveWeights(alpha0=1.0))
    with pytest.raises(ValueError, match="at least 2 agents"):
        incentive_bonuses([[1], [1]], IncentiveWeights(alpha0=1.0))
    with pytest.raises(ValueError, match="no correctness table"):
        turn_rewards([[1.0, 0.0]], None, incentives=IncentiveWeights(alpha0=1.0))


# ---------------------------------------------------------------- GAE and per-token rewards
def test_gae_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [1.0, 0.5, 9.0]])    # 9.0 sits on padding and must be ignored
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, targets = generalized_advantages(rewards, values, mask, gamma=0.9, lam=0.8)
    # row 0: δ2 = 1 - 0.7 = 0.3; δ1 = 0.9·0.7 - 0.6 = 0.03; δ0 = 0.9·0.6 - 0.5 = 0.04; γλ = 0.72
    a2 = 0.3
    a1 = 0.03 + 0.72 * a2
    a0 = 0.04 + 0.72 * a1
    torch.testing.assert_close(adv[0], torch.tensor([a0, a1, a2]))
    torch.testing.assert_close(targets[0], torch.tensor([a0 + 0.5, a1 + 0.6, a2 + 0.7]))
    # row 1 ends at k=1: δ1 = 2 - 0.5 = 1.5; δ0 = 0.9·0.5 - 1 = -0.55
    torch.testing.assert_close(adv[1], torch.tensor([-0.55 + 0.72 * 1.5, 1.5, 0.0]))


def test_token_rewards_turn_reward_on_last_token_with_kl():
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.5, 0.5, 0.5]])
    r = token_rewards(torch.tensor([1.0, 2.0]), mask, kl=kl, kl_coef=0.1)
    torch.testing.assert_close(r, torch.tensor([[-0.01, -0.02, 0.97], [-0.05, 1.95, 0.0]]))


def test_bad_masks_are_refused():
    with pytest.raises(ValueError, match="right-padded"):
        token_rewards(torch.tensor([1.0]), torch.tensor([[0, 1, 1]]))
    with pytest.raises(ValueError, match="at least one completion token"):
        token_rewards(torch.tensor([1.0]), torch.tensor([[0, 0]]))


def test_whiten_masked():
    values = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    w = whiten(values, mask)
    torch.testing.assert_close(w, torch.tensor([[-1.0, 0.0, 1.0, 0.0]]), atol=1e-6, rtol=0)   # std of 1,2,3 is 1


# ---------------------------------------------------------------- losses and KL
def test_clipped_policy_loss_by_hand():
    new = torch.log(torch.tensor([[1.5, 0.5]]))
    old = torch.zeros(1, 2)
    adv = torch.tensor([[1.0, -1.0]])
    loss, stats = clipped_policy_loss(new, old, adv, torch.ones(1, 2), clip_eps=0.2)
    # token 0: max(-1.5, -1.2) = -1.2; token 1: max(0.5, 0.8) = 0.8
    assert float(loss) == pytest.approx((-1.2 + 0.8) / 2)
    assert stats["clipfrac"] == 1.0


def test_clipfrac_counts_only_tokens_whose_clip_is_in_force():
    ratio = torch.tensor([[1.5, 1.5, 0.5, 0.5, 1.1, 0.9, 1.5]])
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0, 1.0, -1.0, 0.0]])
    _, stats = clipped_policy_loss(torch.log(ratio), torch.zeros(1, 7), adv, torch.ones(1, 7), clip_eps=0.2)
    # in force: ρ > 1+ε with A > 0, ρ < 1-ε with A < 0; inside the bounds, the other side or A = 0: not clipped
    assert stats["clipfrac"] == pytest.approx(2 / 7)


def test_a_value_inside_the_clip_range_is_not_counted_as_clipped():
    # V_old + (V - V_old) rounds to one float32 step away from V here, so the "clipped" error differs from the
    # unclipped one by rounding alone: the clip is not in force and the loss is the plain (V - G)^2
    values, old, targets = torch.tensor([[-0.017742237]]), torch.tensor([[0.077428974]]), torch.tensor([[0.0056529376]])
    assert float(old + (values - old)) != float(values)
    loss, stats = clipped_value_loss(values, old, targets, torch.ones(1, 1), clip_range=0.2)
    assert stats["vf_clipfrac"] == 0.0
    assert float(loss) == float(0.5 * (values - targets) ** 2)
    _, stats = clipped_value_loss(torch.tensor([[0.5]]), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), 0.2)
    assert stats["vf_clipfrac"] == 1.0      # V moved 0.5 from V_old, beyond 0.2, and the clipped error is larger


def test_clipped_value_loss_by_hand():
    loss, _ = clipped_value_loss(
        torch.tensor([[0.5, 0.1]]), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), clip_range=0.2
    )
    # token 0: max(0.25, (0.2-1)^2 = 0.64); token 1: max(0.81, 0.81)
    assert float(loss) == pytest.approx(0.5 * (0.64 + 0.81) / 2)


def test_kl_estimators_by_hand():
    logp, ref = torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25]))
    assert float(kl_per_token(logp, ref, "k1")) == pytest.approx(math.log(2))
    assert float(kl_per_token(logp, ref, "k3")) == pytest.approx(0.5 - 1 + math.log(2))
    with pytest.raises(ValueError, match="k1"):
        kl_per_token(logp, ref, "k2")


def test_entropy_of_uniform():
    assert float(entropy_from_logits(torch.zeros(4))) == pytest.approx(math.log(4))


# ---------------------------------------------------------------- centralized critic input
def test_critic_input_contains_the_other_agents_answers():
    answers = [
        {"agent_0": "A0 says 4", "agent_1": "A1 says 5"},
        {"agent_0": "A0 now says 5", "agent_1": "A1 keeps 5"},
    ]
    text = critic_context("What is 2+3?", answers, "agent_0", 1)
    assert "What is 2+3?" in text
    for seen in ("A0 says 4", "A1 says 5", "A1 keeps 5"):     # all history + the other's simultaneous answer
        assert seen in text
    assert "A0 now says 5" not in text                       # its own answer is scored token by token after
    assert text.index("A1 says 5") < text.index("A1 keeps 5") < text.rindex("agent_0 answers")
    with pytest.raises(ValueError, match="turn must be in"):
        critic_context("q", answers, "agent_0", 2)
    with pytest.raises(ValueError, match="no answer at turn"):
        critic_context("q", answers, "agent_7", 0)
