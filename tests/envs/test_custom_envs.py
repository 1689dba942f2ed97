"""Custom envs everywhere: ``make("my_module:MyEnv-v0")``, the entry-point group, and the CLI on such an id.

Each test writes a real env module to ``tmp_path`` and works on a copy of the registry, so the
ids it registers do not outlive it.
"""
from __future__ import annotations

import json
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

import llm_marl_envs
from llm_marl_envs import registry

ENV_MODULE = '''
import llm_marl_envs
from llm_marl_envs.core import TextEnv
from verifiers import Verdict


class SayNumberEnv(TextEnv):
    """Each agent is asked to say a number; a reply that contains it is right. No extracted answer."""

    metadata = {**TextEnv.metadata, "name": "say_number"}

    def __init__(self, *, num_turns: int = 1, **kwargs):
        super().__init__(num_turns=num_turns, **kwargs)

    def load_tasks(self):
        return [{"task_id": f"say/{n}", "number": n} for n in range(6) if (n % 2 == 0) == (self.split == "test")]

    def first_prompt(self, agent_index, task):
        return [{"role": "user", "content": f"Say the number {task['number']}."}]

    def verify_turn(self, answers):
        target = str(self.task["number"])
        return {agent: Verdict(score=float(target in text), correct=target in text, details={"gold": target})
                for agent, text in answers.items()}

    def next_prompt(self, agent_index):
        return "Say it again."


llm_marl_envs.register("SayNumber-v0", SayNumberEnv)
'''


@pytest.fixture
def own_registry(monkeypatch):
    """A copy of the registry and of sys.path for the test; entry points loaded again."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_loaded_entry_points", set(registry._loaded_entry_points))
    monkeypatch.setattr(sys, "path", list(sys.path))


def write_module(folder: Path, source: str = ENV_MODULE) -> str:
    """Write ``source`` as a module of a fresh name in ``folder``; its name."""
    name = f"custom_envs_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    return name


def test_make_imports_the_module_named_in_the_id(tmp_path, own_registry):
    module = write_module(tmp_path)
    sys.path.insert(0, str(tmp_path))
    assert module not in sys.modules
    env = llm_marl_envs.make(f"{module}:SayNumber-v0", num_agents=2)
    assert env.env_id == f"{module}:SayNumber-v0" and type(env).__module__ == module
    env.reset(seed=0, options={"task_index": 0})
    _, rewards, *_ = env.step({"agent_0": f"It is {env.task['number']}.", "agent_1": "No idea."})
    assert rewards == {"agent_0": 1.0, "agent_1": 0.0}
    assert llm_marl_envs.spec(f"{module}:SayNumber-v0") is llm_marl_envs.spec("SayNumber-v0")


def test_a_module_id_that_cannot_be_made_says_why(tmp_path, own_registry):
    module = write_module(tmp_path)
    sys.path.insert(0, str(tmp_path))
    with pytest.raises(ValueError, match=rf"module '{module}' registers no environment 'Other-v0' "
                                         rf"\(its ids: \['SayNumber-v0'\]\)"):
        llm_marl_envs.make(f"{module}:Other-v0")
    with pytest.raises(ValueError, match=r"names the module 'no_such_module_here', which cannot be imported"):
        llm_marl_envs.make("no_such_module_here:SayNumber-v0")
    broken = write_module(tmp_path, "import no_such_dependency_here\n")
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_here"):   # the module's own error
        llm_marl_envs.make(f"{broken}:SayNumber-v0")
    with pytest.raises(ValueError, match=r"an env of your own module: 'my_module:MyEnv-v0'"):
        llm_marl_envs.make("SayNumbr-v0")


def test_an_out_of_date_module_id_names_the_newer_one_with_its_module(tmp_path, own_registry):
    module = write_module(tmp_path, ENV_MODULE + 'llm_marl_envs.register("SayNumber-v1", SayNumberEnv)\n')
    sys.path.insert(0, str(tmp_path))
    with pytest.warns(DeprecationWarning, match=rf"use {module}:SayNumber-v1"):
        llm_marl_envs.make(f"{module}:SayNumber-v0")


def test_an_entry_point_registers_a_packages_envs(tmp_path, own_registry):
    module = write_module(tmp_path)
    dist_info = tmp_path / "say_number_plugin-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: say-number-plugin\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text(f"[llm_marl_envs.envs]\nsay_number = {module}\n")
    sys.path.insert(0, str(tmp_path))
    assert "SayNumber-v0" in llm_marl_envs.list_envs()
    assert type(llm_marl_envs.make("SayNumber-v0")).__module__ == module


def test_a_broken_entry_point_warns_and_the_others_still_load(tmp_path, own_registry):
    dist_info = tmp_path / "broken_plugin-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text("[llm_marl_envs.envs]\nbroken = no_such_plugin_module_here\n")
    sys.path.insert(0, str(tmp_path))
    with pytest.warns(RuntimeWarning, match="'broken=no_such_plugin_module_here' failed to load"):
        envs = llm_marl_envs.list_envs()
    assert "gsm8k_debate-v0" in envs


def test_the_cli_benches_an_env_of_a_module_in_the_current_folder(tmp_path, own_registry, monkeypatch, capsys):
    from llm_marl import models
    from llm_marl.cli import main

    model, tokenizer = models.tiny_model(seed=0)
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    module = write_module(tmp_path)
    monkeypatch.chdir(tmp_path)
    sys.path[:] = [p for p in sys.path if p not in ("", str(tmp_path))]     # as under the llm-marl script
    code = main(["bench", f"{module}:SayNumber-v0", "--model", str(tmp_path / "tiny"), "--backend", "hf",
                 "--episodes", "2", "--max-new-tokens", "4", "--split", "test", "--out", str(tmp_path / "run"),
                 "--quiet"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert f"{module}:SayNumber-v0 | debate" in printed.out
    # the verifier reports no details["answer"]: no vote ran, so the vote and consensus read n/a, not 0.000
    assert "final majority: n/a   consensus: n/a" in printed.out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["final_majority_accuracy"] is None and summary["consensus_rate"] is None
    assert "| final majority-vote accuracy | n/a |" in (tmp_path / "run" / "report.md").read_text()


def test_llm_marl_envs_marks_the_deprecated_ids(capsys):
    from llm_marl.cli import main

    assert main(["envs"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:]}
    assert "(deprecated: use anli_debate-v1)" in lines["anli_debate-v0"]
    assert "deprecated" not in lines["anli_debate-v1"] and "deprecated" not in lines["gsm8k_debate-v0"]
