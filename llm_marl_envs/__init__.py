"""llm-marl-envs: multi-agent text environments where several LLMs learn to collaborate.

    >>> import llm_marl_envs
    >>> env = llm_marl_envs.make("gsm8k_debate-v0", num_agents=3, num_turns=2)
    >>> obs, infos = env.reset(seed=0)
"""
from . import envs as _envs  # registers the built-in environments  # noqa: F401
from .core import TextEnv, TextSpace, render_messages
from .data import DATA_DIR_ENV, DataNotFoundError, DatasetSpec, load_records
from .registry import EnvSpec, EnvSummary, list_envs, make, register, spec

__all__ = [
    "TextEnv", "TextSpace", "render_messages", "DATA_DIR_ENV", "DataNotFoundError", "DatasetSpec",
    "load_records", "EnvSpec", "EnvSummary", "list_envs", "make", "register", "spec",
]
__version__ = "0.1.0"
