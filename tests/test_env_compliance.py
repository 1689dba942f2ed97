"""Every registered env passes PettingZoo's parallel API/seed tests and our text-env checks."""
import pytest

import llm_marl_envs
from llm_marl_envs.testing import text_env_api_test

# Small, fast configurations: compliance does not depend on the dataset size.
FAST_KWARGS = {"gsm_symbolic_debate-v0": {"num_tasks": 20}, "arithmetic_debate-v0": {"num_tasks": 20}}


@pytest.mark.parametrize("env_id", llm_marl_envs.list_envs())
def test_registered_env_is_compliant(env_id):
    kwargs = FAST_KWARGS.get(env_id, {})
    text_env_api_test(lambda: llm_marl_envs.make(env_id, **kwargs))


def test_at_least_the_documented_envs_are_registered():
    documented = {"gsm8k_debate-v0", "anli_debate-v0", "gsm_symbolic_debate-v0", "tldr_writing-v0",
                  "arxiv_writing-v0", "humaneval_coding-v0", "mbpp_coding-v0", "coophumaneval_coding-v0"}
    assert documented <= set(llm_marl_envs.list_envs())
