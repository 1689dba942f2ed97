"""Deprecated: moved to :mod:`llm_marl.episode`. This alias works for one release and warns."""
import warnings

from llm_marl.episode import AgentTurn, Episode, jsonable_info  # noqa: F401
warnings.warn("trainers.common.episode moved to llm_marl.episode; import from there (this alias goes away in the next release)",
              DeprecationWarning, stacklevel=2)
