"""A training checkpoint records its team (team.json) and `load_team` reads it back with every agent's weights."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llm_marl.models import load
from llm_marl.team import Team
from llm_marl.team_checkpoint import find_checkpoint, load_team, read_manifest
from llm_marl_envs import make
from trainers.common.checkpoint import save_checkpoint
from trainers.magrpo import MAGRPOConfig, MAGRPOTrainer

ENV = "arithmetic_debate-v0"
SEED = 3
AGENTS = ["agent_0", "agent_1"]


def perturb(team: Team, seed: int) -> None:
    """Move every agent's trainable weights far from the untrained ones (LoRA B starts at zero: a no-op adapter)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for agent in team.agents:
            for param in team.policy(agent).trainable_parameters(team.adapter(agent)):
                if team.adapter(agent) is not None or param.ndim == 2:
                    param.add_(0.5 * torch.randn(param.shape, generator=generator))


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory):
    """A shared-LoRA team on the tiny model, perturbed, then one MAGRPO step; the trainer (it saved at the end)."""
    model, tokenizer = load(str(tiny_model_dir))
    team = Team.shared_lora(model, tokenizer, AGENTS, name=str(tiny_model_dir))
    perturb(team, seed=0)
    config = MAGRPOConfig(num_generations=2, max_new_tokens=8, max_steps=1, eval_tasks=2, report_to=("jsonl",),
                          progress=False, seed=SEED, output_dir=str(tmp_path_factory.mktemp("magrpo")))
    trainer = MAGRPOTrainer(make(ENV, num_agents=2, num_turns=1, split="train"), team, config,
                            eval_env=make(ENV, num_agents=2, num_turns=1, split="test"))
    trainer.train()
    return trainer


@pytest.fixture(scope="module")
def full_checkpoint(tiny_model_dir, tmp_path_factory):
    """A fully fine-tuned team (one model per agent), perturbed and saved; ``(team, output_dir)``."""
    name = str(tiny_model_dir)
    team = Team.separate([load(name) for _ in AGENTS], AGENTS, names=[name] * len(AGENTS))
    perturb(team, seed=1)
    optimizers = {a: torch.optim.AdamW(team.policy(a).trainable_parameters(None)) for a in AGENTS}
    output_dir = tmp_path_factory.mktemp("full")
    save_checkpoint(output_dir, 4, team, optimizers, {}, {}, env=make(ENV, num_agents=2, num_turns=1))
    return team, output_dir




def test_checkpoint_records_its_team(trained, tiny_model_dir):
    output_dir = Path(trained.config.output_dir)
    step = output_dir / "checkpoints" / "step-000001"
    assert find_checkpoint(output_dir) == find_checkpoint(output_dir / "checkpoints") == find_checkpoint(step) == step
    manifest = read_manifest(step)
    assert manifest["agents"] == AGENTS and manifest["step"] == 1
    assert manifest["env"] == {"id": ENV, "num_agents": 2, "num_turns": 1}
    for agent in AGENTS:
        member = manifest["members"][agent]
        assert (member["model"], member["policy"], member["adapter"], member["weights"]) == (
            str(tiny_model_dir), 0, agent, "lora")
        assert (member["lora"]["r"], member["lora"]["lora_alpha"]) == (8, 16)
        assert "model.layers.0.self_attn.q_proj" in member["lora"]["target_modules"]
    assert not list((output_dir / "checkpoints").glob(".tmp-*"))        # the manifest was written before the rename


@pytest.mark.parametrize("layout", ["lora", "full"])
def test_load_team_restores_every_agents_trained_weights(layout, trained, full_checkpoint, tiny_model_dir):
    team, output_dir = (trained.team, trained.config.output_dir) if layout == "lora" else full_checkpoint
    assert {m["weights"] for m in read_manifest(find_checkpoint(output_dir))["members"].values()} == {layout}
    loaded = load_team(output_dir, AGENTS, [str(tiny_model_dir)])
    assert (loaded.policy("agent_0") is loaded.policy("agent_1")) == (layout == "lora")    # seated as trained
    for agent in AGENTS:
        adapter = team.adapter(agent)
        assert loaded.adapter(agent) == adapter
        saved = team.policy(agent).trainable_state_dict(adapter)
        back = loaded.policy(agent).trainable_state_dict(adapter)
        assert saved.keys() == back.keys() and all(torch.equal(saved[k], back[k]) for k in saved)

