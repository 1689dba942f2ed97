"""A trained team's checkpoint read back for inference: ``team.json``, finding the step, rebuilding the team.

The trainers write ``<output_dir>/checkpoints/step-NNNNNN/`` (:mod:`trainers.common.checkpoint`);
this module owns what such a directory says about its team, so that the benchmark (which sits
below the trainers) can load one::

    agents/<agent>.safetensors   each agent's trained tensors: its LoRA adapter, or the whole model
    team.json                    the manifest below

``team.json``::

    {"format": 1, "step": 12, "agents": ["agent_0", "agent_1"],
     "env": {"id": "arithmetic_debate-v0", "num_agents": 2, "num_turns": 1},
     "members": {"agent_0": {"model": "smollm2-135m", "policy": 0, "adapter": "agent_0", "weights": "lora",
                             "lora": {"r": 8, "lora_alpha": 16, "target_modules": [...], ...}}, ...}}

``model`` is the base model as given to :func:`llm_marl.models.load` (the policy's name); members
with the same ``policy`` index share one base (``Team.shared_lora``); ``weights`` is ``"lora"``
(``lora``: the adapter's PEFT config, as in PEFT's ``adapter_config.json``) or ``"full"``.
:func:`load_team` loads each base once, adds the adapters, loads every agent's tensors and
seats the agents as they were trained. A checkpoint without ``team.json`` (written before
checkpoints carried one) is refused: its base model and LoRA scaling cannot be told from its tensors.

:func:`save_team` writes such a directory for a team that only needs replaying (no optimizer, scheduler or
RNG state: nothing to resume training from).

A base model recorded as a local directory that has since moved is named in a ``ValueError``;
``base_model=`` (``llm-marl bench --base-model DIR``) says where it is now (:func:`relocate_base`).
"""
from __future__ import annotations

import enum
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .backends.hf import HFPolicy
from .models import load
from .team import Member, Team, with_adapters

PREFIX = "step-"
MANIFEST_FILE = "team.json"
MANIFEST_FORMAT = 1


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
    if (path / "agents").is_dir():
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
        lora = _jsonable(policy.model.peft_config[adapter].to_dict()) if adapter is not None else None
        members[agent] = {"model": policy.name, "policy": policies.index(id(policy)), "adapter": adapter,
                          "weights": "lora" if adapter is not None else "full", "lora": lora}
    manifest: dict[str, Any] = {"format": MANIFEST_FORMAT, "step": step, "agents": agents, "members": members}
    if env is not None:
        manifest["env"] = {"id": getattr(env, "env_id", None), "num_agents": len(env.possible_agents),
                           "num_turns": env.num_turns}
        if getattr(env, "show_scores", False):      # `bench --checkpoint` replays it reading the scores too
            manifest["env"]["show_scores"] = True
    return manifest


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
            f"checkpoint {path} has no {MANIFEST_FILE}: it was written before checkpoints recorded their team, so "
            f"its base model, agents and LoRA settings (r, alpha, target modules) are unknown and a team rebuilt "
            f"from guesses would not be the trained one. Rebuild the team it was trained with in Python and write "
            f"one: llm_marl.team_checkpoint.write_manifest(dir, team_manifest(team))")
    manifest = json.loads(file.read_text(encoding="utf-8"))
    if manifest.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{file} has format {manifest.get('format')!r}, this version reads format {MANIFEST_FORMAT}; "
                         f"update llm-marl-envs")
    return manifest


def manifest_models(manifest: Mapping[str, Any]) -> list[str]:
    """The base model of each agent of a manifest, in agent order."""
    return [manifest["members"][agent]["model"] for agent in manifest["agents"]]


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
    members = {agent: {**member, "model": base_model} for agent, member in manifest["members"].items()}
    for member in members.values():
        if member.get("lora") and "base_model_name_or_path" in member["lora"]:
            member["lora"] = {**member["lora"], "base_model_name_or_path": base_model}
    return {**manifest, "members": members}


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


# ---------------------------------------------------------------------------------- loading
def load_team(path: str | os.PathLike, agents: Sequence[str] | None = None,
              models: Sequence[str] | None = None, base_model: str | None = None) -> Team:
    """The trained team of checkpoint ``path`` (any form :func:`find_checkpoint` takes), ready for inference.

    Each base model is loaded once with :func:`llm_marl.models.load`, carries the adapters of the
    agents that shared it, and every agent's tensors are loaded onto its seat. ``agents``: the
    env's agents, which must be the checkpoint's; ``models``: base models asked for, which must be
    the checkpoint's; ``base_model``: where the team's base model is now, when the local directory it
    was trained from moved (then ``models`` must name it). A tensor that does not fit the model is a
    ``ValueError`` naming both shapes.
    """
    from peft import PeftConfig
    from safetensors.torch import load_file

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
        name = members[group[0]]["model"]
        model, tokenizer = load(name)
        lora = {members[a]["adapter"]: PeftConfig.from_peft_type(**members[a]["lora"]) for a in group
                if members[a]["weights"] == "lora"}
        if lora:
            model = with_adapters(model, list(lora), lora)
        policy = HFPolicy(model, tokenizer, name=name)
        for agent in group:
            file = path / "agents" / f"{agent}.safetensors"
            if not file.is_file():
                raise ValueError(f"checkpoint {path} has no weights for agent {agent!r} ({file} is missing); the "
                                 f"checkpoint is incomplete")
            adapter = members[agent]["adapter"]
            try:
                policy.load_trainable_state_dict(adapter, load_file(str(file)))
            except ValueError as error:
                raise ValueError(f"checkpoint {file} does not fit base model {name!r}: {error}") from None
            seats[agent] = Member(policy, adapter)
    return Team({agent: seats[agent] for agent in manifest["agents"]})


def shared_bases(team: Team) -> dict[str, HFPolicy]:
    """``{model name: policy}`` of the team's LoRA policies: with adapters off, each is its untrained base."""
    return {p.name: p for p in team.policies() if isinstance(p, HFPolicy) and p.is_peft}


# ---------------------------------------------------------------------------------- writing
def write_team(directory: str | os.PathLike, team: Team, agents: Sequence[str] | None = None, env: Any = None,
               step: int | None = None) -> None:
    """Write ``team``'s ``agents`` (default: all) into ``directory``: each agent's trained tensors and ``team.json``."""
    from safetensors.torch import save_file

    directory = Path(directory)
    agents = list(agents if agents is not None else team.agents)
    (directory / "agents").mkdir(parents=True, exist_ok=True)
    for agent in agents:
        state = team.policy(agent).trainable_state_dict(team.adapter(agent))
        save_file({k: v.contiguous() for k, v in state.items()}, str(directory / "agents" / f"{agent}.safetensors"))
    write_manifest(directory, team_manifest(team, agents, env=env, step=step))


def save_team(output_dir: str | os.PathLike, step: int, team: Team, agents: Sequence[str] | None = None,
              env: Any = None) -> Path:
    """Write ``team`` as the replay-only checkpoint ``<output_dir>/checkpoints/step-<step>``; its path.

    It holds what :func:`load_team` and ``llm-marl bench --checkpoint`` read (each agent's tensors and
    ``team.json``, with ``env``'s id and shape), and no optimizer, scheduler or RNG state. It is written to a
    temp dir and renamed into place, replacing a checkpoint of the same step.
    """
    target = checkpoint_dir(output_dir, step)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}.", dir=target.parent))
    try:
        write_team(tmp, team, agents, env=env, step=step)
        if target.exists():                                   # re-saving a step: swap the old one out first
            stale = target.with_name(f".stale-{target.name}")
            os.rename(target, stale)
            shutil.rmtree(stale, ignore_errors=True)
        os.rename(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _jsonable(value: Any) -> Any:
    """``value`` with sets as sorted lists and enums as their values (a PEFT config dict as JSON)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(_jsonable(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    return value


__all__ = ["MANIFEST_FILE", "PREFIX", "check_agents", "check_base_models", "check_models", "checkpoint_dir",
           "find_checkpoint", "latest_checkpoint", "load_team", "manifest_models", "newest_step", "read_manifest",
           "relocate_base", "same_model", "save_team", "shared_bases", "team_manifest", "write_manifest",
           "write_team"]
