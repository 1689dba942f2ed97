"""Deprecated: moved to :mod:`llm_marl.rollout`. This alias works for one release and warns."""
import warnings

from llm_marl.rollout import Expansion, RolloutEngine, joint_actions  # noqa: F401
warnings.warn("trainers.common.rollout moved to llm_marl.rollout; import from there (this alias goes away in the next release)",
              DeprecationWarning, stacklevel=2)
