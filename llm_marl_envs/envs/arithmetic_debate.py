"""Arithmetic debate: short chains of additions and subtractions, generated offline by ``reasoning-gym``.

A task small models can partly solve (SmolLM2-135M-Instruct answers about 30% of the default
problems right), with answers of a few tokens: the quick, cheap debate for trainer examples
and smoke tests of the MAPoRL protocol on a CPU.

| | |
|---|---|
| id | ``arithmetic_debate-v0`` |
| create | ``llm_marl_envs.make("arithmetic_debate-v0", num_agents=2, num_turns=3)`` |
| agents | ``agent_0 .. agent_{N-1}`` (default N = 2) |
| turns | default 3 (MAPoRL protocol, see :mod:`llm_marl_envs.envs.debate`) |
| action space | :class:`~llm_marl_envs.core.TextSpace`, up to ``max_action_chars`` (8192) characters |
| observation space | :class:`~llm_marl_envs.core.TextSpace`: the agent's rendered chat history |
| data | ``reasoning_gym.create_dataset("chain_sum", ...)``, e.g. "State the final answer to the following arithmetic problem: 44 + 27 - 33 =" |
| verifier | :func:`verifiers.math.verify_answer` |
| reward | per agent per turn: 1.0 if its answer is correct, else 0.0 |

Extra arguments (beside those of :mod:`llm_marl_envs.envs.debate`):

| argument | default | meaning |
|---|---|---|
| ``num_tasks`` | 500 | problems generated per split |
| ``min_terms``, ``max_terms`` | 2, 3 | numbers per problem |
| ``min_digits``, ``max_digits`` | 1, 2 | digits per number |
| ``split`` | ``"test"`` | ``"train"`` and ``"test"`` use different generator seeds (train 1, test 2) |
"""
from __future__ import annotations

from typing import Any

from ..data import Record
from .gsm_symbolic_debate import GSMSymbolicDebateEnv, reasoning_gym_records


class ArithmeticDebateEnv(GSMSymbolicDebateEnv):
    """Debate on procedurally generated addition/subtraction chains (offline).

    Shares everything but the task generator with the GSM-Symbolic debate.
    """

    metadata = {**GSMSymbolicDebateEnv.metadata, "name": "arithmetic_debate-v0"}
    data_source = "reasoning-gym chain_sum (procedural, offline)"
    answer_instruction = "Give the final answer as a number in \\boxed{}."

    def __init__(self, *, min_terms: int = 2, max_terms: int = 3, min_digits: int = 1, max_digits: int = 2,
                 **kwargs: Any) -> None:
        if not 1 <= min_terms <= max_terms or not 1 <= min_digits <= max_digits:
            raise ValueError(f"need 1 <= min_terms <= max_terms and 1 <= min_digits <= max_digits, got terms "
                             f"{min_terms}..{max_terms}, digits {min_digits}..{max_digits}")
        super().__init__(**kwargs)
        self.task_config = {"min_terms": min_terms, "max_terms": max_terms, "min_digits": min_digits,
                            "max_digits": max_digits, "allow_negation": False}

    def load_tasks(self) -> list[Record]:
        return reasoning_gym_records("chain_sum", self.split, self.num_tasks, **self.task_config)
