"""The MAGRPO benchmark's env, reward and helpers, and the TL;DR example's statistics (no real model)."""
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from llm_marl.models import tiny_model
from llm_marl_envs.testing import text_env_api_test
from llm_marl.team import Team
from trainers.magrpo import MAGRPOConfig, MAGRPOTrainer

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str):
    """Import a script of benchmarks/ or examples/ as a module (they are not packages)."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


bench = load_script("benchmarks/magrpo_vs_comlrl.py")
example = load_script("examples/magrpo_tldr.py")


def test_length_ratio_reward_is_the_peers_capped_char_ratio():
    assert bench.length_ratio_reward("abcd", "abcdefgh") == 2.0
    assert bench.length_ratio_reward("ab", "x" * 100) == 3.0            # capped
    assert bench.length_ratio_reward("", "abc") == 3.0                  # max(1, len(first))
    assert bench.length_ratio_reward("abc", "") == 0.0


def test_length_ratio_env_passes_the_text_env_checks():
    text_env_api_test(lambda: bench.LengthRatioEnv(num_tasks=3))


def test_length_ratio_env_prompts_and_joint_reward():
    env = bench.LengthRatioEnv(num_tasks=2)
    _, infos = env.reset(seed=0, options={"task_index": 1})
    assert infos["agent_0"]["messages"] == [{"role": "user", "content": "Summarize in one sentence:\n" + bench.PEER_TEXT}]
    assert infos["agent_1"]["messages"][0]["content"].startswith("Write a detailed summary:\n")
    _, rewards, terminations, _, infos = env.step({"agent_0": "short", "agent_1": "a much longer text"})
    assert rewards == {"agent_0": 3.0, "agent_1": 3.0} and all(terminations.values())   # 18/5 chars, capped at 3
    assert infos["agent_0"]["verdict"].details["chars"] == [5, 18]
    with pytest.raises(ValueError, match="exactly 2 agents"):
        bench.LengthRatioEnv(num_agents=3)


def test_magrpo_trains_on_the_benchmark_env(tmp_path, one_torch_thread):
    torch.manual_seed(0)
    model, tokenizer = tiny_model(seed=0)
    team = Team.separate([(model, tokenizer), tiny_model(seed=1)])           # full fine-tune, like the benchmark
    config = MAGRPOConfig(num_generations=2, max_new_tokens=6, max_steps=1, prompts_per_step=2, eval_tasks=0,
                          max_grad_norm=None, normalize_advantages=True, report_to=(), progress=False,
                          output_dir=str(tmp_path))
    history = MAGRPOTrainer(bench.LengthRatioEnv(num_tasks=2), team, config).train()
    assert history[0]["step"] == 1 and 0.0 <= history[0]["joint_reward_mean"] <= 3.0


def test_peer_line_parsing_and_missing_interpreter_error(tmp_path, monkeypatch):
    out = "noise\ncomlrl_magrpo prompts=4 seconds=67.6 s_per_prompt=16.90\n"
    assert bench.parse_peer_line(out) == {"prompts": 4, "seconds": 67.6, "s_per_prompt": 16.9}
    with pytest.raises(ValueError, match="printed no"):
        bench.parse_peer_line("Traceback ...")
    monkeypatch.delenv("COMLRL_PYTHON", raising=False)
    with pytest.raises(SystemExit, match="pip install torch==2.13.0 comlrl"):
        bench.comlrl_python(str(tmp_path / "missing" / "python"))
    monkeypatch.setenv("COMLRL_PYTHON", str(tmp_path / "env" / "python"))
    with pytest.raises(SystemExit, match=r"env/python' \(from \$COMLRL_PYTHON\) not found"):
        bench.comlrl_python(None)
    monkeypatch.delenv("COMLRL_PYTHON")
    monkeypatch.setenv("LLM_MARL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(SystemExit, match=r"(?s)\(from the default\) not found.*python -m venv .*cache/comlrl-venv"):
        bench.comlrl_python(None)
    python = tmp_path / "cache" / "comlrl-venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    assert bench.comlrl_python(None) == str(python)


def test_example_paired_difference_counts_posts():
    before = {"rewards": [0.5, 0.5, 1.0, 2.0]}
    after = {"rewards": [1.5, 0.5, 2.0, 1.0]}
    diff = example.paired_difference(before, after)
    assert diff["mean"] == pytest.approx(0.25)
    assert (diff["improved"], diff["worse"], diff["tied"]) == (2, 1, 1)
    assert diff["ci95"][0] <= diff["mean"] <= diff["ci95"][1]
