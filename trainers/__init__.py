"""Trainers for teams of LLM agents: MAGRPO (``trainers.magrpo``) and MAPPO (``trainers.mappo``).

Shared machinery (the trainer shell, configs, incentives, checkpoints, logging) lives in
``trainers.common``; options that are not part of an algorithm yet live in ``trainers.experimental``.
"""
