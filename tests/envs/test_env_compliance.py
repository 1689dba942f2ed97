"""Every registered env passes PettingZoo's parallel API/seed tests and our text-env checks, and
describes itself in one format: metadata named after its id, a docstring table and version history."""
import inspect
import re

import pytest

import llm_marl_envs
from llm_marl_envs.registry import newest_version
from llm_marl_envs.testing import text_env_api_test

# Small, fast configurations: compliance does not depend on the dataset size.
FAST_KWARGS = {"gsm_symbolic_debate-v0": {"num_tasks": 20}, "arithmetic_debate-v0": {"num_tasks": 20}}


@pytest.mark.parametrize("env_id", llm_marl_envs.list_envs())
@pytest.mark.filterwarnings("ignore:.* is out of date:DeprecationWarning")     # an older version is checked too
def test_registered_env_is_compliant(env_id):
    kwargs = FAST_KWARGS.get(env_id, {})
    text_env_api_test(lambda: llm_marl_envs.make(env_id, **kwargs))


def test_at_least_the_documented_envs_are_registered():
    documented = {"gsm8k_debate-v0", "anli_debate-v1", "gsm_symbolic_debate-v0", "tldr_writing-v0",
                  "arxiv_writing-v0", "humaneval_coding-v0", "mbpp_coding-v0", "coophumaneval_coding-v0"}
    assert documented <= set(llm_marl_envs.list_envs())


TABLE_ROWS = ("Import", "Agents", "Turns", "Action space", "Observation space", "Data", "Verifier", "Reward")


@pytest.mark.parametrize("env_id", llm_marl_envs.list_envs())
def test_registered_env_describes_itself(env_id):
    env_cls = llm_marl_envs.spec(env_id).load()
    assert env_cls.metadata["name"] == env_id
    doc = inspect.getmodule(env_cls).__doc__
    rows = re.findall(r"^\| ([^|]+?) \|", doc, re.MULTILINE)
    assert tuple(rows) == TABLE_ROWS, f"{env_id}: the docstring table must have the rows {TABLE_ROWS}, got {rows}"
    newest = newest_version(env_id)  # an older version is documented in its newest version's module
    assert f'| Import | `llm_marl_envs.make("{newest}")` |\n|---|---|\n' in doc, (
        f"{env_id}: table must open with Import"
    )
    version = env_id.rsplit("-", 1)[1]
    history = doc.split("### Version History", 1)
    assert len(history) == 2 and re.search(rf"^\* {version}: ", history[1], re.MULTILINE), \
        f"{env_id}: the docstring must end with '### Version History' listing '* {version}: ...'"
    undocumented = [name for name in llm_marl_envs.spec(env_id).parameters() if f"{name}=" not in doc]
    assert not undocumented, f"{env_id}: arguments missing from the docstring's make(...) call: {undocumented}"
