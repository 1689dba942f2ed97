"""The `llm-marl` command line: help, env table, errors with exit status 2, bench + report on a tiny model."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from llm_marl.cli import UserError, build_config, main, parse_overrides
from llm_marl_envs import list_envs


@pytest.mark.parametrize("argv", [[], ["envs"], ["bench"], ["train"], ["report"], ["export"]])
def test_help_everywhere(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    assert "usage: llm-marl" in capsys.readouterr().out


def test_console_script_entry_point_runs():
    result = subprocess.run([sys.executable, "-m", "llm_marl.cli", "envs"], capture_output=True, text=True,
                            timeout=120, cwd=Path(__file__).resolve().parents[1])
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
                                  ["report", "--help"], ["export", "--help"], ["info", "--help"]])
def test_help_and_the_env_table_import_no_heavy_package_and_no_env_module(argv):
    result = subprocess.run([sys.executable, "-c", IMPORTS_AFTER, *argv], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == 0, result.stderr
    modules = json.loads(result.stdout.splitlines()[-1])
    assert "llm_marl.cli" in modules
    assert [m for m in modules if m.split(".")[0] in HEAVY] == []
    assert [m for m in modules if m.startswith(("llm_marl_envs.envs.", "llm_marl.backends"))] == []


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


def test_train_overrides_and_config_fields():
    assert parse_overrides(["lr=1e-5", "num_generations=4", "name=abc", "flag=true"]) == {
        "lr": 1e-5, "num_generations": 4, "name": "abc", "flag": True}
    with pytest.raises(UserError, match="key=value"):
        parse_overrides(["lr"])
    import dataclasses

    @dataclasses.dataclass
    class Cfg:
        lr: float = 1.0

    assert build_config(Cfg, {"lr": 0.5}).lr == 0.5
    with pytest.raises(UserError, match=r"unknown Cfg field\(s\) \['lrr'\]; valid fields: \['lr'\]"):
        build_config(Cfg, {"lrr": 0.5})


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
    import types

    import trainers.mappo

    built = []

    class RecordingTrainer:          # stands in for MAPPOTrainer: records the envs the command builds
        def __init__(self, env, team, config, eval_env=None):
            built.append((env.split, eval_env.split if eval_env is not None else None))
            self.distributed = types.SimpleNamespace(is_main=False)

        def train(self):
            return []

    monkeypatch.setattr(trainers.mappo, "MAPPOTrainer", RecordingTrainer)
    base = ["train", "mappo", "anli_debate-v1", "--model", str(tiny_model_dir), "--out", str(tmp_path)]
    assert main(base) == 0, capsys.readouterr().err
    assert main(base + ["--split", "dev", "--eval-split", "test"]) == 0
    assert built == [("train", "test"), ("dev", "test")]
    assert main(base + ["--split", "test"]) == 2
    assert "--split and --eval-split are both 'test'" in capsys.readouterr().err
