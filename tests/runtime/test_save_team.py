"""A team's adapters copied between seats and written as a replay-only checkpoint that load_team reads back."""
from __future__ import annotations

import pytest
import torch

from llm_marl.backends.hf import HFPolicy, rename_adapter
from llm_marl.models import load
from llm_marl.team import Team
from llm_marl.team_checkpoint import find_checkpoint, load_team, read_manifest, save_team
from llm_marl_envs import make

AGENTS = ["agent_0", "agent_1"]


def test_rename_adapter_moves_every_tensor_and_refuses_foreign_names():
    state = {"base_model.model.layers.0.q_proj.lora_A.default.weight": 1, "x.lora_B.default.weight": 2}
    assert rename_adapter(state, "default", "agent_1") == {"base_model.model.layers.0.q_proj.lora_A.agent_1.weight": 1,
                                                           "x.lora_B.agent_1.weight": 2}
    with pytest.raises(ValueError, match="adapter 'agent_0'"):
        rename_adapter(state, "agent_0", "agent_1")
    with pytest.raises(ValueError, match="adapter 'default'"):
        rename_adapter({}, "default", "agent_1")


def perturbed_team(tiny_model_dir) -> Team:
    """A LoRA team on the tiny model whose adapters differ from each other and from a fresh adapter."""
    torch.manual_seed(0)
    model, tokenizer = load(str(tiny_model_dir))
    team = Team.adapter_per_agent(model, tokenizer, AGENTS, name=str(tiny_model_dir))
    with torch.no_grad():
        for agent, scale in zip(AGENTS, (0.01, 0.02)):
            for p in team.policy(agent).trainable_parameters(agent):
                p.add_(scale * torch.randn_like(p))
    return team


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_copy_adapter_gives_one_seat_anothers_weights(tiny_model_dir):
    team = perturbed_team(tiny_model_dir)
    policy: HFPolicy = team.policy("agent_0")
    first = policy.trainable_state_dict("agent_0")
    assert not same(rename_adapter(first, "agent_0", "agent_1"), policy.trainable_state_dict("agent_1"))
    policy.copy_adapter("agent_0", "agent_1")
    assert same(rename_adapter(first, "agent_0", "agent_1"), policy.trainable_state_dict("agent_1"))
    assert same(first, policy.trainable_state_dict("agent_0"))          # the source is left as it was


def test_save_team_writes_a_replay_only_checkpoint_that_load_team_reads(tiny_model_dir, tmp_path):
    team = perturbed_team(tiny_model_dir)
    env = make("arithmetic_debate-v0", num_agents=2, num_turns=2, split="test", num_tasks=4, show_scores=True)
    path = save_team(tmp_path / "team", 7, team, env=env)
    assert path == tmp_path / "team" / "checkpoints" / "step-000007" == find_checkpoint(tmp_path / "team")
    assert sorted(p.name for p in path.iterdir()) == ["agents", "team.json"]    # no optimizer, scheduler, RNG
    manifest = read_manifest(path)
    assert manifest["step"] == 7 and manifest["agents"] == AGENTS
    assert manifest["env"] == {"id": "arithmetic_debate-v0", "num_agents": 2, "num_turns": 2, "show_scores": True}
    loaded = load_team(tmp_path / "team", AGENTS)
    for agent in AGENTS:
        assert same(team.policy(agent).trainable_state_dict(agent), loaded.policy(agent).trainable_state_dict(agent))
    team.policy("agent_0").copy_adapter("agent_1", "agent_0")            # saving the same step again replaces it
    save_team(tmp_path / "team", 7, team)
    again = load_team(tmp_path / "team", AGENTS)
    assert same(team.policy("agent_0").trainable_state_dict("agent_0"),
                again.policy("agent_0").trainable_state_dict("agent_0"))
    assert not list((tmp_path / "team" / "checkpoints").glob(".*"))      # no temp or stale dir left behind
