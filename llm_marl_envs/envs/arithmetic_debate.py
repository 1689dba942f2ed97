"""# Arithmetic debate

Agents debate short addition (and, optionally, subtraction) chains generated offline by
`reasoning-gym` (`chain_sum`), following the protocol of `llm_marl_envs.envs.debate` (MAPoRL).
Answers are a few tokens long and the default problems are within reach of a small model
(see `min_digits`): the quick, cheap debate for trainer examples and smoke tests on a CPU.

| Import | `llm_marl_envs.make("arithmetic_debate-v0")` |
|---|---|
| Agents | `agent_0 .. agent_{N-1}`, N >= 1 (default 2) |
| Turns | 3 by default (fewer with `stop_on_consensus`) |
| Action space | `TextSpace(max_action_chars)`: an answer ending in `\\boxed{number}` |
| Observation space | `TextSpace`: the agent's chat history rendered as text |
| Data | `reasoning_gym.create_dataset("chain_sum", ...)`, e.g. "State the final answer to the following arithmetic problem: 44 + 27 =" |
| Verifier | `verifiers.math.verify_answer` against the generator's answer |
| Reward | per agent per turn: 1.0 if its answer is correct, else 0.0 |

### Arguments

```python
llm_marl_envs.make("arithmetic_debate-v0", num_agents=2, num_turns=3, split="test", num_tasks=500,
                   min_terms=2, max_terms=2, min_digits=2, max_digits=2, operators="+", show_scores=False,
                   stop_on_consensus=False, max_action_chars=8192, render_mode=None, data_dir=None)
```

`min_terms`, `max_terms`: numbers per problem.

`min_digits`, `max_digits`: digits per number (all numbers of a problem have the same count;
1-digit numbers are 0-9, d-digit ones 10^(d-1) .. 10^d - 1).

`operators`: the operators a problem may use, a string of `+` and `-`; generated problems with
others are skipped (default `"+"`).

The default, two 2-digit numbers added ("58 + 26 ="), has 8,100 distinct problems, about 4,000
per split, 8 times the default `num_tasks`. The embedded SmolLM2-135M-Instruct gets part of them
right before any training, so training has room both ways; 2-digit subtraction and chains of 3
numbers are much harder for it (its accuracies are on the benchmark page), and 1-digit problems
(100 additions of two numbers) are too few for disjoint splits of a useful size.

`num_tasks`, `split`, `data_dir`: as in `gsm_symbolic_debate-v0`: train and test are split by a
hash of the question, disjoint by construction; a problem space too small for `num_tasks`
distinct problems per split is a `ValueError`.

`show_scores`, `stop_on_consensus`: as in every debate env (`llm_marl_envs.envs.debate`); the
remaining arguments are those of every env (`llm_marl_envs.core`).

### Version History

* v0: initial release
* v0 (splits revision): train and test split by a hash of the question (seeds 1 and 2 shared 466 of
  their 467 distinct problems); default difficulty two 2-digit numbers added (was 2-3 numbers of 1-2
  digits with + and -); new `operators` argument
"""  # noqa: E501 (Markdown table rows cannot wrap)
from __future__ import annotations

from typing import Any

from ..data import Record
from .gsm_symbolic_debate import GSMSymbolicDebateEnv, reasoning_gym_records

OPERATORS = "+-"


class ArithmeticDebateEnv(GSMSymbolicDebateEnv):
    """Debate on procedurally generated addition/subtraction chains (offline).

    Shares everything but the task generator with the GSM-Symbolic debate.
    """

    metadata = {**GSMSymbolicDebateEnv.metadata, "name": "arithmetic_debate-v0"}
    data_source = "reasoning-gym chain_sum (procedural, offline)"
    answer_instruction = "Give the final answer as a number in \\boxed{}."

    def __init__(self, *, min_terms: int = 2, max_terms: int = 2, min_digits: int = 2, max_digits: int = 2,
                 operators: str = "+", **kwargs: Any) -> None:
        if not 1 <= min_terms <= max_terms or not 1 <= min_digits <= max_digits:
            raise ValueError(f"need 1 <= min_terms <= max_terms and 1 <= min_digits <= max_digits, got terms "
                             f"{min_terms}..{max_terms}, digits {min_digits}..{max_digits}")
        if not isinstance(operators, str) or not operators or set(operators) - set(OPERATORS):
            raise ValueError(f"operators must be a non-empty string of {OPERATORS!r} characters, got {operators!r}; "
                             f"e.g. operators='+-' for additions and subtractions")
        super().__init__(**kwargs)
        self.operators = "".join(sorted(set(operators)))
        self.task_config = {"min_terms": min_terms, "max_terms": max_terms, "min_digits": min_digits,
                            "max_digits": max_digits, "allow_negation": False}

    def load_tasks(self) -> list[Record]:
        return reasoning_gym_records("chain_sum", self.split, self.num_tasks, accept=self.uses_allowed_operators,
                                     **self.task_config)

    def uses_allowed_operators(self, row: Record) -> bool:
        """Whether a generated chain_sum row uses only ``self.operators``."""
        return set(row["metadata"]["expression"].split()) & set(OPERATORS) <= set(self.operators)
