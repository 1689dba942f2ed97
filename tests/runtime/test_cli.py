"""The `llm-marl` command line: help, env table, errors with exit status 2, bench + report on a tiny model."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest

from llm_marl.cli import main
from llm_marl_envs import list_envs


@pytest.mark.parametrize("argv", [[], ["envs"], ["bench"], ["train"], ["report"], ["export"]])
def test_help_everywhere(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    assert "usage: llm-marl" in capsys.readouterr().out


def test_console_script_entry_point_runs():
    result = subprocess.run([sys.executable, "-m", "llm_marl.cli", "envs"], capture_output=True, text=True,
                            timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stderr
    assert "gsm_symbolic_debate-v0" in result.stdout


HEAVY = ("torch", "transformers", "datasets", "peft", "trl", "accelerate", "llama_cpp", "sympy")
IMPORTS_AFTER = """
import json, sys
from llm_marl.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)))
"""


@pytest.mark.parametrize("argv", [["--help"], ["envs"], ["envs", "--help"], ["bench", "--help"], ["train", "--help"],
                                  ["train", "magrpo", "--help"], ["report", "--help"], ["export", "--help"],
                                  ["info", "--help"]])
def test_help_and_the_env_table_import_no_heavy_package_and_no_env_module(argv):
    result = subprocess.run([sys.executable, "-c", IMPORTS_AFTER, *argv], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stderr
    modules = json.loads(result.stdout.splitlines()[-1])
    assert "llm_marl.cli" in modules
    assert [m for m in modules if m.split(".")[0] in HEAVY] == []
    assert [m for m in modules if m.startswith(("llm_marl_envs.envs.", "llm_marl.backends"))] == []
    if argv[:2] != ["train", "magrpo"]:          # only `train ALGORITHM` reads a config class
        assert [m for m in modules if m.split(".")[0] == "trainers"] == []


def test_envs_table_lists_every_registered_env(capsys):
    assert main(["envs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["id", "agents", "turns", "data", "source", "verifier"]
    listed = {line.split()[0] for line in lines[2:]}
    assert listed == set(list_envs())
    gsm = next(line for line in lines if line.startswith("gsm_symbolic_debate-v0"))
    assert "reasoning-gym" in gsm and "verify_answer" in gsm


def test_unknown_env_is_a_user_error(capsys):
    assert main(["bench", "no_such_env-v0", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "unknown environment id 'no_such_env-v0'" in err and "gsm_symbolic_debate-v0" in err


def test_bad_argument_values_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["bench", "gsm_symbolic_debate-v0", "--episodes", "many"])
    assert info.value.code == 2
    assert main(["bench", "gsm_symbolic_debate-v0", "--episodes", "0", "--quiet"]) == 2
    assert "episodes must be an int >= 1" in capsys.readouterr().err


def test_model_and_models_together_are_refused(capsys):
    with pytest.raises(SystemExit) as info:
        main(["bench", "arithmetic_debate-v0", "--model", "a", "--models", "b,c"])
    assert info.value.code == 2
    assert "not allowed with argument --model" in capsys.readouterr().err


def test_unreachable_server_is_a_user_error(tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = main(["bench", "gsm_symbolic_debate-v0", "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}/v1",
                 "--model", "m", "--episodes", "1", "--num-agents", "1", "--num-turns", "1", "--max-new-tokens", "4",
                 "--out", str(tmp_path / "run"), "--quiet"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port}" in err and "--base-url" in err


def test_missing_data_is_a_user_error(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("LLM_MARL_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = main(["bench", "gsm8k_debate-v0", "--data-dir", str(tmp_path / "empty"), "--episodes", "1", "--quiet",
                 "--out", str(tmp_path / "run")])
    assert code == 2
    assert str(tmp_path / "empty") in capsys.readouterr().err


def test_report_of_a_non_run_directory_is_a_user_error(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "not a benchmark run directory" in capsys.readouterr().err


@pytest.mark.parametrize("algorithm, config_name", [("magrpo", "MAGRPOConfig"), ("mappo", "MAPPOConfig")])
def test_train_help_lists_every_config_field_with_its_default_and_help(algorithm, config_name, capsys):
    import dataclasses

    import trainers.magrpo
    import trainers.mappo
    from trainers.common.arguments import format_value

    config_cls = getattr(trainers.magrpo if algorithm == "magrpo" else trainers.mappo, config_name)
    with pytest.raises(SystemExit) as info:
        main(["train", algorithm, "--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    defaults = config_cls()
    for field in dataclasses.fields(config_cls):
        assert f"--{field.name.replace('_', '-')} " in text, field.name
        shown = f"{' '.join(field.metadata['help'].split())} (default: {format_value(getattr(defaults, field.name))})"
        assert shown in text, field.name
    assert f"{config_name} fields" in text and "--seed INT Seed of task sampling" in text
    assert "--threads N torch threads" in text and "--output-dir STR, --out STR" in text


def test_train_config_comes_from_defaults_yaml_flags_then_set(tiny_model_dir, tmp_path, monkeypatch, capsys):
    import torch

    import trainers.magrpo

    seen = []

    class RecordingTrainer:          # stands in for MAGRPOTrainer: records the config and threads of the command
        def __init__(self, env, team, config, eval_env=None):
            seen.append((config, torch.get_num_threads()))
            self.distributed = types.SimpleNamespace(is_main=True)

        def train(self):
            return []

    monkeypatch.setattr(trainers.magrpo, "MAGRPOTrainer", RecordingTrainer)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("learning_rate: 1e-5\nmax_steps: 7\nseed: 3\nnum_generations: 2\nreport_to: [jsonl]\n")
    threads = torch.get_num_threads()
    try:
        code = main(["train", "magrpo", "arithmetic_debate-v0", "--model", str(tiny_model_dir), "--config", str(recipe),
                     "--max-steps", "9", "--seed", "4", "--set", "seed=5", "--set", "top_p=0.5", "--threads", "1",
                     "--out", str(tmp_path / "out"), "--num-agents", "2", "--no-eval"])
    finally:
        torch.set_num_threads(threads)
    assert code == 0, capsys.readouterr().err
    (config, used_threads), = seen
    assert (config.learning_rate, config.max_steps, config.seed, config.top_p, config.num_generations) == (
        1e-5, 9, 5, 0.5, 2)
    assert config.report_to == ("jsonl",) and config.output_dir == str(tmp_path / "out") and used_threads == 1
    assert f"outputs in {tmp_path / 'out'}" in capsys.readouterr().out


USAGE_ERROR = """
import json, sys
from llm_marl.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


@pytest.mark.parametrize("argv, message", [
    (["--set", "max_steps=two"], "llm-marl train: error: MAGRPOConfig.max_steps expects an integer, got 'two'"),
    (["--max-steps", "two"], "llm-marl train magrpo: error: argument --max-steps: MAGRPOConfig.max_steps expects an "
                             "integer, got 'two'"),
    (["--set", "learning_rat=1e-5"], "llm-marl train: error: unknown MAGRPOConfig field(s) ['learning_rat']; did you "
                                     "mean 'learning_rate'?"),
    (["--config", "{recipe}"], "llm-marl train: error: MAGRPOConfig.num_generations expects an integer, got [2]"),
    (["--set", "num_generations=1"], "llm-marl train: error: num_generations must be >= 2 for group-relative "
                                     "advantages, got 1"),
    (["--threads", "0"], "llm-marl train magrpo: error: argument --threads: expected an integer >= 1, got '0'"),
    ("no_such_env-v0", "llm-marl train: error: unknown environment id 'no_such_env-v0'; registered ids: ["),
    ("ppo", "llm-marl train: error: argument algorithm: invalid choice: 'ppo' (choose from 'magrpo', 'mappo')"),
], ids=["set", "flag", "unknown_field", "yaml_list", "post_init", "threads", "unknown_env", "unknown_trainer"])
def test_train_usage_errors_are_one_line_exit_2_and_load_no_torch(argv, message, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("learning_rate: 1e-5\nnum_generations: [2]\n")
    if argv == "no_such_env-v0":
        argv = ["train", "magrpo", "no_such_env-v0"]
    elif argv == "ppo":
        argv = ["train", "ppo", "arithmetic_debate-v0"]
    else:
        argv = ["train", "magrpo", "arithmetic_debate-v0", *[a.format(recipe=recipe) for a in argv]]
    result = subprocess.run([sys.executable, "-c", USAGE_ERROR, *argv], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parents[2])
    outcome = json.loads(result.stdout.splitlines()[-1])
    assert outcome["code"] == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("usage:")]
    assert len(errors) == 1 and errors[0].startswith(message), result.stderr
    assert [m for m in outcome["modules"] if m.split(".")[0] in HEAVY] == []
    assert "llm_marl.team" not in outcome["modules"] and "trainers.magrpo.trainer" not in outcome["modules"]


def test_train_missing_config_file_is_a_user_error(tmp_path, capsys):
    code = main(["train", "magrpo", "gsm_symbolic_debate-v0", "--config", str(tmp_path / "missing.yaml")])
    assert code == 2
    err = capsys.readouterr().err
    assert "missing.yaml" in err and "does not exist" in err


def test_bench_then_report_end_to_end(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["bench", "gsm_symbolic_debate-v0", "--model", str(tiny_model_dir), "--backend", "hf", "--episodes", "2",
            "--num-agents", "2", "--num-turns", "2", "--max-new-tokens", "8", "--seed", "1", "--out", str(out),
            "--quiet"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "2 episodes" in printed and str(out / "report.html") in printed
    for name in ("run.json", "episodes.jsonl", "summary.json", "report.md", "report.html", "accuracy_per_turn.png",
                 "transitions.png"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    (out / "summary.json").unlink()
    (out / "report.md").unlink()
    assert main(["report", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text()) == summary
    assert "# Benchmark: gsm_symbolic_debate-v0" in (out / "report.md").read_text()


def test_bench_compares_baselines_on_the_same_tasks(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "compare"
    argv = ["bench", "arithmetic_debate-v0", "--model", str(tiny_model_dir), "--backend", "hf", "--episodes", "2",
            "--baseline", "single,majority,debate", "--num-agents", "2", "--num-turns", "2", "--max-new-tokens", "4",
            "--out", str(out), "--quiet"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "debate 2x2, majority of 4" in printed and "team answer debate - single" in printed
    result = json.loads((out / "comparison.json").read_text())
    assert list(result["baselines"]) == ["single", "majority", "debate"] and result["num_paired_tasks"] == 2
    assert [result["baselines"][b]["env_shape"] for b in result["baselines"]] == [[1, 1], [4, 1], [2, 2]]
    tasks = [[json.loads(line)["task_index"] for line in (out / b / "episodes.jsonl").read_text().splitlines()]
             for b in ("single", "majority", "debate")]
    assert tasks[0] == tasks[1] == tasks[2]
    page = (out / "report.html").read_text()
    assert all(f'id="ep-{b}-1"' in page for b in ("single", "majority", "debate"))
    assert (out / "comparison.png").read_bytes()[:4] == b"\x89PNG" and "| debate − single |" in (
        out / "comparison.md").read_text()
    (out / "comparison.json").unlink()
    assert main(["report", str(out)]) == 0
    assert json.loads((out / "comparison.json").read_text()) == result
    assert main(["bench", "arithmetic_debate-v0", "--baseline", "single,vote", "--out", str(tmp_path / "x")]) == 2
    assert "unknown baseline(s) ['vote']" in capsys.readouterr().err


def test_train_magrpo_end_to_end_on_a_tiny_model(tiny_model_dir, tmp_path, capsys):
    config = tmp_path / "magrpo.yaml"
    config.write_text("num_generations: 2\nmax_new_tokens: 4\nmax_steps: 1\neval_tasks: 2\nreport_to: [jsonl]\n"
                      "progress: false\n")
    out = tmp_path / "out"
    code = main(["train", "magrpo", "gsm_symbolic_debate-v0", "--model", str(tiny_model_dir), "--config", str(config),
                 "--set", "learning_rate=1e-4", "--num-agents", "2", "--num-turns", "1", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    assert "trained magrpo on gsm_symbolic_debate-v0" in capsys.readouterr().out
    assert (out / "metrics.jsonl").is_file()


def test_train_unknown_config_field_is_a_user_error(tmp_path, capsys):
    code = main(["train", "magrpo", "gsm_symbolic_debate-v0", "--set", "learning_rat=1e-4", "--out", str(tmp_path)])
    assert code == 2
    assert "unknown MAGRPOConfig field(s) ['learning_rat']" in capsys.readouterr().err


def test_train_trains_on_the_train_split_and_evaluates_on_test(tiny_model_dir, tmp_path, monkeypatch, capsys):
    import trainers.mappo

    built = []

    class RecordingTrainer:          # stands in for MAPPOTrainer: records the envs the command builds
        def __init__(self, env, team, config, eval_env=None):
            built.append((env.split, eval_env.split if eval_env is not None else None))
            self.distributed = types.SimpleNamespace(is_main=False)

        def train(self):
            return []

    monkeypatch.setattr(trainers.mappo, "MAPPOTrainer", RecordingTrainer)
    base = ["train", "mappo", "anli_debate-v1", "--model", str(tiny_model_dir), "--out", str(tmp_path), "--no-eval"]
    assert main(base) == 0, capsys.readouterr().err
    assert main(base + ["--split", "dev", "--eval-split", "test", "--overwrite"]) == 0
    assert built == [("train", "test"), ("dev", "test")]
    assert main(base + ["--split", "test"]) == 2
    assert "--split and --eval-split are both 'test'" in capsys.readouterr().err
