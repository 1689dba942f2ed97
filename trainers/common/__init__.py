"""What both trainers share: the config base, losses, evaluation, checkpoints, logging, scale-out.

The policies, team, rollout engine and episodes live in the runtime package :mod:`llm_marl`;
their names are re-exported here for code written against earlier releases.
"""
from llm_marl.backends.hf import HFPolicy
from llm_marl.episode import AgentTurn, Episode
from llm_marl.policy import Conversation, Generation, Message, Policy, SamplingParams
from llm_marl.rollout import Expansion, RolloutEngine, joint_actions
from llm_marl.team import Member, Team, default_lora_config

__all__ = [
    "AgentTurn", "Episode", "Conversation", "Generation", "HFPolicy", "Message", "Policy", "SamplingParams",
    "Expansion", "RolloutEngine", "joint_actions", "Member", "Team", "default_lora_config",
]
