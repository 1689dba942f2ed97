"""# CoopHumanEval coding

Helper writer(s) and an entry-point writer solve one CoopHumanEval problem together (HumanEval-style
problems chosen to need a helper), following the protocol of `llm_marl_envs.envs.coding` (MAGRPO).

| Import | `llm_marl_envs.make("coophumaneval_coding-v0")` |
|---|---|
| Agents | `agent_0 .. agent_{N-1}`, N >= 2 (default 2): `agent_0` writes `aux` (N > 2: `agent_k` writes `aux_k`), the last agent writes the entry point |
| Turns | 2 by default: feedback on the joint program between turns |
| Action space | `TextSpace(max_action_chars)`: the agent's function in a fenced Python code block |
| Observation space | `TextSpace`: the agent's chat history rendered as text |
| Data | CoopHumanEval (82 problems): hub `OpenMLRL/CoopHumanEval` split `test`, or local `coophumaneval/test.jsonl` |
| Verifier | `verifiers.coding.score_collaboration`; the problem's `check(candidate)` asserts run in the sandbox `verifiers.code.run_tests` |
| Reward | joint, the same for every agent: structure (<= 1.0), syntax (0.5), tests (<= 1.0), cooperation (<= 1.5), max 4.0 (CoMLRL's weights, `reward_config`) |

Rows have HumanEval's fields (`task_id`, `prompt`, `test`, `entry_point`) and become records as
in `humaneval_coding-v0`.

### Arguments

```python
llm_marl_envs.make("coophumaneval_coding-v0", num_agents=2, num_turns=2, split="test", data_dir=None,
                   reward_config=None, test_timeout_s=10.0, max_action_chars=8192, render_mode=None)
```

`split`: `"test"` only (the 82 problems).

`reward_config`, `test_timeout_s`: as in every coding env (`llm_marl_envs.envs.coding`); the
remaining arguments are those of every env (`llm_marl_envs.core`).

### Version History

* v0: initial release
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

