"""Machinery shared by the trainers and the benchmark: policies, team, rollout engine, episodes,
checkpoints, logging."""
from .episode import AgentTurn, Episode
from .policy import Conversation, Generation, HFPolicy, Message, Policy, SamplingParams
from .rollout import Expansion, RolloutEngine, joint_actions
from .team import Member, Team, default_lora_config

__all__ = [
    "AgentTurn", "Episode", "Conversation", "Generation", "HFPolicy", "Message", "Policy", "SamplingParams",
    "Expansion", "RolloutEngine", "joint_actions", "Member", "Team", "default_lora_config",
]
