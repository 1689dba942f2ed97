"""``examples/mappo_debate.py``'s own flags reach the trainer (the run itself is tested with the seed repeats)."""
import json
import sys

import pytest

from tests.scripts import load_script

TINY_RUN = ["--steps", "1", "--eval-tasks", "2", "--samples", "0", "--max-new-tokens", "8", "--threads", "1",
            "--episodes-per-step", "2"]


@pytest.mark.parametrize("flag, rule", [([], "last_turn"), (["--reward-rule", "influence_aware"], "influence_aware")],
                         ids=["default", "influence_aware"])
def test_the_reward_rule_reaches_the_trainer_and_the_recorded_arguments(tmp_path, tiny_model_dir, monkeypatch,
                                                                       flag, rule):
    # the example pays every turn its own last-turn score unless told otherwise (MAPPOConfig's default differs)
    module = load_script("examples/mappo_debate.py")
    rules = []

    class RecordingTrainer(module.MAPPOTrainer):
        def __init__(self, env, team, config, **kwargs):
            rules.append(config.reward_rule)
            super().__init__(env, team, config, **kwargs)

    monkeypatch.setattr(module, "MAPPOTrainer", RecordingTrainer)
    out = tmp_path / rule
    monkeypatch.setattr(sys, "argv", ["mappo_debate.py", "--model", str(tiny_model_dir), *TINY_RUN, *flag,
                                      "--out", str(out)])
    module.main()
    results = json.loads((out / "results.json").read_text())
    assert rules == [rule]
    assert results["arguments"]["reward_rule"] == rule
    assert len(results["train_history"]) == 1
    assert "collaboration_gain" in results["greedy"] and len(results["greedy"]["seats"]["after"]) == 2


def test_an_unknown_reward_rule_is_refused_by_name(monkeypatch, capsys):
    module = load_script("examples/mappo_debate.py")
    monkeypatch.setattr(sys, "argv", ["mappo_debate.py", "--reward-rule", "final_only"])
    with pytest.raises(SystemExit):
        module.main()
    assert "final_only" in capsys.readouterr().err
