"""MAGRPO (multi-agent group-relative policy optimisation, CoMLRL): config and trainer."""
from .config import MAGRPOConfig
from .trainer import MAGRPOTrainer, group_advantages

__all__ = ["MAGRPOConfig", "MAGRPOTrainer", "group_advantages"]
