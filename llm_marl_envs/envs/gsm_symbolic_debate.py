"""GSM-Symbolic debate: procedural grade-school math generated offline by ``reasoning-gym``.

The embedded default task: it needs no dataset download at all.

| | |
|---|---|
| id | ``gsm_symbolic_debate-v0`` |
| create | ``llm_marl_envs.make("gsm_symbolic_debate-v0", num_agents=2, num_turns=3)`` |
| agents | ``agent_0 .. agent_{N-1}`` (default N = 2) |
| turns | default 3 (MAPoRL protocol, see :mod:`llm_marl_envs.envs.debate`) |
| action space | :class:`~llm_marl_envs.core.TextSpace`, up to ``max_action_chars`` (8192) characters |
| observation space | :class:`~llm_marl_envs.core.TextSpace`: the agent's rendered chat history |
| data | ``reasoning_gym.create_dataset("gsm_symbolic", size=num_tasks, seed=<split seed>)`` |
| verifier | :func:`verifiers.math.verify_answer` |
| reward | per agent per turn: 1.0 if its answer is correct, else 0.0 |

Extra arguments (beside those of :mod:`llm_marl_envs.envs.debate`):

| argument | default | meaning |
|---|---|---|
| ``num_tasks`` | 500 | problems generated per split |
| ``split`` | ``"test"`` | ``"train"`` and ``"test"`` are generated from different seeds (train 1, test 2); problems come from shared templates, so the splits differ in numbers and names, not in problem types |
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
