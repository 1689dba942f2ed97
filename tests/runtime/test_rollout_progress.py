"""The rollout's progress bar: episodes of a chunk end together at its last turn, so it says each turn played."""
import llm_marl_envs
from llm_marl.models import tiny_model
from llm_marl.policy import SamplingParams
from llm_marl.rollout import RolloutEngine
from llm_marl.team import Team


def test_the_progress_bar_tells_each_turn_of_a_chunk(one_torch_thread, capsys):
    model, tokenizer = tiny_model(seed=0)
    team = Team.adapter_per_agent(model, tokenizer, 2)
    env = llm_marl_envs.make("split_arithmetic-v0", num_turns=2)
    engine = RolloutEngine(env, team, SamplingParams(max_new_tokens=4, temperature=0), progress=True)
    engine.collect(task_indices=[0, 1, 2], seeds=[0, 1, 2], desc="evaluate")
    shown = capsys.readouterr().err
    assert "turn 1 played by 3 episodes" in shown
    assert "turn 2 played by 3 episodes" in shown
