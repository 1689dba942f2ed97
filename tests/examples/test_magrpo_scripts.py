"""The MAGRPO benchmark's env, reward and helpers, and the TL;DR example's statistics (no real model)."""
import pytest
import torch

from llm_marl.models import tiny_model
from llm_marl.team import Team
from llm_marl_envs.testing import text_env_api_test
from tests.scripts import load_script
from trainers.magrpo import MAGRPOConfig, MAGRPOTrainer

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
    assert infos["agent_0"]["messages"] == [
        {"role": "user", "content": "Summarize in one sentence:\n" + bench.PEER_TEXT}
    ]
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


def test_peer_runs_in_the_users_environment_not_our_wait_policy():
    """An OpenMP wait policy costs comlrl ~20-35% on an idle machine: the peer must not inherit ours."""
    ours = {"GOMP_SPINCOUNT": "3000", "PATH": "/bin"}
    env = bench.peer_environment(ours, {})
    assert "GOMP_SPINCOUNT" not in env and env["PATH"] == "/bin" and env["WANDB_MODE"] == "disabled"
    users = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert bench.peer_environment({**ours, **users}, users)["OMP_WAIT_POLICY"] == "ACTIVE"   # the user's, for both
    assert "GOMP_SPINCOUNT" not in bench.peer_environment({**ours, **users}, users)
    assert ours == {"GOMP_SPINCOUNT": "3000", "PATH": "/bin"}                                  # ours untouched


def test_benchmark_refuses_zero_repeats():
    with pytest.raises(SystemExit):
        bench.main(["--repeats", "0", "--skip-comlrl", "--skip-memory"])


@pytest.mark.parametrize("turns", ["0", "1,x", ""])
def test_benchmark_refuses_bad_turns(turns):
    with pytest.raises(SystemExit):
        bench.main(["--turns", turns, "--skip-comlrl", "--skip-memory"])


def test_rouge_l_and_distinct_words_measure_what_they_say():
    from llm_marl_envs import metrics

    same, partial, unrelated = metrics.rouge_l(["the cat sat on the mat", "the cat sat", "dogs bark loudly"],
                                               ["the cat sat on the mat"] * 3)
    assert same == pytest.approx(1.0) and unrelated == 0.0
    assert partial == pytest.approx(2 * 1.0 * 0.5 / 1.5)            # LCS 3 of 3 and of 6 tokens: F1 2/3
    assert metrics.rouge_l([""], ["a reference"]) == [0.0]
    with pytest.raises(ValueError, match="one reference per prediction"):
        metrics.rouge_l(["a"], [])
    assert metrics.distinct_word_ratio("SUBREDDIT: " * 10) == pytest.approx(0.1)
    assert metrics.distinct_word_ratio("I lost my keys at work") == 1.0 and metrics.distinct_word_ratio("") == 0.0


def judged(rewards, rouge, degenerate=0.0):
    n = len(rewards)
    return {"task_indices": list(range(n)), "joint_reward": rewards, "rouge_l": {"agent_0": rouge, "agent_1": rouge},
            "degenerate": {"agent_0": [degenerate] * n, "agent_1": [0.0] * n}}


def test_example_calls_a_reward_gain_without_rouge_gain_hacking():
    before = judged([0.5] * 8, [0.2, 0.25, 0.3, 0.2, 0.25, 0.3, 0.2, 0.25])
    hacked = judged([2.7, 2.8, 2.6, 2.9, 2.7, 2.8, 2.6, 2.9], [0.05, 0.1, 0.08, 0.06, 0.1, 0.07, 0.05, 0.09], 1.0)
    difference = example.paired(before, hacked)
    assert difference["joint_reward"]["mean"] == pytest.approx(2.25)
    assert difference["rouge_l"]["agent_0"]["ci95"][1] < 0
    text = example.verdict(difference, example.summary(before), example.summary(hacked))
    assert text.startswith("reward hacking") and "degenerate summaries 100%" in text
    honest = judged([1.5] * 8, [0.4, 0.45, 0.5, 0.4, 0.45, 0.5, 0.4, 0.45])
    text = example.verdict(example.paired(before, honest), example.summary(before), example.summary(honest))
    assert text.startswith("no hacking") and "rose significantly for agent_0, agent_1" in text
    # the same gain with one degenerate agent-0 summary in eight (12% > 5%) is suspect
    suspect = judged([1.5] * 8, [0.4, 0.45, 0.5, 0.4, 0.45, 0.5, 0.4, 0.45], 0.125)
    text = example.verdict(example.paired(before, suspect), example.summary(before), example.summary(suspect))
    assert text.startswith("likely reward hacking") and "degenerate summaries 12%" in text
    with pytest.raises(ValueError, match="same posts"):
        example.paired(before, {**honest, "task_indices": list(range(1, 9))})


def test_example_judges_posts_filtered_like_the_training_posts():
    """Judged posts have at most --max-post-words words, skip the monitor's, and a too-small split is refused."""
    import llm_marl_envs

    test = llm_marl_envs.make(example.ENV_ID, split="test")
    posts = example.held_out_posts(test, 150, 5, skip=3)
    short = [i for i, task in enumerate(test.tasks) if len(task["source"].split()) <= 150]
    assert posts == short[3:8] and len(short) < len(test.tasks)
    validation = llm_marl_envs.make(example.ENV_ID, split="validation")
    with pytest.raises(ValueError, match="too few to judge 100"):
        example.held_out_posts(validation, 400, 100, skip=6)
    assert example.parse_args([])[1].eval_split == "validation"


def test_example_trains_with_the_monitor_and_judges_held_out_posts(tmp_path, one_torch_thread):
    """A 2-step run on the tiny model: the monitor runs at steps 0, 1, 2 and is logged; results and plot are written."""
    import json

    model, tokenizer = tiny_model(seed=0)
    argv = ["--steps", "2", "--monitor-every", "1", "--eval-tasks", "2", "--monitor-tasks", "2", "--max-new-tokens",
            "4", "--num-generations", "2", "--prompts-per-step", "1", "--learning-rate", "5e-2", "--out",
            str(tmp_path / "run")]
    results = example.main(argv, (model, tokenizer))
    assert [m["step"] for m in results["monitor"]] == [0, 1, 2] and results["steps_trained"] == 2
    written = json.loads((tmp_path / "run" / "results.json").read_text())
    assert example.main(argv, (model, tokenizer)) == written              # the same command: reported, not rerun
    with pytest.raises(SystemExit):                                       # another config on its --out: refused
        example.main([*argv, "--learning-rate", "1e-1"], (model, tokenizer))
    held_out = written["held_out"]
    assert held_out["split"] == "validation" and held_out["tasks"] == 2 and written["verdict"] == results["verdict"]
    # judged posts: held-out validation posts filtered like the training posts, none of them the monitor's
    import llm_marl_envs

    validation = llm_marl_envs.make(example.ENV_ID, split="validation")
    short = [i for i, task in enumerate(validation.tasks) if len(task["source"].split()) <= 400]
    assert held_out["monitor_task_indices"] == short[:2] and held_out["task_indices"] == short[2:4]
    assert written["per_post"]["before"]["task_indices"] == short[2:4]
    assert set(written["paired_difference"]["rouge_l"]) == {"agent_0", "agent_1"}
    for agent in ("agent_0", "agent_1"):
        assert all(0.0 <= r <= 1.0 for r in written["per_post"]["after"]["rouge_l"][agent])
    assert (tmp_path / "run" / "hacking_monitor.png").stat().st_size > 10_000
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert sum("monitor/rouge_l/agent_0" in r for r in logged) == 3
    # the tiny model's random tokens score 0 everywhere (no advantage, no update): that MAGRPO moves the
    # weights is tested in test_magrpo.py; here the two steps ran and were logged beside the monitor
    assert [h["step"] for h in written["train_history"]] == [1, 2]
    assert sum("joint_reward_mean" in r for r in logged) == 2
    assert written["config"]["no_repeat_ngram"] == 0 and written["args"]["train_minutes"] is None   # the defaults
    # a time limit stops training at the first chunk boundary past it
    limited = example.main(["--steps", "2", "--monitor-every", "1", "--eval-tasks", "2", "--monitor-tasks", "2",
                            "--max-new-tokens", "4", "--num-generations", "2", "--prompts-per-step", "1",
                            "--train-minutes", "0", "--out", str(tmp_path / "limited")], tiny_model(seed=0))
    assert limited["steps_trained"] == 1
    # --judge-checkpoint: the base team and the last checkpoint, judged on the same posts without training
    checkpoint = sorted((tmp_path / "run" / "checkpoints").iterdir())[-1]
    judged = example.main(["--eval-tasks", "2", "--monitor-tasks", "2", "--max-new-tokens", "4",
                           "--judge-checkpoint", str(checkpoint),
                           "--out", str(tmp_path / "judged")], tiny_model(seed=0))
    assert judged["step"] == 2 and judged["task_indices"] == short[2:4]
    assert judged["per_post"]["after"]["texts"] == written["per_post"]["after"]["texts"]   # same weights, same greedy
    assert json.loads((tmp_path / "judged" / "judged.json").read_text())["step"] == 2
