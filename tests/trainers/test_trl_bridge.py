"""TRL bridge: one GRPOTrainer step on a tiny model drives whole multi-agent episodes and changes the weights."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")
from trl import GRPOConfig  # noqa: E402

from llm_marl.models import tiny_model  # noqa: E402
from llm_marl.policy import SamplingParams  # noqa: E402
from tests.toy_env import SayNumberEnv  # noqa: E402
from trainers.trl_bridge import evaluate_shared_policy, make_grpo_trainer  # noqa: E402


def grpo_args(tmp_path, **overrides) -> GRPOConfig:
    settings = dict(output_dir=str(tmp_path), num_generations=8, per_device_train_batch_size=8, max_steps=1,
                    max_completion_length=6, learning_rate=1e-2, temperature=1.0, report_to="none",
                    save_strategy="no", logging_steps=1, use_cpu=True, bf16=False, seed=0, beta=0.0)
    return GRPOConfig(**{**settings, **overrides})


def test_one_grpo_step_plays_whole_debates_and_updates_the_shared_policy(tmp_path, one_torch_thread):
    env = SayNumberEnv(num_agents=2, num_turns=2, num_tasks=4)
    model, tokenizer = tiny_model(seed=0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = make_grpo_trainer(env, model, tokenizer, grpo_args(tmp_path), tasks=[0, 1, 2])
    rows = []
    rollout = trainer.rollout_func
    trainer.rollout_func = lambda prompts, t: rows.append(rollout(prompts, t)) or rows[-1]
    trainer.train()
    trainer.rollout_func = rollout

    (out,) = rows
    assert len(out["prompt_ids"]) == 8                      # 2 episodes x 2 agents x 2 turns of one task
    assert out["agent"] == ["agent_0", "agent_1"] * 4 and out["turn"] == [0, 0, 1, 1] * 2
    turn1 = tokenizer.decode(out["prompt_ids"][2])
    said = tokenizer.decode(out["completion_ids"][1], skip_special_tokens=True).strip()
    assert "agent_1 said" in turn1 and said[:10] in turn1    # agent 0's turn-1 prompt carries agent 1's answer
    assert all(len(c) == len(lp) for c, lp in zip(out["completion_ids"], out["logprobs"]))
    assert out["env_reward"][:4] == [out["env_reward"][0]] * 4       # one team reward per episode
    assert len(set(out["env_reward"])) > 1                   # graded rewards: the two episodes differ
    changed = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert changed, "no weight changed after one GRPO step"

    result = evaluate_shared_policy(trainer, SayNumberEnv(num_agents=2, num_turns=2, num_tasks=4), [3], [0],
                                    SamplingParams(max_new_tokens=4, temperature=0.0),
                                    report_path=tmp_path / "eval" / "report.html")
    assert result.num_episodes == 1 and len(result.episodes[0]["responses"]) == 2
    assert 'id="ep-eval-0"' in (tmp_path / "eval" / "report.html").read_text()


def test_num_generations_must_hold_whole_episodes(tmp_path):
    env = SayNumberEnv(num_agents=2, num_turns=2, num_tasks=4)
    model, tokenizer = tiny_model(seed=0)
    with pytest.raises(ValueError, match=r"multiple of agents × turns = 2 × 2 = 4.*got 6"):
        make_grpo_trainer(env, model, tokenizer, grpo_args(tmp_path, num_generations=6, per_device_train_batch_size=6))
