"""Configs that parse themselves: coercion, flags, recipes (``trainers.common.arguments``)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainers.common.arguments import (
    add_config_arguments,
    build_config,
    coerce,
    config_from_args,
    config_parser,
    describe,
    parse_config,
    parse_overrides,
    read_recipe,
)
from trainers.magrpo.config import MAGRPOConfig
from trainers.mappo.config import MAPPOConfig

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "datasets", "peft", "trl", "accelerate", "llama_cpp")


def test_the_configs_and_their_parser_import_no_heavy_package():
    code = ("import json, sys\nimport trainers.magrpo, trainers.mappo, trainers.common.arguments\n"
            "print(json.dumps(sorted(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    modules = json.loads(result.stdout)
    assert "trainers.magrpo.config" in modules and "trainers.mappo.config" in modules
    assert [m for m in modules if m.split(".")[0] in HEAVY] == []
    from trainers.magrpo import MAGRPOTrainer  # the trainers load on first use
    from trainers.mappo import MAPPOTrainer

    assert MAGRPOTrainer.__name__ == "MAGRPOTrainer" and MAPPOTrainer.__name__ == "MAPPOTrainer"


@pytest.mark.parametrize("name, value, expected", [
    ("learning_rate", "1e-5", 1e-5),            # PyYAML reads 1e-5 (no dot) as a string
    ("learning_rate", 2, 2.0),
    ("max_steps", "2", 2),
    ("max_steps", 3.0, 3),
    ("progress", "false", False),
    ("progress", True, True),
    ("report_to", "jsonl,tensorboard", ("jsonl", "tensorboard")),
    ("report_to", ["jsonl"], ("jsonl",)),
    ("report_to", "[jsonl]", ("jsonl",)),
    ("report_to", "", ()),
    ("max_grad_norm", "null", None),
    ("max_grad_norm", None, None),
    ("max_grad_norm", "0.5", 0.5),
    ("agent_learning_rates", "{agent_0: 1e-4}", {"agent_0": 1e-4}),
    ("agent_learning_rates", {"agent_0": "1e-4"}, {"agent_0": 1e-4}),
    ("output_dir", 2024, "2024"),
    ("resume_from_checkpoint", "latest", "latest"),
])
def test_values_are_coerced_to_the_fields_type(name, value, expected):
    coerced = coerce(MAGRPOConfig, name, value)
    assert coerced == expected and type(coerced) is type(expected)


@pytest.mark.parametrize("name, value, message", [
    ("max_steps", "two", "MAGRPOConfig.max_steps expects an integer, got 'two'"),
    ("num_generations", [2], "MAGRPOConfig.num_generations expects an integer, got [2]"),
    ("max_steps", "2.5", "MAGRPOConfig.max_steps expects an integer, got '2.5'"),
    ("learning_rate", True, "MAGRPOConfig.learning_rate expects a number, got True"),
    ("progress", 1, "MAGRPOConfig.progress expects true or false, got 1"),
    ("max_grad_norm", "big", "MAGRPOConfig.max_grad_norm expects a number or null, got 'big'"),
    ("report_to", {"a": 1}, "MAGRPOConfig.report_to expects a list of strings, got {'a': 1}"),
    ("agent_learning_rates", "[1, 2]", "expects a mapping of strings to numbers or null, got '[1, 2]'"),
    ("output_dir", ["a"], "MAGRPOConfig.output_dir expects a string, got ['a']"),
])
def test_a_value_that_does_not_fit_is_one_line_naming_field_value_and_type(name, value, message):
    with pytest.raises(ValueError) as info:
        coerce(MAGRPOConfig, name, value)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_unknown_fields_are_named_with_the_nearest_real_one():
    with pytest.raises(ValueError, match=r"unknown MAGRPOConfig field\(s\) \['learning_rat'\]; did you mean "
                                         r"'learning_rate'\?"):
        build_config(MAGRPOConfig, {"learning_rat": 1e-4})
    with pytest.raises(ValueError, match=r"unknown MAPPOConfig field\(s\) \['zzz'\]; valid fields: "
                                         r"\['agent_devices', "):
        build_config(MAPPOConfig, {"zzz": 1})


def test_build_config_coerces_then_lets_the_config_check_the_rest():
    config = build_config(MAGRPOConfig, {"learning_rate": "1e-5", "max_steps": "3", "report_to": "jsonl"})
    assert (config.learning_rate, config.max_steps, config.report_to) == (1e-5, 3, ("jsonl",))
    with pytest.raises(ValueError, match="num_generations must be >= 2"):
        build_config(MAGRPOConfig, {"num_generations": "1"})


def test_describe_names_types_in_words():
    assert describe(int) == "an integer" and describe(float | None) == "a number or null"
    assert describe(tuple[str, ...]) == "a list of strings"
    assert describe(dict[str, float] | None) == "a mapping of strings to numbers or null"


def test_overrides_keep_the_text_for_the_fields_type():
    assert parse_overrides(["learning_rate=1e-5", "output_dir=runs/a=b", "report_to="]) == {
        "learning_rate": "1e-5", "output_dir": "runs/a=b", "report_to": ""}
    with pytest.raises(ValueError, match="--set expects key=value, got 'lr'"):
        parse_overrides(["lr"])


def test_recipes_are_yaml_mappings(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("learning_rate: 1e-5\nmax_steps: 2\n")
    assert read_recipe(recipe) == {"learning_rate": "1e-5", "max_steps": 2}
    assert build_config(MAGRPOConfig, read_recipe(recipe)).learning_rate == 1e-5
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "bad.yaml").write_text("max_steps: [1\n")
    (tmp_path / "empty.yaml").write_text("")
    assert read_recipe(tmp_path / "empty.yaml") == {}
    with pytest.raises(ValueError, match="must hold a mapping of field names to values, got list"):
        read_recipe(tmp_path / "list.yaml")
    with pytest.raises(ValueError, match="is not valid YAML at line 2"):
        read_recipe(tmp_path / "bad.yaml")
    with pytest.raises(ValueError, match="missing.yaml' does not exist"):
        read_recipe(tmp_path / "missing.yaml")


def test_flags_recipe_and_overrides_in_order_of_precedence(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("learning_rate: 1e-5\nmax_steps: 7\nseed: 3\n")
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, MAGRPOConfig, flags={"max_steps": ["--max-steps", "--steps"]})
    args = parser.parse_args(["--steps", "9", "--seed", "4", "--progress", "--report-to", "jsonl"])
    config = config_from_args(MAGRPOConfig, args, recipe=recipe, overrides={"seed": "5"})
    assert (config.learning_rate, config.max_steps, config.seed, config.progress, config.report_to) == (
        1e-5, 9, 5, True, ("jsonl",))
    assert vars(args) == {}, "the config fields leave the namespace"
    assert config.num_generations == MAGRPOConfig().num_generations


def test_flag_errors_are_usage_errors_naming_the_field(capsys):
    parser = argparse.ArgumentParser(prog="p")
    add_config_arguments(parser, MAGRPOConfig)
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["--max-steps", "two"])
    assert info.value.code == 2
    assert "argument --max-steps: MAGRPOConfig.max_steps expects an integer, got 'two'" in capsys.readouterr().err


def test_help_lists_every_field_with_its_default_and_help(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("max_steps: 24\nlearning_rate: 2e-4\n")
    parser = config_parser(MAGRPOConfig, "d", recipe=recipe, flags={"max_steps": ["--max-steps", "--steps"]},
                           exclude=["fsdp"])
    text = parser.format_help()
    for field in dataclasses.fields(MAGRPOConfig):
        flag = f"--{field.name.replace('_', '-')}"
        assert (flag in text) is (field.name != "fsdp"), field.name
    assert "--max-steps INT, --steps INT" in text
    flat = " ".join(text.split())
    assert "Training steps (each: one collect, then one update). (default: 24)" in flat
    assert "(default: 0.0002)" in flat and "~30% more compute" in flat
    assert "Metric sinks, any of ('jsonl', 'tensorboard', 'wandb', 'trackio') (wandb and trackio only when " \
           "installed: pip install 'llm-marl-envs[trackio]'). (default: jsonl,tensorboard)" in flat
    with pytest.raises(ValueError, match="unknown MAGRPOConfig field"):
        config_parser(MAGRPOConfig, flags={"max_step": ["--steps"]})


def test_parse_config_reads_the_recipe_then_the_flags(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("max_steps: 24\nlearning_rate: 2e-4\n")
    parser = config_parser(MAGRPOConfig, recipe=recipe)
    parser.add_argument("--samples", type=int, default=4)
    config, args = parse_config(parser, MAGRPOConfig, ["--learning-rate", "1e-3"])
    assert (config.max_steps, config.learning_rate, vars(args)) == (24, 1e-3, {"samples": 4})
    other = tmp_path / "other.yaml"
    other.write_text("max_steps: 5\n")
    config, _ = parse_config(parser, MAGRPOConfig, ["--config", str(other)])
    assert (config.max_steps, config.learning_rate) == (5, MAGRPOConfig().learning_rate)
    other.write_text("num_generations: [2]\n")
    with pytest.raises(SystemExit) as info:
        parse_config(parser, MAGRPOConfig, ["--config", str(other)])
    assert info.value.code == 2
    assert "error: MAGRPOConfig.num_generations expects an integer, got [2]" in capsys.readouterr().err
