"""# GSM-Symbolic debate

Agents debate grade-school math problems generated offline by `reasoning-gym`
(`gsm_symbolic`), following the protocol of `llm_marl_envs.envs.debate` (MAPoRL). The
embedded default task: it needs no dataset download at all.

| Import | `llm_marl_envs.make("gsm_symbolic_debate-v0")` |
|---|---|
| Agents | `agent_0 .. agent_{N-1}`, N >= 1 (default 2) |
| Turns | 3 by default (fewer with `stop_on_consensus`) |
| Action space | `TextSpace(max_action_chars)`: a worked answer ending in `\\boxed{number}` |
| Observation space | `TextSpace`: the agent's chat history rendered as text |
| Data | `reasoning_gym.create_dataset("gsm_symbolic", size=num_tasks, seed=<split seed>)` |
| Verifier | `verifiers.math.verify_answer` against the generator's answer |
| Reward | per agent per turn: 1.0 if its answer is correct, else 0.0 |

### Arguments

```python
llm_marl_envs.make("gsm_symbolic_debate-v0", num_agents=2, num_turns=3, split="test", num_tasks=500,
                   show_scores=False, stop_on_consensus=False, max_action_chars=8192, render_mode=None,
                   data_dir=None)
```

`num_tasks`: problems generated per split.

`split`: `"train"` or `"test"`, generated from different seeds (train 1, test 2). reasoning-gym
seeds item i with seed + i, so the two splits are mostly, not entirely, different problems; they
come from shared templates and differ in numbers and names, not in problem types.

`data_dir`: unused (the problems are generated).

`show_scores`, `stop_on_consensus`: as in every debate env (`llm_marl_envs.envs.debate`); the
remaining arguments are those of every env (`llm_marl_envs.core`).

### Version History

* v0: initial release
"""
from __future__ import annotations

from typing import Any

from verifiers.math import verify_answer

from ..data import Record
from .debate import DebateEnv

SPLIT_SEEDS = {"train": 1, "test": 2}


def reasoning_gym_records(task_name: str, split: str, size: int, **task_config) -> list[Record]:
    """Generate ``size`` problems of a reasoning-gym task for ``split`` as env records (``task_config``: the task's options)."""
    if split not in SPLIT_SEEDS:
        raise ValueError(f"split must be one of {sorted(SPLIT_SEEDS)}, got {split!r}")
    if size < 1:
        raise ValueError(f"num_tasks must be >= 1, got {size}")
    import reasoning_gym  # heavy import, only when tasks are generated

    rows = reasoning_gym.create_dataset(task_name, size=size, seed=SPLIT_SEEDS[split], **task_config)
    return [{"task_id": f"{task_name}/{split}/{i}", "question": row["question"], "answer": str(row["answer"])}
            for i, row in enumerate(rows)]


class GSMSymbolicDebateEnv(DebateEnv):
    """Debate on procedurally generated GSM-style problems (offline)."""

    metadata = {**DebateEnv.metadata, "name": "gsm_symbolic_debate-v0"}
    data_source = "reasoning-gym gsm_symbolic (procedural, offline)"
    verifier = verify_answer
    verifier_name = "verifiers.math.verify_answer"
    answer_instruction = "Solve it step by step, then give the final answer as a number in \\boxed{}."

    def __init__(self, *, num_tasks: int = 500, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_tasks = num_tasks

    def load_tasks(self) -> list[Record]:
        return reasoning_gym_records("gsm_symbolic", self.split, self.num_tasks)
