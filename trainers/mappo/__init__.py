"""MAPPO (MAPoRL): multi-agent PPO with a centralized critic, influence-aware rewards and incentives.

MAPoRL: Park et al., *Multi-Agent Post-Co-Training for Collaborative Large Language Models with
Reinforcement Learning*, ACL 2025, https://arxiv.org/abs/2502.18439.

    >>> from trainers.mappo import MAPPOConfig, MAPPOTrainer
    >>> trainer = MAPPOTrainer(env, team, MAPPOConfig(max_steps=10))
    >>> trainer.train(); trainer.evaluate()

Modules: :mod:`.rewards` (turn rewards; the incentives are :mod:`trainers.common.incentives`),
:mod:`.ppo_math` (GAE and the clipped losses), :mod:`.critic` (centralized critic), :mod:`.logprobs_entropy`
(log-probs with the entropy), :mod:`.config`, :mod:`.trainer`.
The config imports no torch, so a command line can check a config before the trainer loads.
"""
from typing import Any

from ..common.incentives import IncentiveWeights, incentive_bonuses
from .config import MAPPOConfig
from .rewards import influence_aware_returns, turn_rewards

__all__ = ["MAPPOConfig", "MAPPOTrainer", "IncentiveWeights", "influence_aware_returns", "incentive_bonuses",
           "turn_rewards"]


def __getattr__(name: str) -> Any:
    if name == "MAPPOTrainer":
        from .trainer import MAPPOTrainer

        return MAPPOTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
