"""What both trainers share: the trainer shell, the config base, MAPoRL's incentives, losses, evaluation,
checkpoints, logging, scale-out.

The policies, team, rollout engine and episodes live in the runtime package :mod:`llm_marl`
(:mod:`llm_marl.backends`, :mod:`llm_marl.team`, :mod:`llm_marl.rollout`, :mod:`llm_marl.episode`).
"""
