"""A trained team's checkpoint read back for inference: ``team.json``, the agents' weights, rebuilding the team.

The trainers write ``<output_dir>/checkpoints/step-NNNNNN/`` (:mod:`trainers.common.checkpoint`);
this module owns what such a directory says about its team and how each agent's weights are
stored, so that the benchmark (which sits below the trainers) can load one::

    agents/<agent>/adapter_config.json        a LoRA agent: its adapter in PEFT's own format,
    agents/<agent>/adapter_model.safetensors  PeftModel.from_pretrained(base, "agents/<agent>") loads it
    agents/<agent>/config.json                a fully fine-tuned agent: the model in transformers' format,
    agents/<agent>/model.safetensors          AutoModelForCausalLM.from_pretrained("agents/<agent>") loads it
    team.json                                 the manifest below

``team.json``::

    {"format": 2, "step": 12, "base_model": "smollm2-135m", "agents": ["agent_0", "agent_1"],
     "env": {"id": "arithmetic_debate-v0", "num_agents": 2, "num_turns": 1},
     "members": {"agent_0": {"base_model": "smollm2-135m", "policy": 0, "adapter": "agent_0",
                             "weights": "lora", "path": "agents/agent_0"}, ...}}

``base_model`` is the base model as given to :func:`llm_marl.models.load`: an embedded model's name
(also when the team was built from its cached conversion), a hub id or a local directory; the
top-level one is the team's base, or the list of its bases. Members with the same ``policy`` index
share one base (``Team.adapter_per_agent``); ``weights`` is ``"lora"`` or ``"full"``; ``path`` is the
agent's folder, relative to the checkpoint. Agents that share one adapter (``Team.shared_adapter``) each
get a copy of it, so every agent folder loads on its own. :func:`load_team` loads each base once,
adds the adapters with their saved PEFT configs, loads every agent's tensors and seats the agents
as they were trained. A checkpoint without ``team.json``, or of another format, is refused.

:func:`save_team` writes such a directory for a team that only needs replaying (no optimizer, scheduler or
RNG state: nothing to resume training from).

A base model recorded as a local directory that has since moved is named in a ``ValueError``;
``base_model=`` (``llm-marl bench --base-model DIR``) says where it is now (:func:`relocate_base`).
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from .backends.hf import HFPolicy
from .files import replace_directory
from .models import load
from .team import Member, Team, with_adapters

PREFIX = "step-"
MANIFEST_FILE = "team.json"
MANIFEST_FORMAT = 2
AGENTS_DIR = "agents"
# each kind of agent's files, in the formats PEFT and transformers load
WEIGHT_FILES = {"lora": ("adapter_config.json", "adapter_model.safetensors"),
                "full": ("config.json", "model.safetensors")}


# ---------------------------------------------------------------------------------- where checkpoints are
def checkpoint_dir(output_dir: str | os.PathLike, step: int) -> Path:
    """``<output_dir>/checkpoints/step-<step>``."""
    return Path(output_dir) / "checkpoints" / f"{PREFIX}{step:06d}"


def newest_step(root: str | os.PathLike) -> Path | None:
    """The ``step-*`` directory of ``root`` with the highest step (``None`` if there is none)."""
    root = Path(root)
    found = sorted(p for p in root.glob(f"{PREFIX}*") if p.is_dir()) if root.is_dir() else []
    return found[-1] if found else None


def latest_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint under ``output_dir/checkpoints`` (``None`` if there is none)."""
    return newest_step(Path(output_dir) / "checkpoints")


def find_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint dir from a ``step-*`` dir, a ``checkpoints`` dir or a training ``output_dir`` (newest step)."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"checkpoint {str(path)!r} does not exist or is not a directory; pass a training output_dir, "
                         f"its checkpoints/ dir or one checkpoints/step-* dir")
    if (path / AGENTS_DIR).is_dir():
        return path
    found = newest_step(path) or latest_checkpoint(path)
    if found is None:
        raise ValueError(f"{path} holds no {PREFIX}* checkpoint (looked in {path} and {path / 'checkpoints'}); pass a "
                         f"training output_dir, its checkpoints/ dir or one checkpoints/step-* dir")
    return found


# ---------------------------------------------------------------------------------- the manifest
def team_manifest(team: Team, agents: Sequence[str] | None = None, env: Any = None,
                  step: int | None = None) -> dict[str, Any]:
    """The JSON-ready ``team.json`` of ``team``'s ``agents`` (default: all), trained on ``env`` (its id and shape)."""
    agents = list(agents if agents is not None else team.agents)
    policies: list[int] = []
    members = {}
    for agent in agents:
        policy, adapter = team.policy(agent), team.adapter(agent)
        if not isinstance(policy, HFPolicy):
            raise ValueError(f"{agent}'s policy {policy.name!r} is not a transformers model (HFPolicy); only trained "
                             f"HF teams have a checkpoint manifest")
        if id(policy) not in policies:
            policies.append(id(policy))
        members[agent] = {"base_model": base_model_name(policy.name), "policy": policies.index(id(policy)),
                          "adapter": adapter, "weights": "lora" if adapter is not None else "full",
                          "path": f"{AGENTS_DIR}/{agent}"}
    bases = list(dict.fromkeys(member["base_model"] for member in members.values()))
    manifest: dict[str, Any] = {"format": MANIFEST_FORMAT, "step": step,
                                "base_model": bases[0] if len(bases) == 1 else bases, "agents": agents,
                                "members": members}
    if env is not None:
        manifest["env"] = {"id": getattr(env, "env_id", None), "num_agents": len(env.possible_agents),
                           "num_turns": env.num_turns}
        if getattr(env, "show_scores", False):      # `bench --checkpoint` replays it reading the scores too
            manifest["env"]["show_scores"] = True
    return manifest


def base_model_name(name: str) -> str:
    """What ``team.json`` records for base model ``name``: an embedded model's name for the directory it was
    converted into (``$LLM_MARL_CACHE/models/<name>``), else ``name`` as given."""
    from .models import EMBEDDED_MODELS, cache_root

    if Path(name).is_absolute():
        for embedded in EMBEDDED_MODELS:
            if same_model(name, str(cache_root() / "models" / embedded)):
                return embedded
    return name


def write_manifest(directory: str | os.PathLike, manifest: Mapping[str, Any]) -> Path:
    """Write ``team.json`` into ``directory`` (inside a checkpoint's temp dir, before it is renamed into place)."""
    path = Path(directory) / MANIFEST_FILE
    path.write_text(json.dumps(dict(manifest), indent=2) + "\n", encoding="utf-8")
    return path


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    """The ``team.json`` of checkpoint dir ``path``; ``ValueError`` saying what is missing when it has none."""
    file = Path(path) / MANIFEST_FILE
    if not file.is_file():
        raise ValueError(
            f"checkpoint {path} has no {MANIFEST_FILE}, so its base model, agents and LoRA settings are unknown and "
            f"a team rebuilt from guesses would not be the trained one; pass a checkpoint the trainers (or "
            f"`llm-marl export`) wrote: a step-* dir with {MANIFEST_FILE} and {AGENTS_DIR}/<agent>/ folders")
    manifest = json.loads(file.read_text(encoding="utf-8"))
    found = manifest.get("format")
    if isinstance(found, int) and found < MANIFEST_FORMAT:
        raise ValueError(f"{file} has format {found}, written by a development version before 0.1.0 "
                         f"(agents/<agent>.safetensors); this version reads format {MANIFEST_FORMAT}, whose agent "
                         f"folders agents/<agent>/ hold {' + '.join(WEIGHT_FILES['lora'])} (a LoRA agent) or "
                         f"{' + '.join(WEIGHT_FILES['full'])} (a fully fine-tuned one): train the team again")
    if found != MANIFEST_FORMAT:
        raise ValueError(f"{file} has format {found!r}, this version reads format {MANIFEST_FORMAT}; "
                         f"update llm-marl-envs")
    return manifest


def manifest_models(manifest: Mapping[str, Any]) -> list[str]:
    """The base model of each agent of a manifest, in agent order."""
    return [manifest["members"][agent]["base_model"] for agent in manifest["agents"]]


def same_model(a: str, b: str) -> bool:
    """Whether two model names mean the same model: equal, or paths of one directory."""
    if a == b:
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_models(path: str | os.PathLike, manifest: Mapping[str, Any], models: Sequence[str]) -> None:
    """``ValueError`` naming both sides unless ``models`` (one, or one per agent, cycled) are the checkpoint's."""
    trained = manifest_models(manifest)
    asked = [models[i % len(models)] for i in range(len(trained))]
    if not all(same_model(a, t) for a, t in zip(asked, trained)):
        raise ValueError(f"checkpoint {path} was trained on base model {_one_or_all(trained)!r}, but the model asked "
                         f"for is {_one_or_all(asked)!r}; drop --model/--models (the checkpoint names its base) or "
                         f"pass {_one_or_all(trained)!r}")


def relocate_base(path: str | os.PathLike, manifest: Mapping[str, Any], base_model: str) -> dict[str, Any]:
    """``manifest`` with every member's base model at ``base_model`` (a team trained on one base that moved)."""
    bases = list(dict.fromkeys(manifest_models(manifest)))
    if len(bases) > 1:
        raise ValueError(f"checkpoint {path} was trained on several base models {bases}; base_model= gives the new "
                         f"location of a team's one base model, so it cannot say where each of these is now")
    members = {agent: {**member, "base_model": base_model} for agent, member in manifest["members"].items()}
    return {**manifest, "base_model": base_model, "members": members}


def check_base_models(path: str | os.PathLike, manifest: Mapping[str, Any]) -> None:
    """``ValueError`` naming a base model recorded as a local directory that is not there any more, and the fix."""
    for name in dict.fromkeys(manifest_models(manifest)):
        local = Path(name).expanduser()
        if (local.is_absolute() or name.startswith((".", "~"))) and not local.exists():
            raise ValueError(f"checkpoint {path} was trained on the base model in {name!r}, which does not exist any "
                             f"more; if it moved, say where it is now: base_model='NEW_DIR' "
                             f"(llm-marl bench --base-model NEW_DIR)")


def _one_or_all(names: Sequence[str]) -> str | list[str]:
    """The one name of a team on one model, else every agent's."""
    return names[0] if len(set(names)) == 1 else list(names)


def check_agents(path: str | os.PathLike, manifest: Mapping[str, Any], agents: Sequence[str]) -> None:
    """``ValueError`` naming both sides unless the env's ``agents`` are the checkpoint's."""
    trained = list(manifest["agents"])
    if trained != list(agents):
        raise ValueError(f"checkpoint {path} holds a team of {len(trained)} agents {trained}, but the env has "
                         f"{len(agents)}: {list(agents)}; run it with {len(trained)} agents "
                         f"(--num-agents {len(trained)})")


# ---------------------------------------------------------------------------------- agents' weights
def write_agent(directory: str | os.PathLike, policy: HFPolicy, adapter: str | None,
                weights: Mapping[str, Any] | None = None, base_model: str | None = None) -> Path:
    """Write one agent's weights into the new folder ``directory``: its LoRA ``adapter`` in PEFT's format, or
    (``adapter=None``) the whole model in transformers' (see the module docstring).

    ``weights``: the tensors as ``policy.trainable_state_dict(adapter)`` names them (e.g. gathered whole from
    shards; default: read from the policy); ``base_model``: the base model's name the adapter config records
    (default: :func:`base_model_name` of the policy's).
    """
    directory = Path(directory)
    directory.mkdir(parents=True)
    weights = policy.trainable_state_dict(adapter) if weights is None else weights
    if adapter is None:
        policy.model.config.save_pretrained(directory)
        tensors, file = weights, WEIGHT_FILES["full"][1]
    else:
        config = copy.deepcopy(policy.model.peft_config[adapter])
        config.base_model_name_or_path = base_model or base_model_name(policy.name)
        config.inference_mode = True            # as PEFT saves it: PeftModel.from_pretrained(is_trainable=) decides
        config.save_pretrained(str(directory))
        tensors, file = policy.peft_state_dict(adapter, weights), WEIGHT_FILES["lora"][1]
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / file), metadata={"format": "pt"})
    return directory


def agent_dir(path: str | os.PathLike, manifest: Mapping[str, Any], agent: str) -> Path:
    """The folder of ``agent``'s weights in checkpoint ``path``; ``ValueError`` for an agent it lacks, or a
    ``path`` entry that is not a relative path inside the checkpoint."""
    member = manifest["members"].get(agent)
    if member is None:
        raise ValueError(f"checkpoint {path} has no weights for agent {agent!r}: it holds agents "
                         f"{list(manifest['members'])}; was it written by another team?")
    relative = Path(str(member.get("path", "")))
    if not member.get("path") or relative.is_absolute() or ".." in relative.parts:
        raise ValueError(f"{Path(path) / MANIFEST_FILE}: agent {agent!r} has path {member.get('path')!r}; "
                         f"expected a folder inside the checkpoint such as '{AGENTS_DIR}/{agent}'")
    return Path(path) / relative


def agent_weights_file(path: str | os.PathLike, agent: str) -> Path:
    """The safetensors file of ``agent``'s weights in checkpoint ``path`` (adapter or whole model)."""
    manifest = read_manifest(path)
    return agent_dir(path, manifest, agent) / WEIGHT_FILES[manifest["members"][agent]["weights"]][1]


def read_agent(path: str | os.PathLike, manifest: Mapping[str, Any], agent: str, policy: HFPolicy,
               adapter: str | None) -> None:
    """Load ``agent``'s saved weights (checkpoint ``path``, its ``manifest``) into ``adapter`` of ``policy`` (``None``:
    the whole model); a ``ValueError`` names missing files, LoRA settings that differ from the adapter's
    (:func:`check_lora_settings`), or the tensors that do not fit and both shapes."""
    from safetensors.torch import load_file

    directory = agent_dir(path, manifest, agent)
    kind = manifest["members"][agent]["weights"]
    if kind != ("full" if adapter is None else "lora"):
        raise ValueError(f"checkpoint {path} holds {kind} weights for agent {agent!r}, but its seat here "
                         f"{'has no adapter (a full model)' if adapter is None else f'uses adapter {adapter!r}'}")
    missing = [name for name in WEIGHT_FILES[kind] if not (directory / name).is_file()]
    if missing:
        raise ValueError(f"checkpoint {path} has no weights for agent {agent!r}: {directory} lacks {missing} "
                         f"(expected {' + '.join(WEIGHT_FILES[kind])}); the checkpoint is incomplete")
    if adapter is not None:
        check_lora_settings(directory, agent, policy, adapter)
    file = directory / WEIGHT_FILES[kind][1]
    try:
        if adapter is None:
            policy.load_trainable_state_dict(None, load_file(str(file)))
        else:
            policy.load_peft_state_dict(adapter, load_file(str(file)))
    except ValueError as error:
        raise ValueError(f"checkpoint {file} does not fit base model {policy.name!r}: {error}") from None


# LoRA settings that change what an adapter's tensors mean: another rank or set of layers does not fit, another
# alpha scales the same tensors differently
LORA_SETTINGS = ("r", "lora_alpha", "target_modules")


def check_lora_settings(directory: str | os.PathLike, agent: str, policy: HFPolicy, adapter: str) -> None:
    """``ValueError`` naming each differing setting unless the adapter saved in ``directory`` (``agent``'s) has the
    :data:`LORA_SETTINGS` of ``adapter`` in ``policy``, the adapter it is loaded into."""
    from peft import PeftConfig

    def content(value: Any) -> Any:            # target modules come back as a list or a set
        return sorted(value) if isinstance(value, (list, set, tuple)) else value

    saved, here = PeftConfig.from_pretrained(str(directory)), policy.model.peft_config[adapter]
    differ = {name: (getattr(saved, name), getattr(here, name)) for name in LORA_SETTINGS
              if content(getattr(saved, name)) != content(getattr(here, name))}
    if differ:
        raise ValueError(f"checkpoint {directory}: agent {agent!r} was trained with other LoRA settings than adapter "
                         f"{adapter!r} it is loaded into (saved, here): {differ}")


# ---------------------------------------------------------------------------------- loading
def load_team(path: str | os.PathLike, agents: Sequence[str] | None = None,
              models: Sequence[str] | None = None, base_model: str | None = None) -> Team:
    """The trained team of checkpoint ``path`` (any form :func:`find_checkpoint` takes), ready for inference.

    Each base model is loaded once with :func:`llm_marl.models.load`, carries the adapters of the
    agents that shared it (with the PEFT configs they were saved with), and every agent's tensors are
    loaded onto its seat. ``agents``: the env's agents, which must be the checkpoint's; ``models``: base
    models asked for, which must be the checkpoint's; ``base_model``: where the team's base model is now,
    when the local directory it was trained from moved (then ``models`` must name it). A tensor that does
    not fit the model is a ``ValueError`` naming both shapes.
    """
    from peft import PeftConfig

    path = find_checkpoint(path)
    manifest = read_manifest(path)
    if base_model is not None:
        manifest = relocate_base(path, manifest, base_model)
    check_base_models(path, manifest)
    if agents is not None:
        check_agents(path, manifest, agents)
    if models is not None:
        check_models(path, manifest, models)
    members = manifest["members"]
    groups: dict[int, list[str]] = {}
    for agent in manifest["agents"]:
        groups.setdefault(members[agent]["policy"], []).append(agent)
    seats = {}
    for group in groups.values():
        name = members[group[0]]["base_model"]
        lora = {}
        for agent in group:
            directory = agent_dir(path, manifest, agent)
            if members[agent]["weights"] == "lora" and (directory / WEIGHT_FILES["lora"][0]).is_file():
                config = PeftConfig.from_pretrained(str(directory))
                config.base_model_name_or_path = None      # the base is team.json's (maybe relocated): PEFT fills it
                lora.setdefault(members[agent]["adapter"], config)
        model, tokenizer = load(name)
        if lora:
            model = with_adapters(model, list(lora), lora)
        policy = HFPolicy(model, tokenizer, name=name)
        for agent in group:
            adapter = members[agent]["adapter"]
            read_agent(path, manifest, agent, policy, adapter)
            seats[agent] = Member(policy, adapter)
    return Team({agent: seats[agent] for agent in manifest["agents"]})


def shared_bases(team: Team) -> dict[str, HFPolicy]:
    """``{model name: policy}`` of the team's LoRA policies: with adapters off, each is its untrained base."""
    return {p.name: p for p in team.policies() if isinstance(p, HFPolicy) and p.is_peft}


# ---------------------------------------------------------------------------------- replay-only teams
def write_team(directory: str | os.PathLike, team: Team, agents: Sequence[str] | None = None, env: Any = None,
               step: int | None = None) -> None:
    """Write ``team``'s ``agents`` (default: all) into ``directory``: each agent's folder and ``team.json``."""
    directory = Path(directory)
    agents = list(agents if agents is not None else team.agents)
    manifest = team_manifest(team, agents, env=env, step=step)
    for agent in agents:
        write_agent(agent_dir(directory, manifest, agent), team.policy(agent), team.adapter(agent),
                    base_model=manifest["members"][agent]["base_model"])
    write_manifest(directory, manifest)


def save_team(output_dir: str | os.PathLike, step: int, team: Team, agents: Sequence[str] | None = None,
              env: Any = None) -> Path:
    """Write ``team`` as the replay-only checkpoint ``<output_dir>/checkpoints/step-<step>``; its path.

    It holds what :func:`load_team` and ``llm-marl bench --checkpoint`` read (each agent's folder and
    ``team.json``, with ``env``'s id and shape), and no optimizer, scheduler or RNG state. It is written to a
    temp dir and renamed into place, replacing a checkpoint of the same step.
    """
    target = checkpoint_dir(output_dir, step)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}.", dir=target.parent))
    try:
        write_team(tmp, team, agents, env=env, step=step)
        replace_directory(tmp, target)                        # re-saving a step swaps the old one out first
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


__all__ = ["AGENTS_DIR", "LORA_SETTINGS", "MANIFEST_FILE", "PREFIX", "WEIGHT_FILES", "agent_dir", "agent_weights_file",
           "base_model_name", "check_agents", "check_base_models", "check_lora_settings", "check_models",
           "checkpoint_dir", "find_checkpoint", "latest_checkpoint", "load_team", "manifest_models", "newest_step",
           "read_agent", "read_manifest", "relocate_base", "same_model", "save_team", "shared_bases", "team_manifest",
           "write_agent", "write_manifest", "write_team"]
