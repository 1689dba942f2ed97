"""MAPPO (MAPoRL): multi-agent PPO with a centralized critic, influence-aware rewards and incentives.

MAPoRL: Park et al., *Multi-Agent Post-Co-Training for Collaborative Large Language Models with
Reinforcement Learning*, ACL 2025, https://arxiv.org/abs/2502.18439.

    >>> from trainers.mappo import MAPPOConfig, MAPPOTrainer
    >>> trainer = MAPPOTrainer(env, team, MAPPOConfig(max_steps=10))
    >>> trainer.train(); trainer.evaluate()

Modules: :mod:`.rewards` (turn rewards; the incentives are :mod:`trainers.common.incentives`),
:mod:`.ppo_math` (GAE and the clipped losses), :mod:`.critic` (centralized critic), :mod:`.logprobs_entropy`
(log-probs with the entropy), :mod:`.config`, :mod:`.trainer`.
"""
from ..common.incentives import IncentiveWeights, incentive_bonuses
from .config import MAPPOConfig
from .rewards import influence_aware_returns, turn_rewards
from .trainer import MAPPOTrainer

__all__ = ["MAPPOConfig", "MAPPOTrainer", "IncentiveWeights", "influence_aware_returns", "incentive_bonuses",
           "turn_rewards"]
