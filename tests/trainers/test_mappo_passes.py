"""MAPPO's forward passes and phase timings: batched, length-bucketed passes give what one response at a time
(or one forward per agent) gives; log π_old comes from the sampler without a forward; every step logs its phase
wall times."""
import copy

import pytest
import torch

from tests.trainers.test_mappo_trainer import build_trainer
from trainers.common.logging import read_metrics
from trainers.common.losses import kl_per_token
from trainers.mappo import trainer as mappo_trainer
from trainers.mappo.ppo_math import generalized_advantages, token_rewards
from trainers.mappo.trainer import Response, length_buckets

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FIELDS = ("old_logprobs", "kl", "old_values", "advantages", "value_targets")


def count_actor_forwards(trainer):
    """Wrap the team's policy so that its calls of ``token_logprobs`` are counted: ``{"actor": n, "reference": n}``."""
    counts = {"actor": 0, "reference": 0}
    policy = trainer.team.policy("agent_0")
    inner = policy.token_logprobs

    def counted(*args, reference=False, **kwargs):
        counts["reference" if reference else "actor"] += 1
        return inner(*args, reference=reference, **kwargs)

    policy.token_logprobs = counted
    return counts


def one_at_a_time(trainer, responses):
    """The advantage pass of each response on its own (batches of one: no padding, no sorting), then whitened."""
    c = trainer.config
    with torch.no_grad():
        for r in responses:
            policy, adapter = trainer.team.policy(r.agent), trainer.team.adapter(r.agent)
            logp, mask = policy.token_logprobs(
                [r.prompt_ids], [r.completion_ids], adapter=adapter, temperature=c.temperature
            )
            ref, _ = policy.token_logprobs(
                [r.prompt_ids], [r.completion_ids], temperature=c.temperature, reference=True
            )
            values, _ = trainer.critic.values([r.critic_ids], [r.completion_ids])
            mask = mask.float()
            kl = kl_per_token(logp, ref, c.kl_estimator) * mask
            rewards = token_rewards(torch.tensor([r.reward]), mask, kl=kl, kl_coef=c.kl_coef)
            advantages, targets = generalized_advantages(rewards, values, mask, c.gae_gamma, c.gae_lambda)
            r.old_logprobs, r.kl, r.old_values, r.advantages, r.value_targets = (
                t[0].clone() for t in (logp, kl, values, advantages, targets))
    trainer.whiten_advantages(responses)


def test_batched_passes_match_one_response_at_a_time_and_reuse_the_sampler_log_probs(tmp_path):
    trainer = build_trainer(tmp_path, episodes_per_step=3, minibatch_size=4, kl_coef=0.1)
    responses = trainer.compute_rewards(trainer.collect(1))
    assert len({len(r.prompt_ids) + len(r.completion_ids) for r in responses}) > 1    # padding would matter
    expected = copy.deepcopy(responses)
    one_at_a_time(trainer, expected)

    counts = count_actor_forwards(trainer)
    trainer.compute_advantages(responses)
    assert counts["actor"] == 0 and counts["reference"] > 0          # log π_old: the sampler's, no forward
    for got, want in zip(responses, expected):
        for name in FIELDS:
            torch.testing.assert_close(getattr(got, name), getattr(want, name), rtol=0, atol=2e-5, msg=name)

    recomputed = copy.deepcopy(responses)
    trainer.config.recompute_old_logprobs = True
    trainer.compute_advantages(recomputed)
    assert counts["actor"] > 0
    for got, want in zip(recomputed, expected):
        for name in FIELDS:
            torch.testing.assert_close(getattr(got, name), getattr(want, name), rtol=0, atol=2e-5, msg=name)


def test_a_step_logs_its_phase_wall_times(tmp_path):
    trainer = build_trainer(tmp_path)
    trainer.train()
    logged = read_metrics(tmp_path)[0]
    phases = ("collect", "rewards", "advantages", "update")
    assert all(logged[f"time/{p}"] > 0 for p in phases)
    assert logged["time/step"] == pytest.approx(sum(logged[f"time/{p}"] for p in phases))
    assert logged["responses"] == 8                                     # 2 debates x 2 agents x 2 turns


def response(prompt: int, completion: int, critic: int = 1):
    return Response("agent_0", 0, [1] * prompt, [2] * completion, [3] * critic)


def test_length_buckets_keep_every_response_once_and_bound_the_padding():
    rows = [response(p, c, critic=400 - p) for p, c in [(60, 6), (150, 20), (62, 40), (155, 3), (58, 10), (300, 5)]]
    buckets = length_buckets(rows)
    assert sorted(map(id, sum(buckets, []))) == sorted(map(id, rows))
    assert [[len(r.prompt_ids) for r in b] for b in buckets] == [[60, 58], [62], [155, 150], [300]]
    for bucket in buckets:
        padded = len(bucket) * (max(len(r.prompt_ids) for r in bucket) + max(len(r.completion_ids) for r in bucket))
        assert len(bucket) == 1 or padded <= 1.25 * sum(len(r.prompt_ids) + len(r.completion_ids) for r in bucket)
    assert [len(r.critic_ids) for r in length_buckets(rows, critic=True)[0]][0] == 100   # the critic's own prefix
    assert max(len(b) for b in length_buckets([response(60, 6)] * 9, max_rows=4)) == 4


def test_update_in_length_buckets_equals_one_forward_per_agent(tmp_path, monkeypatch):
    def trained(name, one_bucket):
        trainer = build_trainer(tmp_path / name, episodes_per_step=3, minibatch_size=6, ppo_epochs=1, kl_coef=0.05)
        responses = trainer.compute_rewards(trainer.collect(1))
        trainer.compute_advantages(responses)
        with monkeypatch.context() as patch:
            if one_bucket:          # the update before buckets: each agent's share of a minibatch in one forward
                patch.setattr(mappo_trainer, "length_buckets", lambda rows, **kwargs: [list(rows)] if rows else [])
            else:
                calls = []
                patch.setattr(mappo_trainer, "length_buckets",
                              lambda rows, **kwargs: calls.append(length_buckets(rows, **kwargs)) or calls[-1])
            stats = trainer.update(responses, step=1)
        if not one_bucket:
            assert any(len(buckets) > 1 for buckets in calls)    # some group really ran in several passes
        weights = {a: trainer.team.policy(a).trainable_state_dict(a) for a in trainer.agents}
        return stats, weights, trainer.critic.trainable_state_dict(), trainer.config.learning_rate

    stats, weights, critic, lr = trained("buckets", one_bucket=False)
    stats_one, weights_one, critic_one, _ = trained("one", one_bucket=True)
    assert stats.keys() == stats_one.keys()
    for key in stats:       # a clip fraction counts ties (V = V_old up to rounding) either way: one token in 72
        tolerance = 0.05 if key.endswith("clipfrac") else 1e-6
        assert stats[key] == pytest.approx(stats_one[key], rel=1e-4, abs=tolerance), key
    # Adam's step lr * m / (sqrt(v) + eps) turns the rounding of a gradient within a few eps of 0 into a visible
    # part of lr (seen: one element of 1024 apart by 1.6e-6): every element agrees within one step, and all but
    # such rare elements within 1e-6.
    pairs = [(weights[a][n], weights_one[a][n]) for a in weights for n in weights[a]]
    pairs += [(critic[n], critic_one[n]) for n in critic]
    for ours, theirs in pairs:
        difference = (ours - theirs).abs()
        assert difference.max().item() <= lr
        assert int((difference > 1e-6).sum()) <= max(1, difference.numel() // 200)
