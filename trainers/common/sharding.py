"""Deprecated: moved to :mod:`llm_marl.sharding`. This alias works for one release and warns."""
import warnings

from llm_marl.sharding import full_state, full_tensor, shard_like, shard_optimizer_state  # noqa: F401
warnings.warn("trainers.common.sharding moved to llm_marl.sharding; import from there (this alias goes away in the next release)",
              DeprecationWarning, stacklevel=2)
