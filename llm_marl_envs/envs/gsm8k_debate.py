"""GSM8K debate.

| | |
|---|---|
| id | ``gsm8k_debate-v0`` |
| create | ``llm_marl_envs.make("gsm8k_debate-v0", num_agents=2, num_turns=3)`` |
| agents | ``agent_0 .. agent_{N-1}`` (default N = 2) |
| turns | default 3 (MAPoRL protocol, see :mod:`llm_marl_envs.envs.debate`) |
| action space | :class:`~llm_marl_envs.core.TextSpace`, up to ``max_action_chars`` (8192) characters |
| observation space | :class:`~llm_marl_envs.core.TextSpace`: the agent's rendered chat history |
| data | GSM8K, hub ``openai/gsm8k`` (config ``main``) or local ``gsm8k/{train,test}.jsonl`` |
| gold | the number after ``####`` in the reference solution |
| verifier | :func:`verifiers.math.verify_answer` (numeric / symbolic equivalence) |
| reward | per agent per turn: 1.0 if its answer is correct, else 0.0 |

Arguments: see the table in :mod:`llm_marl_envs.envs.debate`; ``split`` is ``"train"`` (7473
problems) or ``"test"`` (1319).
"""
from __future__ import annotations

from verifiers.math import verify_answer

from ..data import DatasetSpec, Record
from .debate import DebateEnv


def gsm8k_record(row: Record, index: int) -> Record:
    """A GSM8K row -> ``{task_id, question, answer (gold number), solution}``."""
    solution = row["answer"]
    return {
        "task_id": f"gsm8k/{index}",
        "question": row["question"],
        "answer": solution.split("####")[-1].strip().replace(",", ""),
        "solution": solution,
    }


GSM8K = DatasetSpec(
    name="gsm8k",
    local_dir="gsm8k",
    local_files={"train": "train.jsonl", "test": "test.jsonl"},
    normalize=gsm8k_record,
    hub_id="openai/gsm8k",
    hub_config="main",
    hub_splits={"train": "train", "test": "test"},
)


class GSM8KDebateEnv(DebateEnv):
    """Debate on GSM8K grade-school math word problems."""

    metadata = {**DebateEnv.metadata, "name": "gsm8k_debate-v0"}
    dataset = GSM8K
    data_source = "GSM8K (openai/gsm8k main, or gsm8k/*.jsonl)"
    verifier = verify_answer
    verifier_name = "verifiers.math.verify_answer"
    answer_instruction = "Solve it step by step, then give the final answer as a number in \\boxed{}."
