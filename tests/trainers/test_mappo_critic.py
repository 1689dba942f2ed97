"""The centralized critic on a tiny random model: shapes, masking, causality, what it trains."""
import pytest
import torch

from llm_marl.models import tiny_model
from llm_marl.team import Team
from trainers.mappo.critic import CentralizedCritic, critic_context, critic_context_parts

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def team_and_critic():
    model, tokenizer = tiny_model(seed=0)
    team = Team.adapter_per_agent(model, tokenizer, agents=2)
    critic = CentralizedCritic(team.policy("agent_0"), max_context_tokens=32, seed=0)
    return team, critic


def test_critic_values_are_masked_and_causal(team_and_critic):
    _, critic = team_and_critic
    context = critic.context_ids(critic_context("What is 2+3?", [{"agent_0": "5", "agent_1": "4"}], "agent_0", 0))
    assert len(context) <= 32
    completions = [[11, 12, 13], [11, 12]]
    values, mask = critic.values([context, context], completions)
    assert values.shape == mask.shape == (2, 3)
    assert mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert float(values[1, 2].detach()) == 0.0
    # V_k reads the state before token k: the first two tokens agree across rows, so do their values
    torch.testing.assert_close(values[0, :2], values[1, :2])


def test_critic_value_depends_on_the_other_agents_answers(team_and_critic):
    _, critic = team_and_critic
    answers_a = [{"agent_0": "I say 5", "agent_1": "I say 5"}]
    answers_b = [{"agent_0": "I say 5", "agent_1": "I say 9000, obviously"}]
    contexts = [critic.context_ids(critic_context("What is 2+3?", a, "agent_0", 0)) for a in (answers_a, answers_b)]
    values, _ = critic.values(contexts, [[11, 12], [11, 12]])
    assert not torch.allclose(values[0], values[1])


def test_critic_trains_only_its_adapter_and_head(team_and_critic):
    team, critic = team_and_critic
    policy = team.policy("agent_0")
    assert "critic" in policy.adapter_names and {"agent_0", "agent_1"} <= set(policy.adapter_names)
    params = critic.trainable_parameters()
    names = {id(p): n for n, p in policy.model.named_parameters()}
    assert params and all(".critic." in names[id(p)] for p in params if id(p) in names)
    values, mask = critic.values([[5, 6, 7]], [[11, 12]])
    (values.sum()).backward()
    assert critic.head.weight.grad is not None
    agent_grads = [p.grad for n, p in policy.model.named_parameters() if ".agent_0." in n]
    assert all(g is None for g in agent_grads)
    state = critic.trainable_state_dict()
    assert any(k.startswith("adapter.") for k in state) and "head.weight" in state
    critic.load_trainable_state_dict(state)


def test_critic_refuses_a_plain_model():
    model, tokenizer = tiny_model(seed=1)
    team = Team.separate([(model, tokenizer)], agents=["agent_0"])
    with pytest.raises(ValueError, match="shares a LoRA base"):
        CentralizedCritic(team.policy("agent_0"))


def test_the_critic_reads_every_agents_private_view_and_a_debate_question_once():
    import llm_marl_envs
    from llm_marl_envs.core import render_messages
    from trainers.mappo.critic import critic_task_text

    env = llm_marl_envs.make("split_arithmetic-v0")
    _, infos = env.reset(options={"task_index": 0})
    openings = {agent: infos[agent]["messages"] for agent in env.possible_agents}
    text = critic_task_text(openings, "agent_0")
    for role in (0, 1):          # both views, though agent_0's own prompt holds only the first
        assert env.view_text(env.task, role) in text
    assert env.view_text(env.task, 1) not in render_messages(openings["agent_0"])
    debate = llm_marl_envs.make("arithmetic_debate-v0")
    _, infos = debate.reset(options={"task_index": 0})
    openings = {agent: infos[agent]["messages"] for agent in debate.possible_agents}
    assert critic_task_text(openings, "agent_1") == render_messages(openings["agent_1"])
    with pytest.raises(ValueError, match="no opening prompt"):
        critic_task_text(openings, "agent_7")


def _top_layer_critic(layers: int) -> tuple[Team, CentralizedCritic]:
    model, tokenizer = tiny_model(seed=0)
    team = Team.adapter_per_agent(model, tokenizer, agents=2)
    critic = CentralizedCritic(team.policy("agent_0"), max_context_tokens=32, seed=0, layers=layers)
    with torch.no_grad():             # LoRA starts as the identity (B = 0): make the adapter change the layers
        for name, p in team.policy("agent_0").model.named_parameters():
            if ".critic." in name and "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.5)
    return team, critic


def test_critic_layers_adapt_only_the_top_layers():
    team, critic = _top_layer_critic(layers=1)
    total = len(critic._decoder().layers)
    assert total >= 2 and critic.first_layer == total - 1
    adapted = {n.split(".layers.")[1].split(".")[0] for n, _ in team.policy("agent_0").model.named_parameters()
               if ".critic." in n}
    assert adapted == {str(total - 1)}
    with pytest.raises(ValueError, match=r"critic layers must be in \[1, "):
        CentralizedCritic(team.policy("agent_1"), adapter="critic_2", layers=total + 1)


def test_values_from_the_trunk_equal_the_full_forward_and_its_gradients():
    _, critic = _top_layer_critic(layers=1)
    contexts = [[5, 6, 7, 8, 9], [21, 22], [30, 31, 32, 33]]
    completions = [[11, 12, 13], [11], [40, 41]]
    full, mask = critic.values(contexts, completions)
    # the trunk of each row computed alone, the values of all rows in one batch: padding differs between them
    trunk = [critic.trunk([c], [x])[0] for c, x in zip(contexts, completions)]
    assert [t.shape[0] for t in trunk] == [len(c) + len(x) for c, x in zip(contexts, completions)]
    split, split_mask = critic.values(contexts, completions, trunk=trunk)
    assert torch.equal(mask, split_mask)
    assert float(full.detach().abs().max()) > 0
    torch.testing.assert_close(split, full, atol=1e-5, rtol=1e-4)
    params = critic.trainable_parameters()
    grads_full = torch.autograd.grad(full.sum(), params, allow_unused=True)
    grads_split = torch.autograd.grad(split.sum(), params, allow_unused=True)
    assert sum(g is not None for g in grads_split) == len(params)
    for a, b in zip(grads_full, grads_split):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)


def test_trunk_states_need_a_critic_with_frozen_lower_layers(team_and_critic):
    _, critic = team_and_critic
    with pytest.raises(ValueError, match="every layer"):
        critic.trunk([[5, 6]], [[11]])


def _shallow_critic(depth: int, layers: int | None = None) -> tuple[Team, CentralizedCritic]:
    model, tokenizer = tiny_model(seed=0, num_layers=3)
    team = Team.adapter_per_agent(model, tokenizer, agents=2)
    critic = CentralizedCritic(team.policy("agent_0"), max_context_tokens=32, seed=0, depth=depth, layers=layers)
    with torch.no_grad():             # LoRA starts as the identity (B = 0): make the adapter change the layers
        for name, p in team.policy("agent_0").model.named_parameters():
            if ".critic." in name and "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.5)
        critic.head.weight.copy_(torch.randn_like(critic.head.weight))
    return team, critic


def _adapted_layers(team: Team) -> set[int]:
    return {int(n.split(".layers.")[1].split(".")[0]) for n, _ in team.policy("agent_0").model.named_parameters()
            if ".critic." in n}


@pytest.mark.parametrize("depth,layers", [(2, None), (2, 1), (1, None)])
def test_a_shallow_critic_reads_the_normed_output_of_its_last_layer(depth, layers):
    team, critic = _shallow_critic(depth, layers)
    assert _adapted_layers(team) == set(range(depth - (layers or depth), depth))
    contexts, completions = [[5, 6, 7, 8, 9], [21, 22]], [[11, 12, 13], [11]]
    values, mask = critic.values(contexts, completions)
    # the same rows through the whole 3-layer stack with the critic's adapter: layer `depth`'s output, normed
    policy = team.policy("agent_0")
    ids, row_mask, width = policy.scoring_rows(contexts, completions)
    decoder = policy.model.get_base_model().get_decoder()
    captured = []
    hook = decoder.layers[depth - 1].register_forward_hook(lambda module, args, out: captured.append(out))
    try:
        with torch.no_grad(), policy.using("critic"):
            out = decoder(input_ids=ids, attention_mask=row_mask, use_cache=False,
                          position_ids=(row_mask.cumsum(-1) - 1).clamp(min=0))
    finally:
        hook.remove()
    layer_out = captured[0][0] if isinstance(captured[0], tuple) else captured[0]
    with torch.no_grad():
        expected = critic.head(decoder.norm(layer_out)[:, -(width + 1):-1]).squeeze(-1) * mask
    assert len(decoder.layers) == 3 and depth < 3
    torch.testing.assert_close(values.detach(), expected, atol=1e-5, rtol=1e-4)
    if layers is not None and layers < depth:      # the frozen layers below the adapted ones, run once and stored
        with torch.no_grad():
            from_trunk, _ = critic.values(contexts, completions, trunk=critic.trunk(contexts, completions))
        torch.testing.assert_close(from_trunk, expected, atol=1e-5, rtol=1e-4)
    # and not the whole stack's: the layers above `depth` change the state
    with torch.no_grad():
        whole = critic.head(out.last_hidden_state[:, -(width + 1):-1]).squeeze(-1) * mask
    assert float((whole - expected).abs().max()) > 1e-3


def test_a_shallow_critic_never_runs_the_layers_above_its_depth():
    team, critic = _shallow_critic(depth=1)
    layers = team.policy("agent_0").model.get_base_model().get_decoder().layers
    ran = []
    hooks = [layer.register_forward_hook(lambda module, args, out, k=k: ran.append(k)) for k, layer in
             enumerate(layers)]
    try:
        values, _ = critic.values([[5, 6, 7]], [[11, 12]])                          # one row through the model
        critic.values([[5, 6, 7], [5, 6, 7]], [[11], [12, 13]], prefix_ids=[[1, 2], [1, 2]])   # a shared prefix
        values.sum().backward()
    finally:
        for hook in hooks:
            hook.remove()
    assert ran and set(ran) == {0}
    assert len(layers) == 3                       # the stack is whole again afterwards
    assert critic.head.weight.grad is not None


def test_the_prefix_path_of_a_shallow_critic_equals_its_plain_path():
    _, critic = _shallow_critic(depth=2)
    prefixes, contexts, completions = [[1, 2, 3], [1, 2, 3]], [[5, 6], [7]], [[11, 12], [13, 14, 15]]
    shared, mask = critic.values(contexts, completions, prefix_ids=prefixes)
    plain, plain_mask = critic.values([p + c for p, c in zip(prefixes, contexts)], completions)
    assert torch.equal(mask.cpu(), plain_mask.cpu())
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=1e-4)


def test_critic_depth_is_refused_outside_the_stack():
    model, tokenizer = tiny_model(seed=0, num_layers=3)
    team = Team.adapter_per_agent(model, tokenizer, agents=2)
    for depth in (0, 4, True, 1.5):
        with pytest.raises(ValueError, match=r"critic depth must be an int in \[1, 3\]"):
            CentralizedCritic(team.policy("agent_0"), adapter=f"critic_{depth}", depth=depth)
    with pytest.raises(ValueError, match=r"critic layers must be in \[1, 2\] for a critic that runs 2 layers"):
        CentralizedCritic(team.policy("agent_0"), adapter="critic_x", depth=2, layers=3)


def test_split_context_ids_keeps_the_whole_context_and_moves_earlier_turns_into_the_shared_piece(team_and_critic):
    _, critic = team_and_critic
    answers = [{"agent_0": "five", "agent_1": "four"}, {"agent_0": "nine", "agent_1": "six"}]
    parts = critic_context_parts("Add.", answers, "agent_0", 1)      # task, 2 turn-0 answers, agent_1's, header
    assert len(parts) == 5
    decode = critic.policy.tokenizer.decode
    budget = critic.max_context_tokens
    try:
        critic.max_context_tokens = 200                             # room for every part
        whole = critic.context_ids(parts)
        task, _ = critic.split_context_ids(parts)
        for shared in (1, 2, 3, 4):
            first, rest = critic.split_context_ids(parts, shared=shared)
            assert first + rest == whole
        first, rest = critic.split_context_ids(parts, shared=3)
        assert first[:len(task)] == task and "five" in decode(first) and "four" in decode(first)
        assert "six" not in decode(first) and "six" in decode(rest)
    finally:
        critic.max_context_tokens = budget
    # 32 tokens drop the oldest answers: the shared piece holds only the earlier turns the context keeps
    first, rest = critic.split_context_ids(parts, shared=3)
    assert first + rest == critic.context_ids(parts) and len(first + rest) <= 32 < len(whole)
    assert "five" not in decode(first + rest) and "six" in decode(rest)
    with pytest.raises(ValueError, match="shared >= 1"):
        critic.split_context_ids(parts, shared=0)
