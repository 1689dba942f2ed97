"""Deprecated: moved to :mod:`llm_marl.backends`. This alias works for one release and warns."""
import warnings

from llm_marl.backends import (BACKENDS, CountedGeneration, LlamaCppPolicy, OpenAIPolicy,  # noqa: F401
                                ServerUnreachableError, load_policy)
from llm_marl.hardware import free_cores  # noqa: F401
warnings.warn("trainers.common.inference moved to llm_marl.backends; import from there "
              "(this alias goes away in the next release)",
              DeprecationWarning, stacklevel=2)
