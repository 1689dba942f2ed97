"""Deprecated: moved to :mod:`llm_marl.policy`. This alias works for one release and warns."""
import warnings

from llm_marl.backends.hf import BASE_ADAPTER, HFPolicy, completion_targets, reserved_cache, shared_rows  # noqa: F401
from llm_marl.policy import Conversation, Generation, Message, Policy, SamplingParams  # noqa: F401
warnings.warn("trainers.common.policy moved to llm_marl.policy; import from there (this alias goes away in the next release)",
              DeprecationWarning, stacklevel=2)
