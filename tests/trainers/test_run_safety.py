"""Runs that cannot lose work: resume on re-run, refusals naming the differing fields, bounded checkpoints, a final
held-out score."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llm_marl.cli import main
from tests.interrupting import interrupt_after_first_checkpoint
from trainers.common.run_dir import RUN_FILE, RunDirError, prepare_run_dir, resume_command, write_record

ROOT = Path(__file__).resolve().parents[2]

# a graded reward (digits and vowels), so a random tiny model's samples differ and the adapters move
ENV_MODULE = '''
import llm_marl_envs
from llm_marl_envs.core import TextEnv
from verifiers import Verdict


class GradedNumberEnv(TextEnv):
    data_source = "generated"
    verifier_name = "digit fraction"

    def load_tasks(self):
        return [{"task_id": f"n{n}", "number": n} for n in range(12) if (n % 3 == 0) == (self.split == "test")]

    def first_prompt(self, agent_index, task):
        return [{"role": "user", "content": f"Agent {agent_index}: say the number {task['number']}."}]

    def verify_turn(self, answers):
        return {agent: Verdict(score=sum(c.isdigit() or c in "aeiou" for c in text) / max(1, len(text)),
                               correct=str(self.task["number"]) in text, details={})
                for agent, text in answers.items()}

    def next_prompt(self, agent_index):
        return "Say it again."


llm_marl_envs.register("GradedNumber-v0", GradedNumberEnv)
'''
TIMING_KEYS = ("tokens_per_s", "rollout_s", "step_s")


def train_argv(model: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "magrpo", "graded_env:GradedNumber-v0", "--model", str(model), "--threads", "1",
            "--num-agents", "2", "--num-turns", "1", "--set", "max_steps=4", "--set", "num_generations=2",
            "--set", "max_new_tokens=4", "--set", "save_every=1", "--set", "eval_tasks=2", "--set", "progress=false",
            "--set", "learning_rate=1e-2", "--out", str(out), *extra]


def cli() -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return [sys.executable, "-m", "llm_marl.cli"], env


def run_cli(folder: Path, argv: list[str]) -> subprocess.CompletedProcess:
    command, env = cli()
    return subprocess.run(command + argv, cwd=folder, env=env, capture_output=True, text=True, timeout=600)


def rows(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING_KEYS} for line in lines]


def adapters(out: Path) -> dict[str, dict]:
    from safetensors.torch import load_file

    final = sorted((out / "checkpoints").glob("step-*"))[-1]
    return {path.parent.name: load_file(str(path))
            for path in sorted((final / "agents").glob("*/adapter_model.safetensors"))}


def tensorboard_steps(out: Path) -> dict[str, list[int]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"), purge_orphaned_data=True)
    events.Reload()
    return {tag: [e.step for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_a_killed_run_re_run_with_the_same_command_ends_as_an_uninterrupted_one(tiny_model_dir, tmp_path):
    (tmp_path / "graded_env.py").write_text(ENV_MODULE)
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    done = run_cli(tmp_path, train_argv(tiny_model_dir, straight, "--no-eval"))
    assert done.returncode == 0, done.stderr

    command, env = cli()
    argv = train_argv(tiny_model_dir, killed, "--no-eval")
    process = interrupt_after_first_checkpoint(command + argv, killed, cwd=tmp_path, env=env)
    err = process.stderr
    assert process.returncode == 130, err
    kept = sorted(p.name for p in (killed / "checkpoints").glob("step-*"))
    assert kept[-1] != "step-000004", "the run finished before it was interrupted"
    assert f"keeps the run up to {kept[-1]}; this command resumes it from there:\n  {resume_command(argv)}" in err

    resumed = run_cli(tmp_path, argv)
    assert resumed.returncode == 0, resumed.stderr
    assert f"holds this run: resuming from {kept[-1]}" in resumed.stderr
    assert rows(killed) == rows(straight)
    assert [r["step"] for r in rows(killed)] == [1, 2, 3, 4]
    assert any(r["turn0/agent_0/grad_norm"] > 0 for r in rows(straight))
    assert all(steps == [1, 2, 3, 4] for steps in tensorboard_steps(killed).values())
    mine, theirs = adapters(killed), adapters(straight)
    assert sorted(mine) == ["agent_0", "agent_1"] and mine.keys() == theirs.keys()
    for agent in mine:
        assert mine[agent].keys() == theirs[agent].keys()
        assert all(mine[agent][k].equal(theirs[agent][k]) for k in mine[agent])

    # another config on the same directory is refused, naming the field and both ways on; nothing is touched
    before = rows(killed)
    assert main(train_argv(tiny_model_dir, killed, "--no-eval", "--set", "learning_rate=1e-3")) == 2
    assert rows(killed) == before


def test_another_config_on_a_run_directory_is_refused_with_the_differing_fields_and_both_commands(tmp_path,
                                                                                                    capsys):
    out = tmp_path / "run"
    first = train_argv(Path("model"), out)
    saved = {"command": resume_command(first), "algorithm": "magrpo", "model": "model",
                          "env": "graded_env:GradedNumber-v0", "config": {"learning_rate": 0.01, "seed": 0}}
    write_record(out, saved)
    (out / "checkpoints" / "step-000002").mkdir(parents=True)
    (out / "checkpoints" / "step-000002" / "trainer_state.pt").write_bytes(b"x")
    changed = {**saved, "command": "llm-marl train new", "model": "other",
               "config": {"learning_rate": 0.001, "seed": 0, "report_to": ["jsonl"]}}
    with pytest.raises(RunDirError) as refused:
        prepare_run_dir(out, changed)
    message = str(refused.value)
    assert "config.learning_rate: 0.01 there, 0.001 now" in message and "model: 'model' there, 'other' now" in message
    assert "report_to" not in message and "seed" not in message
    assert f"resume the saved run:   {resume_command(first)}" in message
    assert "start over here:        llm-marl train new --overwrite" in message
    assert (out / "checkpoints" / "step-000002").is_dir()

    # fields that change only what is written or shown may differ: the run resumes
    quieter = {**saved, "command": "x", "config": {**saved["config"], "progress": False}}
    assert prepare_run_dir(out, quieter).resume == out / "checkpoints" / "step-000002"
    # an explicit resume_from_checkpoint resumes what it names and only reports the differences
    assert "learning_rate" in prepare_run_dir(out, changed, resume_given=True).message
    # --overwrite deletes the run's outputs and nothing else
    (out / "notes.txt").write_text("mine")
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    plan = prepare_run_dir(out, changed, overwrite=True)
    assert plan.resume is None and "deleted checkpoints, metrics.jsonl, run.json" in plan.message
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", RUN_FILE]
    assert json.loads((out / RUN_FILE).read_text())["model"] == "other"


def test_metrics_without_a_record_are_not_overwritten(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    with pytest.raises(RunDirError, match="cannot be compared with it"):
        prepare_run_dir(tmp_path, {"command": "llm-marl train x", "config": {}})
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "loss": 0.5}\n'


def test_the_resume_command_drops_overwrite_and_points_an_explicit_resume_at_the_newest_checkpoint():
    assert resume_command(["train", "magrpo", "E", "--overwrite", "--out", "x"]) == "llm-marl train magrpo E --out x"
    assert resume_command(["train", "magrpo", "E", "--set", "resume_from_checkpoint=x/checkpoints/step-000001"]) == (
        "llm-marl train magrpo E --set resume_from_checkpoint=x/checkpoints/step-000001 "
        "--set resume_from_checkpoint=latest")


def test_train_ends_with_the_held_out_score_its_ci_and_the_report(tiny_model_dir, tmp_path, monkeypatch, capsys,
                                                                  one_torch_thread):
    (tmp_path / "graded_env.py").write_text(ENV_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    argv = train_argv(tiny_model_dir, tmp_path / "out")
    argv[argv.index("max_steps=4")] = "max_steps=1"
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "held-out (test split, 2 episodes, step 1): team reward " in out
    report = tmp_path / "out" / "eval" / "step-000001" / "report.html"
    assert f"  report: {report}" in out and report.is_file()
    summary = out.split("team reward ")[1].split(" (95% CI)")[0]           # e.g. "0.125 [0.000, 0.250]"
    mean, low, high = (float(x) for x in summary.replace("[", "").replace("]", "").replace(",", "").split())
    assert low <= mean <= high


# ----------------------------------------------------------------------------- checkpoints that bound the loss
def toy_trainer(tmp_path, **overrides):
    import torch

    from llm_marl.models import tiny_model
    from llm_marl.team import Team
    from tests.toy_env import SayNumberEnv
    from trainers.magrpo import MAGRPOConfig, MAGRPOTrainer

    torch.manual_seed(0)
    model, tokenizer = tiny_model(seed=0)
    values = dict(num_generations=2, max_new_tokens=4, max_steps=4, eval_tasks=2, output_dir=str(tmp_path),
                  report_to=("jsonl",), progress=False)
    return MAGRPOTrainer(SayNumberEnv(), Team.adapter_per_agent(model, tokenizer, agents=2),
                         MAGRPOConfig(**{**values, **overrides}))


def checkpoints(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").iterdir())


def test_default_configs_checkpoint_by_time_and_keep_the_newest_three():
    from trainers.magrpo import MAGRPOConfig
    from trainers.mappo import MAPPOConfig

    for config in (MAGRPOConfig(), MAPPOConfig()):
        assert 0 < config.save_every_minutes <= 15 and config.save_total_limit == 3


@pytest.mark.usefixtures("one_torch_thread")
def test_a_checkpoint_follows_every_step_ending_save_every_minutes_after_the_last_and_old_ones_go(tmp_path):
    toy_trainer(tmp_path / "timed", save_every_minutes=1e-9, save_total_limit=2).train()
    assert checkpoints(tmp_path / "timed") == ["step-000003", "step-000004"]
    toy_trainer(tmp_path / "end", save_every_minutes=0, save_total_limit=0).train()
    assert checkpoints(tmp_path / "end") == ["step-000004"]
    toy_trainer(tmp_path / "all", save_every=1, save_total_limit=0).train()
    assert checkpoints(tmp_path / "all") == [f"step-00000{n}" for n in (1, 2, 3, 4)]


def test_pruning_keeps_the_newest_complete_checkpoints_and_ignores_unfinished_ones(tmp_path):
    from trainers.common.checkpoint import prune_checkpoints

    root = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        (root / f"step-00000{step}").mkdir(parents=True)
        (root / f"step-00000{step}" / "trainer_state.pt").write_bytes(b"x")
    (root / "step-000004").mkdir()                       # not complete: no trainer_state.pt
    (root / ".tmp-step-000005.abc").mkdir()              # a writer killed mid-way
    assert [p.name for p in prune_checkpoints(tmp_path, 1)] == ["step-000001", "step-000002"]
    assert sorted(p.name for p in root.iterdir()) == [".tmp-step-000005.abc", "step-000003", "step-000004"]
    with pytest.raises(ValueError, match="keep must be >= 1"):
        prune_checkpoints(tmp_path, 0)
