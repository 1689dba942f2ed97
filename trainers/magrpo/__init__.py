"""MAGRPO (multi-agent group-relative policy optimisation, CoMLRL): config and trainer.

The config imports no torch, so a command line can check a config before the trainer loads.
"""
from typing import Any

from .config import MAGRPOConfig

__all__ = ["MAGRPOConfig", "MAGRPOTrainer", "group_advantages"]


def __getattr__(name: str) -> Any:
    if name in ("MAGRPOTrainer", "group_advantages"):
        from . import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
