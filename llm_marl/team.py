"""`Team`: which policy (and which LoRA adapter on it) acts for each env agent.

Three layouts, one class:

- ``Team.adapter_per_agent(model, tokenizer, agents)``: one frozen base shared by every agent, one
  PEFT LoRA adapter per agent (named after the agent). Memory of N agents ≈ one model; all
  agents are sampled in one mixed-adapter batch.
- ``Team.separate([(model, tokenizer), ...], agents)``: one model per agent (full fine-tune,
  or LoRA each with ``lora_config``); models may differ (heterogeneous teams).
- ``Team.from_policies({agent: policy})``: any :class:`~llm_marl.policy.Policy`
  backends (e.g. inference-only llama.cpp or HTTP backends in the benchmark).
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .backends.hf import HFPolicy
from .policy import Policy


@dataclass(frozen=True)
class Member:
    """One agent's seat: the policy that acts for it and the adapter it uses (``None`` = the policy's base)."""

    policy: Policy
    adapter: str | None = None


def default_lora_config(r: int = 8, alpha: int = 16, dropout: float = 0.0, target_modules: Any = "all-linear"):
    """A PEFT ``LoraConfig`` for causal LMs (rank ``r`` on every linear layer but the LM head)."""
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules,
                      bias="none", task_type="CAUSAL_LM")


def _agent_names(agents: int | Sequence[str]) -> list[str]:
    if isinstance(agents, int):
        if agents < 1:
            raise ValueError(f"agents must be >= 1, got {agents}")
        return [f"agent_{i}" for i in range(agents)]
    names = list(agents)
    if not names or len(set(names)) != len(names):
        raise ValueError(f"agents must be distinct non-empty names, got {names}")
    return names


def with_adapters(model, adapter_names: Sequence[str], lora_config=None):
    """Wrap ``model`` in PEFT with one LoRA adapter per name; the base stays frozen.

    ``lora_config``: one PEFT config for every adapter, or ``{adapter name: config}``; ``None``:
    :func:`default_lora_config`.
    """
    from peft import get_peft_model

    def config_of(name: str):
        config = lora_config.get(name) if isinstance(lora_config, Mapping) else lora_config
        return config or default_lora_config()

    with warnings.catch_warnings():    # PEFT reads transformers' deprecated is_gradient_checkpointing: not ours to fix
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        peft_model = get_peft_model(model, config_of(adapter_names[0]), adapter_name=adapter_names[0])
    for name in adapter_names[1:]:
        peft_model.add_adapter(name, config_of(name))
    return peft_model


class Team:
    """Maps env agents to :class:`Member` seats (policy + adapter)."""

    def __init__(self, members: Mapping[str, Member]) -> None:
        if not members:
            raise ValueError("a team needs at least one member")
        self.members: dict[str, Member] = dict(members)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def adapter_per_agent(cls, model, tokenizer, agents: int | Sequence[str] = 2, lora_config=None,
                          name: str | None = None) -> Team:
        """One frozen base shared by all agents with one LoRA adapter per agent (adapter name = agent name)."""
        names = _agent_names(agents)
        policy = HFPolicy(with_adapters(model, names, lora_config), tokenizer, name=name)
        return cls({agent: Member(policy, agent) for agent in names})

    @classmethod
    def shared_adapter(cls, model, tokenizer, agents: int | Sequence[str] = 2, lora_config=None,
                       name: str | None = None, adapter: str = "shared") -> Team:
        """Parameter sharing: one frozen base and one LoRA adapter (``adapter``) that every agent acts and trains
        with; trainers step it once per turn on all the agents' samples."""
        names = _agent_names(agents)
        policy = HFPolicy(with_adapters(model, [adapter], lora_config), tokenizer, name=name)
        return cls({agent: Member(policy, adapter) for agent in names})

    @classmethod
    def separate(cls, models: Sequence[tuple[Any, Any]], agents: Sequence[str] | None = None,
                 lora_config=None, names: Sequence[str] | None = None) -> Team:
        """One ``(model, tokenizer)`` per agent (full fine-tune, or a LoRA adapter each when ``lora_config``).

        ``names``: each model's name as given to :func:`llm_marl.models.load` (recorded in checkpoints; default:
        the model's ``name_or_path``).
        """
        agent_names = _agent_names(agents if agents is not None else len(models))
        if len(agent_names) != len(models):
            raise ValueError(f"got {len(models)} models for {len(agent_names)} agents; pass one (model, tokenizer) "
                             f"per agent")
        if names is not None and len(names) != len(models):
            raise ValueError(f"got {len(names)} names for {len(models)} models; pass one name per model")
        if len({id(m) for m, _ in models}) != len(models):
            raise ValueError("Team.separate needs distinct model objects; use Team.adapter_per_agent to share one base")
        members = {}
        for i, (agent, (model, tokenizer)) in enumerate(zip(agent_names, models)):
            name = names[i] if names is not None else None
            if lora_config is not None:
                members[agent] = Member(HFPolicy(with_adapters(model, [agent], lora_config), tokenizer, name=name),
                                        agent)
            else:
                members[agent] = Member(HFPolicy(model, tokenizer, name=name), None)
        return cls(members)

    @classmethod
    def from_policies(cls, policies: Mapping[str, Policy | tuple[Policy, str | None]]) -> Team:
        """Seat any policies: ``{agent: policy}`` or ``{agent: (policy, adapter)}``."""
        members = {}
        for agent, value in policies.items():
            policy, adapter = value if isinstance(value, tuple) else (value, None)
            if not isinstance(policy, Policy):
                raise ValueError(f"{agent}: {type(policy).__name__} is not a Policy (needs .name and .generate)")
            members[agent] = Member(policy, adapter)
        return cls(members)

    # ------------------------------------------------------------------ queries
    @property
    def agents(self) -> list[str]:
        """Agent names in seat order."""
        return list(self.members)

    def policy(self, agent: str) -> Policy:
        """The policy acting for ``agent``."""
        return self._member(agent).policy

    def adapter(self, agent: str) -> str | None:
        """The adapter ``agent`` uses on its policy (``None`` = base)."""
        return self._member(agent).adapter

    def policies(self) -> list[Policy]:
        """Distinct policies, in seat order (one batched generate call each per turn)."""
        seen: dict[int, Policy] = {}
        for member in self.members.values():
            seen.setdefault(id(member.policy), member.policy)
        return list(seen.values())

    def check_covers(self, env_agents: Sequence[str]) -> None:
        """Raise ``ValueError`` unless every env agent has a seat."""
        missing = [a for a in env_agents if a not in self.members]
        if missing:
            raise ValueError(f"team has no member for env agent(s) {missing}; team agents: {self.agents}. "
                             f"Build the team with the env's agents (env.possible_agents)")

    def _member(self, agent: str) -> Member:
        try:
            return self.members[agent]
        except KeyError:
            raise ValueError(f"unknown agent {agent!r}; team agents: {self.agents}") from None
