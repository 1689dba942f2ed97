"""MAPPO on task trees (``num_generations > 1``): the answers a step samples, the shared answers' rewards, the
critic's shared task prefix, and a step that trains."""
import numpy as np
import pytest
import torch

from tests.trainers.test_mappo_trainer import build_trainer
from trainers.mappo import MAPPOConfig
from trainers.mappo.critic import critic_context_parts, critic_task_text
from trainers.mappo.rewards import turn_rewards
from trainers.mappo.trainer import prefix_batches

pytestmark = pytest.mark.usefixtures("one_torch_thread")

G = 2


def tree_trainer(tmp_path, **overrides):
    """2 agents x 2 turns, one task a step played as a tree of G = 2 answers per agent and node."""
    return build_trainer(tmp_path, **{"num_generations": G, "episodes_per_step": 1, "minibatch_size": 64, **overrides})


def distinct_answers(episodes, turn):
    """The distinct AgentTurn objects of ``turn`` over the episodes (shared answers once)."""
    return {id(e.turns[turn][a]): e.turns[turn][a] for e in episodes for a in e.agents}


def test_a_tree_plays_g_to_the_t_episodes_that_share_their_earlier_answers(tmp_path):
    trainer = tree_trainer(tmp_path)
    episodes = trainer.collect(1)
    n = len(trainer.agents)
    assert len(episodes) == G ** 2 and all(len(e.turns) == 2 for e in episodes)
    assert len({e.task_index for e in episodes}) == 1
    assert len(distinct_answers(episodes, 0)) == n * G          # each turn-0 answer is in G episodes
    assert len(distinct_answers(episodes, 1)) == n * G ** 2     # each last-turn answer in one
    for e in episodes:          # the g-th answers act together: agent_1's turn-1 prompt holds its partner's answer
        partner = e.turns[0]["agent_0"].text.strip()
        assert partner in "\n".join(m["content"] for m in e.turns[1]["agent_1"].messages)
    # the samples of a node share their prompt
    prompts = {tuple(a.prompt_ids) for a in distinct_answers(episodes, 0).values()}
    assert len(prompts) == n
    again = tree_trainer(tmp_path / "again").collect(1)          # a seeded step replays
    texts = lambda played: [a.text for e in played for a in e.turns[1].values()]  # noqa: E731
    assert texts(again) == texts(episodes)


def test_a_shared_answer_is_one_response_whose_reward_is_its_mean_return(tmp_path):
    trainer = tree_trainer(tmp_path)
    episodes = trainer.collect(1)
    responses = trainer.compute_rewards(episodes)
    n = len(trainer.agents)
    assert len(responses) == n * (G + G ** 2)
    returns = {}
    for e in episodes:
        outcome = trainer.score(e)
        c = trainer.config
        table = turn_rewards(outcome.scores, outcome.correct, gamma=c.reward_gamma, rule=c.reward_rule,
                             future_mean=c.future_mean, incentives=c.incentives)
        for t, turn in enumerate(e.turns):
            for i, agent in enumerate(trainer.agents):
                returns.setdefault(id(turn[agent]), (turn[agent], []))[1].append(float(table[t, i]))
    expected = {(tuple(act.completion_ids), tuple(act.prompt_ids)): np.mean(values)
                for act, values in returns.values()}
    assert len(expected) == len(responses)
    for r in responses:
        assert r.reward == pytest.approx(expected[tuple(r.completion_ids), tuple(r.prompt_ids)], abs=1e-12)
    turn0 = [len(values) for act, values in returns.values() if act.turn == 0]
    assert turn0 == [G] * (n * G)
    # the critic's context: an agent's turn-0 rows share the task part, its last-turn rows under one node share the
    # task and the node's turn-0 answers; the rest holds the partner's answer of the same turn
    for agent in trainer.agents:
        mine = [r for r in responses if r.agent == agent]
        assert len({tuple(r.critic_prefix_ids) for r in mine if r.turn == 0}) == 1
        assert len({tuple(r.critic_prefix_ids) for r in mine if r.turn == 1}) == G
        task = next(r.critic_prefix_ids for r in mine if r.turn == 0)
        assert all(r.critic_prefix_ids[:len(task)] == task and len(r.critic_prefix_ids) > len(task)
                   for r in mine if r.turn == 1)
    for e in episodes:                          # the two pieces are the whole context, split after the turn-0 answers
        answers = [{a: turn[a].text for a in e.agents} for turn in e.turns]
        openings = {a: e.turns[0][a].messages for a in e.agents}
        for agent in e.agents:
            response = next(r for r in responses if r.turn == 1 and r.completion_ids == e.turns[1][agent].completion_ids
                            and r.prompt_ids == e.turns[1][agent].prompt_ids)
            parts = critic_context_parts(critic_task_text(openings, agent), answers, agent, 1)
            assert response.critic_prefix_ids + response.critic_ids == trainer.critic.context_ids(parts)
            prefix_text = trainer.critic.policy.tokenizer.decode(response.critic_prefix_ids)
            assert all(answers[0][a].strip() in prefix_text for a in e.agents)
            assert answers[1][[a for a in e.agents if a != agent][0]].strip() not in prefix_text
    decode = trainer.team.policy("agent_0").tokenizer.decode
    first = next(r for r in responses if r.turn == 0 and r.agent == "agent_0")
    partner = next(e.turns[0]["agent_1"].text for e in episodes
                   if list(e.turns[0]["agent_0"].completion_ids) == first.completion_ids)
    assert partner.strip() in decode(first.critic_ids)


def test_the_critic_with_a_shared_task_prefix_gives_the_values_of_the_whole_context(tmp_path):
    trainer = tree_trainer(tmp_path)
    responses = trainer.compute_rewards(trainer.collect(1))
    critic = trainer.critic
    whole = [list(r.critic_prefix_ids) + list(r.critic_ids) for r in responses]
    completions = [r.completion_ids for r in responses]
    with torch.no_grad():
        expected, expected_mask = critic.values(whole, completions)
        shared, mask = critic.values([r.critic_ids for r in responses], completions,
                                     prefix_ids=[r.critic_prefix_ids for r in responses])
    assert torch.equal(mask.bool(), expected_mask.bool())
    # the same positions in two forwards (a KV cache vs one pass): float rounding only (measured: 3e-8)
    assert torch.allclose(shared, expected, atol=1e-5)
    assert shared.abs().sum() > 0
    with pytest.raises(ValueError, match="not both"):
        critic.values(whole, completions, trunk=[torch.zeros(1)], prefix_ids=whole)
    # sharded weights (FSDP): every process must make the same forwards, so the whole contexts run in one
    critic.policy.lockstep = True
    critic.policy.completion_hidden = lambda *a, **k: pytest.fail("a shared-prefix forward under lockstep")
    with torch.no_grad():
        locked, _ = critic.values([r.critic_ids for r in responses], completions,
                                  prefix_ids=[r.critic_prefix_ids for r in responses])
    assert torch.equal(locked, expected)


def test_prefix_batches_keep_each_response_once_with_its_prefix_group_together():
    from trainers.mappo.trainer import Response

    rows = [Response("a", 0, [k % 3] * 5, [1] * (k % 4 + 1), [2], critic_prefix_ids=[k % 2]) for k in range(12)]
    for critic, prefix in ((False, lambda r: tuple(r.prompt_ids)), (True, lambda r: tuple(r.critic_prefix_ids))):
        batches = prefix_batches(rows, critic=critic, max_rows=5)
        flat = [r for b in batches for r in b]
        assert sorted(map(id, flat)) == sorted(map(id, rows)) and max(map(len, batches)) == 5
        keys = [prefix(r) for r in flat]
        assert keys == sorted(keys)                  # one prefix's rows are contiguous
    assert len(prefix_batches(rows)) == 1


@pytest.mark.parametrize("critic_layers,critic_depth", [(None, None), (1, None), (None, 1)])
def test_a_tree_step_trains_every_actor_and_the_critic(tmp_path, critic_layers, critic_depth):
    trainer = tree_trainer(tmp_path, critic_layers=critic_layers, critic_depth=critic_depth, kl_coef=0.0)
    if critic_layers:           # a tree shares the task prefix instead of storing frozen-layer states
        trainer.critic.trunk = lambda *a, **k: pytest.fail("a tree step ran the critic's trunk")
    before = {a: {k: v.clone() for k, v in trainer.team.policy(a).trainable_state_dict(a).items()}
              for a in trainer.agents}
    head = trainer.critic.head.weight.detach().clone()
    metrics = trainer.train()[0]
    assert metrics["responses"] == len(trainer.agents) * (G + G ** 2)
    assert metrics["value_loss"] == metrics["value_loss"] and metrics["policy_loss"] == metrics["policy_loss"]
    for agent in trainer.agents:
        after = trainer.team.policy(agent).trainable_state_dict(agent)
        assert any(not torch.equal(before[agent][k], after[k]) for k in after), agent
    assert not torch.equal(head, trainer.critic.head.weight)


def test_num_generations_below_one_is_refused():
    with pytest.raises(ValueError, match="num_generations must be >= 1"):
        MAPPOConfig(num_generations=0)


def step_gradients(trainer):
    """One training step's gradients of every actor's and the critic's trainable weights (before the optimizer
    steps), and the step's responses."""
    grads, step = {}, trainer.distributed.optimizer_step

    def record(steps, max_norm):
        for optimizer, params in steps:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    grads[id(p)] = None if p.grad is None else p.grad.detach().clone()
        return step(steps, max_norm)

    trainer.distributed.optimizer_step = record
    episodes = trainer.collect(1)
    responses = trainer.compute_rewards(episodes)
    trainer.compute_advantages(responses)
    stats = trainer.update(responses, 1)
    names = {id(p): name for name, p in [(f"head.{n}", p) for n, p in trainer.critic.head.named_parameters()]
             + [(n, p) for n, p in trainer.team.policy("agent_0").model.named_parameters()]}
    return {names[k]: v for k, v in grads.items()}, responses, stats


@pytest.mark.parametrize("generations,critic_layers,critic_depth", [(G, None, None), (1, 1, None), (G, None, 1)])
def test_the_fused_critic_pass_gives_the_two_pass_gradients(tmp_path, generations, critic_layers, critic_depth):
    settings = dict(num_generations=generations, episodes_per_step=1 if generations > 1 else 2, minibatch_size=64,
                    ppo_epochs=1, critic_layers=critic_layers, critic_depth=critic_depth)
    fused = build_trainer(tmp_path / "fused", **settings)
    assert fused.config.fused_critic_pass
    fused.value_loss = lambda *a, **k: pytest.fail("the fused step ran the critic's value loss forward")
    two = build_trainer(tmp_path / "two", fused_critic_pass=False, **settings)
    forwards = []
    critic_values = two.critic_values
    two.critic_values = lambda group: forwards.append(len(group)) or critic_values(group)
    fused_grads, fused_responses, fused_stats = step_gradients(fused)
    two_grads, two_responses, two_stats = step_gradients(two)
    assert sum(forwards) == 2 * len(two_responses)       # the two-pass step runs every row through the critic twice
    for a, b in zip(fused_responses, two_responses):
        assert a.completion_ids == b.completion_ids
        torch.testing.assert_close(a.old_values, b.old_values, rtol=0, atol=1e-6)
        torch.testing.assert_close(a.value_targets, b.value_targets, rtol=0, atol=1e-6)
        torch.testing.assert_close(a.advantages, b.advantages, rtol=0, atol=1e-5)
    critic = [k for k in fused_grads if k.startswith("head.") or ".critic." in k]
    assert critic and any(".critic." in k for k in critic)
    for name in fused_grads:
        if two_grads[name] is None or not two_grads[name].any():
            assert fused_grads[name] is None or not fused_grads[name].any(), name
            continue
        # float sums in another order: measured at most 6e-7 of the tensor's largest gradient
        scale = two_grads[name].abs().max()
        assert (fused_grads[name] - two_grads[name]).abs().max() <= 1e-5 * scale, name
    assert any(fused_grads[k] is not None and fused_grads[k].abs().sum() > 0 for k in critic if ".critic." in k)
    assert fused_stats["value_loss"] == pytest.approx(two_stats["value_loss"], rel=1e-5)


def test_the_critic_runs_twice_when_the_step_has_several_minibatches(tmp_path):
    trainer = tree_trainer(tmp_path, ppo_epochs=1, minibatch_size=4)
    episodes = trainer.collect(1)
    responses = trainer.compute_rewards(episodes)
    assert len(responses) > 4 and not trainer.fuses_critic_pass(responses)
    assert tree_trainer(tmp_path / "one", ppo_epochs=1).fuses_critic_pass(responses)
    assert not tree_trainer(tmp_path / "epochs", ppo_epochs=2).fuses_critic_pass(responses)
