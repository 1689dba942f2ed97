"""Deprecated: moved to :mod:`llm_marl.team`. This alias works for one release and warns."""
import warnings

from llm_marl.team import Member, Team, default_lora_config  # noqa: F401
warnings.warn("trainers.common.team moved to llm_marl.team; import from there (this alias goes away in the next release)",
              DeprecationWarning, stacklevel=2)
