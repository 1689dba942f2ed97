"""Trainers for teams of LLM agents: MAGRPO (``trainers.magrpo``) and MAPPO (``trainers.mappo``).

Shared machinery (policies, team, rollout engine, checkpoints, logging) lives in
``trainers.common``.
"""
