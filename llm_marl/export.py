"""A trained team's checkpoint as a folder to publish (``llm-marl export CHECKPOINT DIR``).

The folder holds what someone else loads, and nothing of the training state::

    README.md                                 model card: YAML metadata (library_name: peft, base_model,
                                              tags), the env, the training config, the held-out result,
                                              how to load an agent and how to replay the team
    team.json                                 the checkpoint's manifest (:mod:`llm_marl.team_checkpoint`)
    agents/<agent>/adapter_config.json        each LoRA agent in PEFT's format (a fully fine-tuned
    agents/<agent>/adapter_model.safetensors  agent: config.json + model.safetensors)

``hf upload USER/NAME DIR`` publishes it; ``llm-marl bench ENV --checkpoint DIR`` replays it, as
it replays the checkpoint. The held-out result comes from the run the checkpoint belongs to: the
trainer's evaluation of that step in ``metrics.jsonl`` (``eval/*`` records), and the
before/after comparison of a ``results.json`` that names the checkpoint (the examples write one).
The folder is written beside ``DIR`` and renamed into place, so it is whole or absent.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from .team_checkpoint import WEIGHT_FILES, agent_dir, find_checkpoint, read_manifest, write_manifest

CARD_FILE = "README.md"
# the Hub model each embedded model was quantized from (the card's base_model; the weights llm-marl loads are the
# embedded GGUF's, dequantized)
EMBEDDED_SOURCES = {"smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}
# trainer config fields that name places on the training machine: left out of the card
LOCAL_FIELDS = ("output_dir", "resume_from_checkpoint")


def export_checkpoint(checkpoint: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write checkpoint ``checkpoint`` (any form ``find_checkpoint`` takes) as an uploadable folder ``out_dir``.

    ``out_dir`` must not exist or be empty. Returns ``out_dir``. A missing or incomplete checkpoint, or a
    non-empty ``out_dir``, is a ``ValueError`` saying which.
    """
    source = find_checkpoint(checkpoint)
    manifest = read_manifest(source)
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not an empty directory; export into a new directory (or empty it "
                         f"first): nothing in it is overwritten")
    files = {}
    for agent in manifest["agents"]:
        directory = agent_dir(source, manifest, agent)
        names = WEIGHT_FILES[manifest["members"][agent]["weights"]]
        missing = [name for name in names if not (directory / name).is_file()]
        if missing:
            raise ValueError(f"checkpoint {source} has no weights for agent {agent!r}: {directory} lacks {missing}; "
                             f"the checkpoint is incomplete")
        files.update({directory / name: Path(manifest["members"][agent]["path"]) / name for name in names})
    card = model_card(source, manifest)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for file, relative in files.items():
            (tmp / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(file, tmp / relative)
        write_manifest(tmp, manifest)
        (tmp / CARD_FILE).write_text(card, encoding="utf-8")
        if out.exists():
            out.rmdir()                     # empty (checked above); a rename cannot replace a directory
        os.rename(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


# ---------------------------------------------------------------------------------- the model card
def model_card(checkpoint: Path, manifest: Mapping[str, Any]) -> str:
    """The README.md of an export of ``checkpoint`` (its ``manifest``)."""
    agents, members = list(manifest["agents"]), manifest["members"]
    env = manifest.get("env") or {}
    bases = list(dict.fromkeys(members[a]["base_model"] for a in agents))
    hub_bases = [hub_id(b) for b in bases if hub_id(b)]
    lora = all(members[a]["weights"] == "lora" for a in agents)
    metadata: dict[str, Any] = {"library_name": "peft" if lora else "transformers"}
    if hub_bases:
        metadata["base_model"] = hub_bases[0] if len(hub_bases) == 1 else hub_bases
    metadata["tags"] = ["llm-marl-envs", "multi-agent", *(["lora"] if lora else []),
                        *([env["id"]] if env.get("id") else [])]
    if lora:
        metadata["pipeline_tag"] = "text-generation"

    env_line = "the env it was trained on is not recorded"
    if env.get("id"):
        env_line = (f"`{env['id']}`, {env['num_agents']} agents, {env['num_turns']} "
                    f"turn{'s' if env['num_turns'] != 1 else ''}"
                    + (", each answer's verifier score shown to the team" if env.get("show_scores") else ""))
    lines = ["---", yaml.safe_dump(metadata, sort_keys=False).rstrip(), "---", "",
             f"# A team of {len(agents)} agent{'s' if len(agents) != 1 else ''} trained on "
             f"{('`' + env['id'] + '`') if env.get('id') else 'a multi-agent text env'}", "",
             f"Trained with llm-marl-envs (`pip install llm-marl-envs`), checkpoint of step {manifest.get('step')}.",
             "", f"- env: {env_line}", f"- base model: {', '.join(describe_base(b) for b in bases)}", "",
             "| agent | weights | folder |", "| --- | --- | --- |"]
    for agent in agents:
        member = members[agent]
        kind = "LoRA adapter (PEFT)" if member["weights"] == "lora" else "full model (transformers)"
        shared = [a for a in agents if a != agent and members[a]["policy"] == member["policy"]
                  and member["adapter"] is not None and members[a]["adapter"] == member["adapter"]]
        note = f", the same adapter as {', '.join(shared)}" if shared else ""
        lines.append(f"| {agent} | {kind}{note} | `{member['path']}` |")
    lines += ["", "## Held-out result", "", *held_out_lines(checkpoint, manifest), "",
              "## Training config", "", *config_lines(checkpoint), "",
              *usage_lines(manifest, bases)]
    return "\n".join(lines) + "\n"


def hub_id(base: str) -> str | None:
    """The Hub id of base model ``base``: itself, an embedded model's source, or ``None`` for a local directory."""
    if base in EMBEDDED_SOURCES:
        return EMBEDDED_SOURCES[base]
    if is_local(base):
        return None
    return base


def is_local(base: str) -> bool:
    """Whether ``base`` names a local directory rather than a Hub id."""
    return base.startswith((".", "~", "/")) or Path(base).expanduser().exists()


def describe_base(base: str) -> str:
    """One base model for the card's reader."""
    if base in EMBEDDED_SOURCES:
        return (f"`{base}`, llm-marl's embedded {EMBEDDED_SOURCES[base]} (its Q4_1 GGUF, dequantized: "
                f"`llm_marl.models.load(\"{base}\")`)")
    if is_local(base):
        return f"a local model directory `{Path(base).name}` (not on the Hub)"
    return f"`{base}`"


def held_out_lines(checkpoint: Path, manifest: Mapping[str, Any]) -> list[str]:
    """The held-out evaluation of this checkpoint's step recorded by its run, as Markdown lines."""
    run = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else None
    lines = []
    record = eval_record(run, manifest.get("step")) if run is not None else None
    if record is not None:
        low, high = record.get("eval/team_reward_ci_low"), record.get("eval/team_reward_ci_high")
        interval = f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
        episodes = record.get("eval/num_episodes")
        lines.append(f"The trainer's evaluation at step {record['step']} on held-out tasks"
                     f"{f' ({int(episodes)} episodes)' if episodes else ''}: team reward "
                     f"{record['eval/team_reward']:.3f}{interval} (mean, 95% bootstrap CI over episodes).")
        turns = sorted((k for k in record if k.startswith("eval/accuracy_turn")), key=lambda k: int(k[18:]))
        if turns:
            lines.append("Accuracy per turn: " + ", ".join(f"{record[k]:.3f}" for k in turns) + ".")
    results = results_naming(checkpoint, run)
    if results is not None:
        if lines:
            lines.append("")
        setting = "sampled" if isinstance(results.get("sampled"), dict) else "greedy"
        how = (results.get("settings") or {}).get(setting) or {}
        lines.append(f"Before and after training on {results.get('held_out_tasks', '?')} held-out tasks of split "
                     f"{results.get('split', '?')}, {setting} ({how.get('samples_per_task', '?')} per task at "
                     f"temperature {how.get('temperature', '?')}); mean [95% bootstrap CI over tasks]:")
        lines += ["", "| metric | before | after | after − before |", "| --- | --- | --- | --- |"]
        for metric in ("final_turn_accuracy", "team_answer_accuracy"):
            entry = (results.get(setting) or {}).get(metric)
            if isinstance(entry, dict) and {"before", "after", "paired_difference"} <= set(entry):
                lines.append(f"| {metric} | {_ci(entry['before'])} | {_ci(entry['after'])} | "
                             f"{_ci(entry['paired_difference'])} |")
    return lines or ["No held-out evaluation of this step was recorded next to the checkpoint (evaluate it with "
                     "`llm-marl bench ENV --checkpoint DIR`)."]


def eval_record(run: Path, step: int | None) -> dict[str, Any] | None:
    """The last ``metrics.jsonl`` record of ``run`` at ``step`` that holds the trainer's evaluation."""
    path = run / "metrics.jsonl"
    if step is None or not path.is_file():
        return None
    found = None
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("step") == step and "eval/team_reward" in record:
            found = record
    return found


def results_naming(checkpoint: Path, run: Path | None) -> dict[str, Any] | None:
    """A ``results.json`` beside the run (or one level up) whose ``checkpoint`` is this checkpoint."""
    for directory in [d for d in (run, run.parent if run else None) if d is not None]:
        path = directory / "results.json"
        if not path.is_file():
            continue
        try:
            results = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            continue
        named = results.get("checkpoint") if isinstance(results, dict) else None
        if named and Path(named).resolve() == checkpoint.resolve():
            return results
    return None


def _ci(entry: Mapping[str, Any]) -> str:
    return f"{entry['mean']:.3f} [{entry['low']:.3f}, {entry['high']:.3f}]"


def config_lines(checkpoint: Path) -> list[str]:
    """The trainer config the checkpoint was written with, as a YAML block (paths of the training machine left out)."""
    path = checkpoint / "config.json"
    if not path.is_file():
        return ["Not recorded."]
    config = {k: v for k, v in json.loads(path.read_text(encoding="utf-8")).items() if k not in LOCAL_FIELDS}
    return ["```yaml", yaml.safe_dump(config, sort_keys=False).rstrip(), "```"]


def usage_lines(manifest: Mapping[str, Any], bases: list[str]) -> list[str]:
    """How to load one agent and replay the team."""
    agents, members = manifest["agents"], manifest["members"]
    first = agents[0]
    member = members[first]
    base = member["base_model"]
    env = manifest.get("env") or {}
    if base in EMBEDDED_SOURCES or is_local(base):
        load_base = (f"base, tokenizer = load(\"{base}\")" if base in EMBEDDED_SOURCES else
                     "base, tokenizer = load(\"PATH/TO/BASE_MODEL\")          # the local base model directory")
        imports = "from llm_marl.models import load\n"
    else:
        load_base = (f"base = AutoModelForCausalLM.from_pretrained(\"{base}\")\n"
                     f"tokenizer = AutoTokenizer.from_pretrained(\"{base}\")")
        imports = "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
    lines = ["## Load one agent", ""]
    if member["weights"] == "lora":
        lines += [f"Each agent is a PEFT LoRA adapter on the base model; `{first}`:", "", "```python",
                  f"{imports}from peft import PeftModel", "", load_base,
                  f"model = PeftModel.from_pretrained(base, \"{member['path']}\")",
                  f"# from the Hub: PeftModel.from_pretrained(base, \"USER/NAME\", subfolder=\"{member['path']}\")",
                  "```"]
    else:
        lines += [f"Each agent is a whole model in transformers' format; `{first}`:", "", "```python",
                  "from transformers import AutoModelForCausalLM", "",
                  f"model = AutoModelForCausalLM.from_pretrained(\"{member['path']}\")", "```"]
    command = f"llm-marl bench {env.get('id') or 'ENV'} --checkpoint DIR"
    if env.get("id") is None:
        command += f" --num-agents {len(agents)}"
    if any(is_local(b) and b not in EMBEDDED_SOURCES for b in bases):
        command += " --base-model PATH/TO/BASE_MODEL"
    lines += ["", "## Replay the team", "",
              "`llm-marl bench` plays the trained team beside its untrained base on the same held-out tasks "
              "(`DIR`: this folder, e.g. after `hf download USER/NAME --local-dir DIR`):", "", "```bash",
              command, "```"]
    return lines


__all__ = ["export_checkpoint", "model_card"]
