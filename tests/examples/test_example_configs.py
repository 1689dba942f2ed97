"""The examples read their configs from recipes under ``examples/configs/`` and declare only their own flags.

The expectations are literals recorded from the scripts as they were when every flag was hand-written
(their ``MAGRPOConfig(...)``/``MAPPOConfig(...)`` calls at default arguments): a recipe must give the
same run.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from tests.scripts import load_script
from trainers.common.arguments import build_config, read_recipe
from trainers.experimental import ExperimentalMAGRPOConfig
from trainers.magrpo import MAGRPOConfig
from trainers.mappo import MAPPOConfig

ROOT = Path(__file__).resolve().parents[2]

# the fields each script set away from its config class's defaults, and its own flags' defaults
RECORDED = {
    "examples/magrpo_debate.py": (MAGRPOConfig, {
        "max_new_tokens": 40, "learning_rate": 0.0002, "max_steps": 24, "eval_tasks": 200,
        "output_dir": "outputs/magrpo_debate", "save_every": 10, "prompts_per_step": 2, "micro_batch_size": 32},
        {"env": "arithmetic_debate-v0", "num_turns": 2, "samples": 4, "threads": None, "seeds": None,
         "model": "smollm2-135m", "greedy": True, "resume": None, "overwrite": False}),
    "examples/mappo_debate.py": (MAPPOConfig, {
        "max_new_tokens": 40, "learning_rate": 0.0002, "kl_coef": 0.0, "max_steps": 20, "eval_tasks": 200,
        "output_dir": "outputs/mappo_debate", "save_every": 8, "reward_rule": "last_turn", "alpha1": 0.2,
        "beta1": 0.2, "episodes_per_step": 10, "ppo_epochs": 1, "minibatch_size": 16},
        {"env": "arithmetic_debate-v0", "num_turns": 2, "samples": 4, "threads": None, "seeds": None,
         "model": "smollm2-135m", "greedy": True, "resume": None, "overwrite": False}),
    "examples/magrpo_tldr.py": (ExperimentalMAGRPOConfig, {
        "temperature": 0.8, "learning_rate": 0.0002, "kl_coef": 0.02, "max_steps": 20, "eval_tasks": 40,
        "output_dir": "outputs/magrpo_tldr", "save_every": 10, "prompts_per_step": 2},
        {"train_minutes": None, "no_repeat_ngram": 3, "lora_rank": 8, "plain_reward": False, "semantic_judge": False,
         "max_post_words": 400, "eval_split": "validation", "monitor_tasks": 6, "monitor_every": 5, "threads": None,
         "judge_checkpoint": None, "model": "smollm2-135m", "overwrite": False}),
    "examples/grpo_vs_magrpo.py": (MAGRPOConfig, {
        "max_new_tokens": 48, "learning_rate": 0.0001, "max_steps": 30, "eval_tasks": 64,
        "output_dir": "outputs/grpo_vs_magrpo/magrpo", "report_to": ("jsonl",), "prompts_per_step": 2},
        {"env": "arithmetic_debate-v0", "model": "smollm2-135m", "tiny": False, "num_agents": 2, "num_turns": 1,
         "out": "outputs/grpo_vs_magrpo", "overwrite": False}),
}


def away_from_defaults(config) -> dict:
    defaults = type(config)().to_dict()
    return {k: v for k, v in config.to_dict().items() if v != defaults[k]}


@pytest.mark.parametrize("script", sorted(RECORDED))
def test_default_arguments_give_the_recorded_config_and_own_flags(script):
    config_cls, fields, own = RECORDED[script]
    config, args = load_script(script).parse_args([])
    assert type(config) is config_cls
    assert away_from_defaults(config) == fields
    assert vars(args) == own


@pytest.mark.parametrize("script", sorted(RECORDED))
def test_flags_override_the_recipe_and_help_shows_the_recipes_values(script, capsys):
    module = load_script(script)
    config, _ = module.parse_args(["--steps", "3", "--learning-rate", "1e-3", "--seed", "7"])
    assert (config.max_steps, config.learning_rate, config.seed) == (3, 1e-3, 7)
    with pytest.raises(SystemExit):
        module.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    max_steps = RECORDED[script][1]["max_steps"]
    assert f"--max-steps INT, --steps INT Training steps (each: one collect, then one update). (default: " \
           f"{max_steps})" in text


@pytest.mark.parametrize("script", sorted(RECORDED))
def test_a_bad_value_is_a_usage_error(script, capsys):
    with pytest.raises(SystemExit) as info:
        load_script(script).parse_args(["--steps", "two"])
    assert info.value.code == 2
    assert f"{RECORDED[script][0].__name__}.max_steps expects an integer, got 'two'" in capsys.readouterr().err


def test_every_recipe_is_a_valid_config_of_its_example():
    recipes = sorted((ROOT / "examples" / "configs").glob("*.yaml"))
    assert {r.stem for r in recipes} == {Path(s).stem for s in RECORDED}
    for recipe in recipes:
        config_cls = RECORDED[f"examples/{recipe.stem}.py"][0]
        assert dataclasses.is_dataclass(build_config(config_cls, read_recipe(recipe)))
        assert f"configs/{recipe.name}" in (ROOT / "examples" / f"{recipe.stem}.py").read_text()


def test_the_examples_declare_only_their_own_flags():
    """No example (nor the shared debate parser) hand-writes a flag named after a config field."""
    fields = {f"--{f.name.replace('_', '-')}" for c in (MAGRPOConfig, MAPPOConfig) for f in dataclasses.fields(c)}
    for path in [*sorted((ROOT / "examples").glob("*.py")), ROOT / "trainers" / "common" / "experiment.py"]:
        if path.name == "collaboration_study.py":      # the study's own StudyConfig, moving to studies/
            continue
        declared = set(re.findall(r"add_argument\(\s*\"(--[a-z0-9-]+)\"", path.read_text()))
        declared -= OWN_FLAGS_NAMED_LIKE_FIELDS.get(path.name, set())
        assert not declared & fields, f"{path.name} restates {sorted(declared & fields)}"


# the TL;DR example's judged summaries are decoded with --no-repeat-ngram; its training samples' guard, the
# field no_repeat_ngram, is --train-no-repeat-ngram
OWN_FLAGS_NAMED_LIKE_FIELDS = {"magrpo_tldr.py": {"--no-repeat-ngram"}}


@pytest.mark.parametrize("algorithm", ["magrpo", "mappo"])
def test_llm_marl_train_reads_a_debate_recipe_as_the_example_does(algorithm, tiny_model_dir, monkeypatch, capsys,
                                                                  tmp_path):
    import types

    import trainers.magrpo
    import trainers.mappo
    from llm_marl.cli import main

    seen = []

    class RecordingTrainer:          # stands in for the trainer: records the config the command built
        def __init__(self, env, team, config, eval_env=None):
            seen.append(config)
            self.distributed = types.SimpleNamespace(is_main=False)

        def train(self):
            return []

    package = trainers.magrpo if algorithm == "magrpo" else trainers.mappo
    monkeypatch.setattr(package, f"{algorithm.upper()}Trainer", RecordingTrainer)
    recipe = ROOT / "examples" / "configs" / f"{algorithm}_debate.yaml"
    monkeypatch.chdir(tmp_path)      # the recipe's relative output_dir lands here, not in the checkout
    assert main(["train", algorithm, "arithmetic_debate-v0", "--num-agents", "2", "--num-turns", "2",
                 "--config", str(recipe), "--model", str(tiny_model_dir), "--no-eval"]) == 0, capsys.readouterr().err
    example_config, _ = load_script(f"examples/{algorithm}_debate.py").parse_args([])
    assert seen == [example_config]
