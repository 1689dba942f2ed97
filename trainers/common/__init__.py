"""Machinery shared by the trainers and the benchmark: policies, team, rollout engine, episodes,
checkpoints, logging."""
from llm_marl.backends.hf import HFPolicy
from llm_marl.episode import AgentTurn, Episode
from llm_marl.policy import Conversation, Generation, Message, Policy, SamplingParams
from llm_marl.rollout import Expansion, RolloutEngine, joint_actions
from llm_marl.team import Member, Team, default_lora_config

from .stats import bootstrap_ci

__all__ = [
    "AgentTurn", "Episode", "Conversation", "Generation", "HFPolicy", "Message", "Policy", "SamplingParams",
    "Expansion", "RolloutEngine", "joint_actions", "bootstrap_ci", "Member", "Team", "default_lora_config",
]
