"""CoopHumanEval coding collaboration: HumanEval-style problems chosen to need a helper.

=====================  =====================================================================
Create                 ``llm_marl_envs.make("coophumaneval_coding-v0")``
Agents                 N >= 2 (default 2): ``agent_0`` writes ``aux`` (N > 2: ``agent_k``
                       writes ``aux_k``), the last agent writes the entry point
Turns                  2 by default: feedback on the joint program between turns
Actions / observations text (``TextSpace``) / the agent's chat history rendered as text
Data                   CoopHumanEval (82 problems): hub ``OpenMLRL/CoopHumanEval`` split
                       ``test``, or local ``coophumaneval/test.jsonl``
Verifier               joint reward of :mod:`llm_marl_envs.envs.coding`; tests run in the
                       sandbox :func:`verifiers.code.run_tests` (``check(candidate)``)
Reward components      structure (<= 1.0), syntax (0.5), tests (<= 1.0), cooperation (<= 1.5);
                       max 4.0 (CoMLRL's weights, ``reward_config``)
Arguments              ``num_agents=2``, ``num_turns=2``, ``split="test"``, ``data_dir=None``,
                       ``reward_config=None``, ``test_timeout_s=10.0``,
                       ``max_action_chars=8192``, ``render_mode=None``
=====================  =====================================================================

Rows have HumanEval's fields (``task_id``, ``prompt``, ``test``, ``entry_point``); see
:mod:`llm_marl_envs.envs.coding` for roles, reward rules and feedback.
"""
from __future__ import annotations

from ..data import DatasetSpec
from .coding import CodingCollabEnv
from .humaneval_coding import humaneval_record

COOP_HUMANEVAL = DatasetSpec(
    name="coophumaneval",
    local_dir="coophumaneval",
    local_files={"test": "test.jsonl"},
    normalize=humaneval_record,
    hub_id="OpenMLRL/CoopHumanEval",
    hub_splits={"test": "test"},
)


class CoopHumanEvalCodingEnv(CodingCollabEnv):
    """Coding collaboration on CoopHumanEval (see the module docstring)."""

    metadata = {**CodingCollabEnv.metadata, "name": "coophumaneval_coding-v0"}
    dataset = COOP_HUMANEVAL
    data_source = "CoopHumanEval, 82 problems (OpenMLRL/CoopHumanEval or coophumaneval/test.jsonl)"

