"""`llm-marl bench ENV --checkpoint DIR`: a trained team's checkpoint (team.json + weights) benchmarked beside its
untrained base on the same tasks, and every checkpoint that does not fit refused with both sides named; each agent's
folder loaded by PEFT itself, and `llm-marl export` writing the folder to publish."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from llm_marl.cli import main
from llm_marl.models import EMBEDDED_MODELS, load, tiny_model
from llm_marl.team import Team
from llm_marl.team_checkpoint import find_checkpoint, load_team, read_manifest
from llm_marl_envs import make
from trainers.common.checkpoint import save_checkpoint
from trainers.magrpo import MAGRPOConfig, MAGRPOTrainer

ENV = "arithmetic_debate-v0"
SEED = 3
AGENTS = ["agent_0", "agent_1"]


def perturb(team: Team, seed: int) -> None:
    """Move every agent's trainable weights far from the untrained ones (LoRA B starts at zero: a no-op adapter)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for agent in team.agents:
            for param in team.policy(agent).trainable_parameters(team.adapter(agent)):
                if team.adapter(agent) is not None or param.ndim == 2:
                    param.add_(0.5 * torch.randn(param.shape, generator=generator))


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory):
    """A shared-LoRA team on the tiny model, perturbed, then one MAGRPO step; the trainer (it saved at the end)."""
    model, tokenizer = load(str(tiny_model_dir))
    team = Team.adapter_per_agent(model, tokenizer, AGENTS, name=str(tiny_model_dir))
    perturb(team, seed=0)
    config = MAGRPOConfig(num_generations=2, max_new_tokens=8, max_steps=1, eval_tasks=2, eval_every=1,
                          report_to=("jsonl",), progress=False, seed=SEED,
                          output_dir=str(tmp_path_factory.mktemp("magrpo")))
    trainer = MAGRPOTrainer(make(ENV, num_agents=2, num_turns=1, split="train"), team, config,
                            eval_env=make(ENV, num_agents=2, num_turns=1, split="test"))
    trainer.train()
    return trainer


@pytest.fixture(scope="module")
def full_checkpoint(tiny_model_dir, tmp_path_factory):
    """A fully fine-tuned team (one model per agent), perturbed and saved; ``(team, output_dir)``."""
    name = str(tiny_model_dir)
    team = Team.separate([load(name) for _ in AGENTS], AGENTS, names=[name] * len(AGENTS))
    perturb(team, seed=1)
    optimizers = {a: torch.optim.AdamW(team.policy(a).trainable_parameters(None)) for a in AGENTS}
    output_dir = tmp_path_factory.mktemp("full")
    save_checkpoint(output_dir, 4, team, optimizers, {}, {}, env=make(ENV, num_agents=2, num_turns=1))
    return team, output_dir


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def bench(*argv: str) -> list[str]:
    return ["bench", ENV, "--episodes", "2", "--max-new-tokens", "8", "--temperature", "0", "--seed", str(SEED),
            "--quiet", *argv]


def test_checkpoint_records_its_team(trained, tiny_model_dir):
    output_dir = Path(trained.config.output_dir)
    step = output_dir / "checkpoints" / "step-000001"
    assert find_checkpoint(output_dir) == find_checkpoint(output_dir / "checkpoints") == find_checkpoint(step) == step
    manifest = read_manifest(step)
    assert manifest["agents"] == AGENTS and manifest["step"] == 1
    assert manifest["env"] == {"id": ENV, "num_agents": 2, "num_turns": 1}
    assert manifest["base_model"] == str(tiny_model_dir)
    for agent in AGENTS:
        member = manifest["members"][agent]
        assert (member["base_model"], member["policy"], member["adapter"], member["weights"], member["path"]) == (
            str(tiny_model_dir), 0, agent, "lora", f"agents/{agent}")
        lora = json.loads((step / "agents" / agent / "adapter_config.json").read_text())
        assert (lora["peft_type"], lora["r"], lora["lora_alpha"], lora["inference_mode"]) == ("LORA", 8, 16, True)
        assert "model.layers.0.self_attn.q_proj" in lora["target_modules"]
    assert not list((output_dir / "checkpoints").glob(".tmp-*"))        # the manifest was written before the rename


@pytest.mark.parametrize("layout", ["lora", "full"])
def test_load_team_restores_every_agents_trained_weights(layout, trained, full_checkpoint, tiny_model_dir):
    team, output_dir = (trained.team, trained.config.output_dir) if layout == "lora" else full_checkpoint
    assert {m["weights"] for m in read_manifest(find_checkpoint(output_dir))["members"].values()} == {layout}
    loaded = load_team(output_dir, AGENTS, [str(tiny_model_dir)])
    assert (loaded.policy("agent_0") is loaded.policy("agent_1")) == (layout == "lora")    # seated as trained
    for agent in AGENTS:
        adapter = team.adapter(agent)
        assert loaded.adapter(agent) == adapter
        saved = team.policy(agent).trainable_state_dict(adapter)
        back = loaded.policy(agent).trainable_state_dict(adapter)
        assert saved.keys() == back.keys() and all(torch.equal(saved[k], back[k]) for k in saved)


def test_bench_checkpoint_plays_the_trained_weights_beside_the_untrained_base(trained, tiny_model_dir, tmp_path,
                                                                              capsys):
    out = tmp_path / "trained"
    assert main(bench("--checkpoint", trained.config.output_dir, "--backend", "hf", "--out", str(out))) == 0, \
        capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "team answer checkpoint - debate" in printed
    result = json.loads((out / "comparison.json").read_text())
    step = str((Path(trained.config.output_dir) / "checkpoints" / "step-000001").resolve())
    assert list(result["baselines"]) == ["debate", "checkpoint"] and result["checkpoint"] == step
    assert [row["env_shape"] for row in result["baselines"].values()] == [[2, 1], [2, 1]]   # the training shape
    (pair,) = result["paired_team_answer_difference"]
    assert (pair["a"], pair["b"], pair["num_tasks"]) == ("checkpoint", "debate", 2)
    assert "| checkpoint − debate |" in (out / "comparison.md").read_text()
    untrained, checkpoint = records(out / "debate" / "episodes.jsonl"), records(out / "checkpoint" / "episodes.jsonl")
    tasks = [r["task_index"] for r in checkpoint]
    assert tasks == [r["task_index"] for r in untrained]
    assert [r["responses"] for r in checkpoint] != [r["responses"] for r in untrained]    # the weights were loaded

    # the trainer's own greedy evaluation of the same tasks plays the same episodes
    trained.eval_tasks = tasks                # evaluate() plays held-out tasks; point it at the bench's
    evaluation = trained.evaluate()
    assert [r["task_index"] for r in evaluation.episodes] == tasks
    assert [r["responses"] for r in evaluation.episodes] == [r["responses"] for r in checkpoint]

    # the untrained baseline (the checkpoint's base with its adapters off) is the plain model
    plain = tmp_path / "plain"
    assert main(bench("--model", str(tiny_model_dir), "--backend", "hf", "--num-agents", "2", "--num-turns", "1",
                      "--out", str(plain))) == 0
    assert [r["responses"] for r in records(plain / "episodes.jsonl")] == [r["responses"] for r in untrained]


def test_bench_checkpoint_of_a_fully_fine_tuned_team(full_checkpoint, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(bench("--checkpoint", str(full_checkpoint[1] / "checkpoints"), "--out", str(out))) == 0, \
        capsys.readouterr().err
    untrained, checkpoint = records(out / "debate" / "episodes.jsonl"), records(out / "checkpoint" / "episodes.jsonl")
    assert [r["task_index"] for r in untrained] == [r["task_index"] for r in checkpoint]
    assert [r["responses"] for r in checkpoint] != [r["responses"] for r in untrained]
    alone = tmp_path / "alone"                 # --baseline checkpoint: one run directory, the same episodes
    assert main(bench("--checkpoint", str(full_checkpoint[1]), "--baseline", "checkpoint", "--out", str(alone))) == 0
    assert "checkpoint: " in (alone / "report.md").read_text()
    assert [r["responses"] for r in records(alone / "episodes.jsonl")] == [r["responses"] for r in checkpoint]


def test_a_team_trained_reading_the_scores_is_replayed_in_a_debate_that_shows_them(trained, tmp_path, capsys):
    team = trained.team
    optimizers = {a: torch.optim.AdamW(team.policy(a).trainable_parameters(team.adapter(a))) for a in AGENTS}
    runs = {}
    for shown in (True, False):
        step = tmp_path / f"scores-{shown}"
        save_checkpoint(step, 1, team, optimizers, {}, {}, env=make(ENV, num_agents=2, num_turns=2, show_scores=shown))
        assert read_manifest(find_checkpoint(step))["env"] == {"id": ENV, "num_agents": 2, "num_turns": 2,
                                                               **({"show_scores": True} if shown else {})}
        out = runs[shown] = tmp_path / f"bench-{shown}"
        assert main(bench("--checkpoint", str(step), "--out", str(out))) == 0, capsys.readouterr().err
        for baseline in ("debate", "checkpoint"):     # every baseline debates as the team trained
            config = json.loads((out / baseline / "run.json").read_text())["config"]
            assert config["env_kwargs"].get("show_scores", False) is shown
    shown, plain = (records(runs[s] / "checkpoint" / "episodes.jsonl") for s in (True, False))
    assert [r["responses"][0] for r in shown] == [r["responses"][0] for r in plain]   # turn 0: the same prompts
    assert [r["responses"][1] for r in shown] != [r["responses"][1] for r in plain]   # turn 1 read the scores


# ------------------------------------------------------------------ refusals, each naming both sides
def refused(capsys, *argv: str) -> str:
    assert main(bench(*argv, "--out", "/nonexistent/never-written")) == 2
    return capsys.readouterr().err


def test_a_checkpoint_of_other_agents_is_refused(trained, capsys):
    err = refused(capsys, "--checkpoint", trained.config.output_dir, "--num-agents", "3")
    assert ("holds a team of 2 agents ['agent_0', 'agent_1'], but the env has 3: "
            "['agent_0', 'agent_1', 'agent_2']") in err
    assert "--num-agents 2" in err


def test_a_checkpoint_of_another_model_is_refused(trained, tiny_model_dir, capsys):
    err = refused(capsys, "--checkpoint", trained.config.output_dir, "--model", "smollm2-135m")
    assert f"was trained on base model '{tiny_model_dir}', but the model asked for is 'smollm2-135m'" in err


def test_a_checkpoint_needs_the_hf_backend(trained, capsys):
    err = refused(capsys, "--checkpoint", trained.config.output_dir, "--backend", "llamacpp")
    assert "--checkpoint needs --backend hf, got --backend llamacpp" in err


def test_the_checkpoint_baseline_needs_a_checkpoint(tiny_model_dir, capsys):
    err = refused(capsys, "--model", str(tiny_model_dir), "--backend", "hf", "--baseline", "checkpoint")
    assert "the 'checkpoint' baseline runs a trained team" in err and "--checkpoint DIR" in err


def test_missing_or_empty_checkpoint_dirs_are_refused(tmp_path, capsys):
    assert "does not exist" in refused(capsys, "--checkpoint", str(tmp_path / "missing"))
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    err = refused(capsys, "--checkpoint", str(tmp_path / "empty"))
    assert f"{tmp_path / 'empty'} holds no step-* checkpoint" in err


def test_an_incomplete_or_old_checkpoint_is_refused(trained, tmp_path, capsys):
    step = tmp_path / "step-000001"
    shutil.copytree(Path(trained.config.output_dir) / "checkpoints" / "step-000001", step)
    (step / "agents" / "agent_1" / "adapter_model.safetensors").unlink()
    err = refused(capsys, "--checkpoint", str(step))
    assert "has no weights for agent 'agent_1'" in err and "lacks ['adapter_model.safetensors']" in err
    manifest = json.loads((step / "team.json").read_text())
    (step / "team.json").write_text(json.dumps({**manifest, "format": 1}))      # before agents were PEFT folders
    err = refused(capsys, "--checkpoint", str(step))
    assert "has format 1" in err and "adapter_config.json + adapter_model.safetensors" in err
    (step / "team.json").unlink()
    err = refused(capsys, "--checkpoint", str(step))
    assert f"checkpoint {step} has no team.json" in err and "base model, agents and LoRA settings" in err


def test_weights_that_do_not_fit_the_base_are_refused(tmp_path, capsys):
    small = tmp_path / "small"
    model, tokenizer = tiny_model(hidden_size=32)
    model.save_pretrained(small)
    tokenizer.save_pretrained(small)
    model, tokenizer = tiny_model(hidden_size=64)       # trained on another model than the one it names
    team = Team.adapter_per_agent(model, tokenizer, AGENTS, name=str(small))
    optimizers = {a: torch.optim.AdamW(team.policy(a).trainable_parameters(a)) for a in AGENTS}
    step = save_checkpoint(tmp_path / "run", 1, team, optimizers, {}, {})
    err = refused(capsys, "--checkpoint", str(step), "--num-turns", "1")
    assert f"checkpoint {step / 'agents' / 'agent_0' / 'adapter_model.safetensors'} does not fit base model " \
        f"'{small}'" in err
    assert "is (8, 64) in the checkpoint but (8, 32) in the model" in err


def test_an_adapter_with_other_lora_settings_is_refused_before_its_tensors_load(tmp_path):
    from llm_marl.team import default_lora_config
    from llm_marl.team_checkpoint import read_agent, save_team

    model, tokenizer = tiny_model()
    step = save_team(tmp_path, 1, Team.adapter_per_agent(model, tokenizer, AGENTS))
    manifest = read_manifest(step)
    model, tokenizer = tiny_model()
    scaled = Team.adapter_per_agent(model, tokenizer, AGENTS, lora_config=default_lora_config(alpha=32))
    with pytest.raises(ValueError, match=r"agent 'agent_0' was trained with other LoRA settings .*'lora_alpha': "
                                         r"\(16, 32\)"):
        read_agent(step, manifest, "agent_0", scaled.policy("agent_0"), "agent_0")   # same shapes, other scale
    model, tokenizer = tiny_model()
    same = Team.adapter_per_agent(model, tokenizer, AGENTS)
    read_agent(step, manifest, "agent_0", same.policy("agent_0"), "agent_0")


# ------------------------------------------------------------------ a base model that moved
def test_a_checkpoint_whose_base_directory_moved_is_pointed_at_its_new_place(tiny_model_dir, tmp_path, capsys):
    base, moved = tmp_path / "base", tmp_path / "elsewhere" / "base"
    shutil.copytree(tiny_model_dir, base)
    model, tokenizer = load(str(base))
    team = Team.adapter_per_agent(model, tokenizer, AGENTS, name=str(base))
    perturb(team, seed=2)
    optimizers = {a: torch.optim.AdamW(team.policy(a).trainable_parameters(a)) for a in AGENTS}
    step = save_checkpoint(tmp_path / "run", 1, team, optimizers, {}, {}, env=make(ENV, num_agents=2, num_turns=1))
    assert main(bench("--checkpoint", str(step), "--baseline", "checkpoint", "--out", str(tmp_path / "before"))) == 0
    moved.parent.mkdir()
    base.rename(moved)

    err = refused(capsys, "--checkpoint", str(step))
    assert f"was trained on the base model in '{base}', which does not exist any more" in err
    assert "--base-model NEW_DIR" in err
    with pytest.raises(ValueError, match="base_model='NEW_DIR'"):
        load_team(step)

    after = tmp_path / "after"
    assert main(bench("--checkpoint", str(step), "--base-model", str(moved), "--baseline", "checkpoint",
                      "--out", str(after))) == 0, capsys.readouterr().err
    assert [r["responses"] for r in records(after / "episodes.jsonl")] == \
        [r["responses"] for r in records(tmp_path / "before" / "episodes.jsonl")]      # the same trained team
    relocated = load_team(step, AGENTS, base_model=str(moved))
    assert {relocated.policy(a).name for a in AGENTS} == {str(moved)}
    assert "--base-model says where a --checkpoint's base model moved" in refused(capsys, "--base-model", str(moved))


# ------------------------------------------------------------------ artefacts people load
def logits(model, adapter=None) -> torch.Tensor:
    """Logits of a fixed token sequence under ``model`` (an HFPolicy with ``adapter`` active, or a plain model)."""
    ids = torch.tensor([[1, 57, 300, 4021, 12, 9, 870]])
    with torch.no_grad():
        if adapter is None:
            return model(ids).logits
        with model.using(adapter):
            return model.model(ids).logits


def test_each_trained_agent_loads_with_peft_from_pretrained(trained, tiny_model_dir, one_torch_thread):
    from peft import PeftModel, get_peft_model_state_dict
    from safetensors.torch import load_file

    step = Path(trained.config.output_dir) / "checkpoints" / "step-000001"
    outputs = {}
    for agent in AGENTS:
        base, _ = load(str(tiny_model_dir))
        peft = PeftModel.from_pretrained(base, str(step / "agents" / agent)).eval()
        outputs[agent] = logits(peft)
        assert torch.equal(outputs[agent], logits(trained.team.policy(agent), agent))    # the trained agent itself
        saved = load_file(str(step / "agents" / agent / "adapter_model.safetensors"))
        assert saved.keys() == get_peft_model_state_dict(peft).keys()                   # PEFT's own plain names
        assert not any(agent in key for key in saved)
    assert not torch.equal(outputs["agent_0"], outputs["agent_1"])                         # each its own adapter


def test_team_json_names_the_base_and_holds_no_absolute_path(tiny_model_dir, tmp_path, monkeypatch,
                                                            one_torch_thread):
    # the README's way: an embedded model loaded by name and a team built without name=; the cached
    # conversion of "smollm2-135m" is the tiny model here
    cache = tmp_path / "cache"
    shutil.copytree(tiny_model_dir, cache / "models" / "smollm2-135m")
    monkeypatch.setenv("LLM_MARL_CACHE", str(cache))
    model, tokenizer = load("smollm2-135m")
    team = Team.adapter_per_agent(model, tokenizer, AGENTS)
    assert team.policy("agent_0").name == str(cache / "models" / "smollm2-135m")      # what the policy knows
    perturb(team, seed=4)
    optimizers = {a: torch.optim.AdamW(team.policy(a).trainable_parameters(a)) for a in AGENTS}
    step = save_checkpoint(tmp_path / "run", 2, team, optimizers, {}, {"output_dir": str(tmp_path / "run")},
                           env=make(ENV, num_agents=2, num_turns=1))
    manifest = read_manifest(step)
    assert manifest["base_model"] == "smollm2-135m"
    assert {a: (m["base_model"], m["path"]) for a, m in manifest["members"].items()} == {
        a: ("smollm2-135m", f"agents/{a}") for a in AGENTS}
    texts = [(step / "team.json").read_text(), *((step / "agents" / a / "adapter_config.json").read_text()
                                                 for a in AGENTS)]
    assert not [t for t in texts if str(tmp_path) in t or str(cache) in t]
    assert all(json.loads(t)["base_model_name_or_path"] == "smollm2-135m" for t in texts[1:])
    loaded = load_team(step, AGENTS, ["smollm2-135m"])                # replayed by name, from the cache
    for agent in AGENTS:
        assert torch.equal(logits(loaded.policy(agent), agent), logits(team.policy(agent), agent))


def test_a_team_sharing_one_adapter_round_trips(tiny_model_dir, tmp_path, one_torch_thread):
    from peft import PeftModel

    model, tokenizer = load(str(tiny_model_dir))
    team = Team.shared_adapter(model, tokenizer, AGENTS, name=str(tiny_model_dir))
    perturb(team, seed=5)
    optimizer = torch.optim.AdamW(team.policy("agent_0").trainable_parameters("shared"))
    step = save_checkpoint(tmp_path / "run", 1, team, {a: optimizer for a in AGENTS}, {}, {})
    loaded = load_team(step, AGENTS)
    assert loaded.policy("agent_0") is loaded.policy("agent_1")
    assert [loaded.adapter(a) for a in AGENTS] == ["shared", "shared"]
    expected = logits(team.policy("agent_0"), "shared")
    assert torch.equal(logits(loaded.policy("agent_1"), "shared"), expected)
    for agent in AGENTS:                                              # each agent's folder loads on its own
        peft = PeftModel.from_pretrained(load(str(tiny_model_dir))[0], str(step / "agents" / agent)).eval()
        assert torch.equal(logits(peft), expected)


def test_export_writes_a_folder_to_publish_that_bench_replays(trained, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "export"
    out.mkdir()                                                       # an empty directory is fine
    assert main(["export", trained.config.output_dir, str(out)]) == 0, capsys.readouterr().err
    assert f"hf upload USER/NAME {out}" in capsys.readouterr().out
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == ["README.md", *(f"agents/{a}/{f}" for a in AGENTS
                                    for f in ("adapter_config.json", "adapter_model.safetensors")), "team.json"]
    step = Path(trained.config.output_dir) / "checkpoints" / "step-000001"
    assert read_manifest(out) == read_manifest(step)
    assert not list(tmp_path.glob(".export*"))                        # no temp dir left beside it

    card = (out / "README.md").read_text()
    _, front, body = card.split("---\n", 2)
    metadata = yaml.safe_load(front)
    assert metadata["library_name"] == "peft" and ENV in metadata["tags"]
    assert "base_model" not in metadata                               # a local directory is no Hub id
    assert f"trained on `{ENV}`" in body and "2 agents, 1 turn" in body
    evaluation = [r for r in records(Path(trained.config.output_dir) / "metrics.jsonl") if "eval/team_reward" in r]
    assert [r["step"] for r in evaluation] == [1]
    assert f"team reward {evaluation[0]['eval/team_reward']:.3f} [{evaluation[0]['eval/team_reward_ci_low']:.3f}, " \
        f"{evaluation[0]['eval/team_reward_ci_high']:.3f}]" in body
    assert "num_generations: 2" in body and "output_dir" not in body and str(tmp_path) not in card
    assert 'PeftModel.from_pretrained(base, "agents/agent_0")' in body
    assert f"llm-marl bench {ENV} --checkpoint DIR --base-model PATH/TO/BASE_MODEL" in body

    loaded = load_team(out, AGENTS)                                   # what bench --checkpoint DIR loads
    for agent in AGENTS:
        assert torch.equal(logits(loaded.policy(agent), agent), logits(trained.team.policy(agent), agent))


def test_export_card_of_an_embedded_base_names_its_hub_model(tiny_model_dir, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    shutil.copytree(tiny_model_dir, cache / "models" / "smollm2-135m")
    monkeypatch.setenv("LLM_MARL_CACHE", str(cache))
    model, tokenizer = load("smollm2-135m")
    team = Team.adapter_per_agent(model, tokenizer, AGENTS)
    optimizers = {a: torch.optim.AdamW(team.policy(a).trainable_parameters(a)) for a in AGENTS}
    save_checkpoint(tmp_path / "run", 3, team, optimizers, {}, {}, env=make(ENV, num_agents=2, num_turns=2))
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "out")]) == 0
    card = (tmp_path / "out" / "README.md").read_text()
    assert yaml.safe_load(card.split("---\n")[1])["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert "smollm2-135m" in EMBEDDED_MODELS and 'load("smollm2-135m")' in card
    assert "No held-out evaluation of this step was recorded" in card


def test_export_refuses_a_missing_or_incomplete_checkpoint_and_a_non_empty_dir(trained, tmp_path, capsys):
    def refused_export(*argv: str) -> str:
        assert main(["export", *argv]) == 2
        return capsys.readouterr().err

    assert "does not exist or is not a directory" in refused_export(str(tmp_path / "missing"), str(tmp_path / "a"))
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    err = refused_export(trained.config.output_dir, str(busy))
    assert f"{busy} exists and is not an empty directory" in err
    assert [p.name for p in busy.iterdir()] == ["notes.txt"]
    step = tmp_path / "step-000001"
    shutil.copytree(Path(trained.config.output_dir) / "checkpoints" / "step-000001", step)
    (step / "agents" / "agent_0" / "adapter_config.json").unlink()
    err = refused_export(str(step), str(tmp_path / "b"))
    assert "has no weights for agent 'agent_0'" in err and "['adapter_config.json']" in err
    (step / "team.json").unlink()
    assert "has no team.json" in refused_export(str(step), str(tmp_path / "b"))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
