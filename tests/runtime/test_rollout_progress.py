"""The rollout's progress bar: episodes of a chunk end together at its last turn, so it says each turn played and
estimates the time left from the mean time per episode."""
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


def test_the_progress_bars_eta_is_the_mean_time_per_episode_at_each_chunks_end(one_torch_thread, capsys,
                                                                               monkeypatch):
    """Each generate call takes 50 s of a fake clock: a chunk of 2 episodes × 2 turns ends every 100 s, so at 2 and
    4 of 6 episodes 200 and 100 s are left. An estimate from the last update alone said 8:20 at 1 of 6."""
    import tqdm.std

    from llm_marl.backends.hf import HFPolicy

    clock, generate = [1000.0], HFPolicy.generate

    def slow(policy, *args, **kwargs):
        clock[0] += 50.0
        return generate(policy, *args, **kwargs)

    monkeypatch.setattr(tqdm.std, "time", lambda: clock[0])
    monkeypatch.setattr(HFPolicy, "generate", slow)
    model, tokenizer = tiny_model(seed=0)
    team = Team.adapter_per_agent(model, tokenizer, 2)
    env = llm_marl_envs.make("split_arithmetic-v0", num_turns=2)
    engine = RolloutEngine(env, team, SamplingParams(max_new_tokens=4, temperature=0), progress=True)
    engine.collect(task_indices=list(range(6)), seeds=list(range(6)), parallel=2, desc="evaluate")
    shown = capsys.readouterr().err
    assert "2/6 [01:40<03:20" in shown and "4/6 [03:20<01:40" in shown
    assert "1/6" not in shown and "3/6" not in shown          # a chunk's episodes are counted together
