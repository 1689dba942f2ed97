"""The training examples never lose a run: the same command resumes an interrupted one or reports a finished one,
another config is refused naming its fields, ``--overwrite`` starts over."""
import json
import os
import shlex
import sys

import pytest

from tests.interrupting import interrupt_after_first_checkpoint
from tests.scripts import ROOT, load_script
from tests.trainers.test_run_safety import ENV_MODULE, adapters, rows, tensorboard_steps

SCRIPT = "examples/magrpo_debate.py"


def example_argv(model, out, *extra: str) -> list[str]:
    """A 3-step run of the MAGRPO debate example on a graded env (the tiny model's adapters move), a checkpoint
    per step."""
    return ["--env", "graded_env:GradedNumber-v0", "--model", str(model), "--steps", "3", "--save-every", "1",
            "--eval-tasks", "2", "--samples", "0", "--max-new-tokens", "4", "--threads", "1", "--prompts-per-step",
            "1", "--num-generations", "2", "--learning-rate", "1e-2", "--progress", "false", "--out", str(out),
            *extra]


@pytest.fixture
def graded_env(tmp_path, monkeypatch):
    """``graded_env:GradedNumber-v0`` importable here and in a subprocess started in ``tmp_path``."""
    (tmp_path / "graded_env.py").write_text(ENV_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]), "OMP_NUM_THREADS": "1"}


def checkpoint_times(out) -> dict[str, int]:
    return {p.name: (p / "trainer_state.pt").stat().st_mtime_ns for p in sorted((out / "checkpoints").glob("step-*"))}


@pytest.mark.usefixtures("one_torch_thread")
def test_a_killed_example_re_run_with_the_same_command_resumes_and_ends_as_an_uninterrupted_one(
        tiny_model_dir, tmp_path, graded_env, capsys, monkeypatch):
    module = load_script(SCRIPT)
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    module.main(example_argv(tiny_model_dir, straight))
    capsys.readouterr()

    argv = example_argv(tiny_model_dir, killed)
    process = interrupt_after_first_checkpoint([sys.executable, str(ROOT / SCRIPT), *argv], killed, cwd=tmp_path,
                                               env=graded_env)
    err = process.stderr
    assert process.returncode == 130, err
    assert "Traceback" not in err
    kept = checkpoint_times(killed)
    last = list(kept)[-1]
    assert last != "step-000003" and not (killed / "results.json").exists(), "the run finished before the interrupt"
    command = shlex.join([f"PYTHONPATH={graded_env['PYTHONPATH']}", "python", str(ROOT / SCRIPT), *argv])
    assert f"{killed} keeps the run up to {last}; this command resumes it from there:\n  {command}" in err

    module.main(argv)                                                      # the same command again
    resumed = capsys.readouterr()
    assert f"holds this run: resuming from {last}" in resumed.err
    assert f"before: reused {killed / 'before_scores.json'}" in resumed.out
    assert {name: checkpoint_times(killed)[name] for name in kept} == kept    # its checkpoints were not rewritten
    assert rows(killed) == rows(straight) and [r["step"] for r in rows(killed)] == [1, 2, 3]
    assert all(steps == [1, 2, 3] for steps in tensorboard_steps(killed).values())
    mine, theirs = adapters(killed), adapters(straight)
    assert sorted(mine) == ["agent_0", "agent_1"] and mine.keys() == theirs.keys()
    assert any(r["turn0/agent_0/grad_norm"] > 0 for r in rows(straight))
    for agent in mine:
        assert mine[agent].keys() == theirs[agent].keys()
        assert all(mine[agent][k].equal(theirs[agent][k]) for k in mine[agent])
    done, again = (json.loads((out / "results.json").read_text()) for out in (straight, killed))
    assert [r["step"] for r in again["train_history"]] == [1, 2, 3]
    assert again["greedy"] == done["greedy"] and again["arguments"] == done["arguments"]

    # the same command on the finished run reports it and trains nothing
    def refuse(config, args):
        raise AssertionError("a finished run trained again")

    monkeypatch.setattr(module, "run", refuse)
    module.main(argv)
    assert f"{killed} holds this run, finished: reused {killed / 'results.json'}" in capsys.readouterr().out
    assert json.loads((killed / "results.json").read_text()) == again


@pytest.mark.usefixtures("one_torch_thread")
def test_another_config_on_an_example_run_is_refused_by_field_and_overwrite_starts_over(
        tiny_model_dir, tmp_path, graded_env, capsys):
    from trainers.common.experiment import example_command

    module = load_script(SCRIPT)
    out = tmp_path / "run"
    first = example_argv(tiny_model_dir, out)
    first[first.index("--steps") + 1] = "1"
    module.main(first)
    capsys.readouterr()
    saved = {"rows": rows(out), "results": (out / "results.json").read_text()}

    changed = [*first, "--learning-rate", "1e-3", "--num-turns", "1"]
    with pytest.raises(SystemExit) as refused:
        module.main(changed)
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "Traceback" not in err
    assert f"{out} holds another run; this command's config differs from the saved one in:" in err
    assert "    config.learning_rate: 0.01 there, 0.001 now\n" in err and "    flags.num_turns: 2 there, 1 now\n" in err
    assert f"  resume the saved run:   {example_command(ROOT / SCRIPT, first)}\n" in err
    assert f"--overwrite   (deletes {out}'s checkpoints" in err
    assert {"rows": rows(out), "results": (out / "results.json").read_text()} == saved   # nothing was touched

    # another example on the same --out is refused before anything loads
    with pytest.raises(SystemExit):
        load_script("examples/mappo_debate.py").main(["--out", str(out), "--model", str(tiny_model_dir)])
    assert "example: 'magrpo_debate.py' there, 'mappo_debate.py' now" in capsys.readouterr().err

    module.main([*changed, "--overwrite"])
    err = capsys.readouterr().err
    assert "--overwrite: deleted checkpoints, metrics.jsonl, tensorboard, run.json, results.json" in err
    results = json.loads((out / "results.json").read_text())
    assert results["arguments"]["learning_rate"] == 0.001 and results["arguments"]["num_turns"] == 1
    assert [r["step"] for r in rows(out)] == [1] and rows(out) != saved["rows"]
    assert json.loads((out / "run.json").read_text())["config"]["learning_rate"] == 0.001


def test_an_example_that_cannot_resume_reports_a_finished_run_refuses_an_interrupted_one_and_overwrites(
        tmp_path, capsys):
    from argparse import Namespace

    from trainers.common.experiment import example_command, run_arguments, run_from_start
    from trainers.magrpo import MAGRPOConfig

    out = tmp_path / "run"
    config, args = MAGRPOConfig(output_dir=str(out)), Namespace(overwrite=False, plain_reward=False)
    argv, script = ["--out", str(out)], "examples/magrpo_tldr.py"
    command = example_command(script, argv)

    def interrupted():
        (out / "metrics.jsonl").write_text('{"step": 1}\n')
        raise KeyboardInterrupt

    def finished():
        (out / "results.json").write_text(json.dumps({"arguments": run_arguments(config, args), "score": 1}))
        return {"score": 1}

    def start(train, **changes):
        return run_from_start(train, out, config, Namespace(**{**vars(args), **changes}), outputs=("run.json",
                              "metrics.jsonl", "results.json"), script=script, argv=argv)

    with pytest.raises(SystemExit) as stopped:
        start(interrupted)
    assert stopped.value.code == 130
    assert f"does not resume a run; this command starts it over:\n  {command} --overwrite" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:                             # the same command: it cannot resume
        start(finished)
    assert refused.value.code == 2 and f"start over here:        {command} --overwrite" in capsys.readouterr().err
    with pytest.raises(SystemExit):                                        # another flag: named
        start(finished, plain_reward=True)
    assert "flags.plain_reward: False there, True now" in capsys.readouterr().err
    assert start(finished, overwrite=True) == {"score": 1}
    assert not (out / "metrics.jsonl").exists() and "--overwrite: deleted run.json, metrics.jsonl" in (
        capsys.readouterr().err)
    assert start(interrupted) == json.loads((out / "results.json").read_text())   # finished: reported, not rerun
    assert f"{out} holds this run, finished: reused" in capsys.readouterr().out
