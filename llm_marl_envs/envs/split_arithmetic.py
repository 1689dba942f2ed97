"""# Split arithmetic

Two agents must compute `a ∘ b`, but agent 0 holds only the first number `a` and agent 1 only
the second number `b` and the operation `∘`. Following the protocol of
`llm_marl_envs.envs.information_split`, each tells the other what it knows at turn 0 and both give
the exact integer at the last turn. The smallest task that needs a team: neither view determines
the answer (for every task, every value of the unseen number gives another result).

| Import | `llm_marl_envs.make("split_arithmetic-v0")` |
|---|---|
| Agents | `agent_0` (first number), `agent_1` (second number and operation); 1 or 2 with `view="own"`/`"full"` |
| Turns | 2 by default: turn 0 tell your partner, turn 1 answer |
| Action space | `TextSpace(max_action_chars)`: a message; at the last turn an answer ending in `\\boxed{integer}` |
| Observation space | `TextSpace`: the agent's chat history rendered as text |
| Data | procedural, offline: `a ∘ b` with numbers of `min_digits`..`max_digits` digits, e.g. "58 + 26" |
| Verifier | `verifiers.math.verify_answer` against the exact integer result |
| Reward | per agent: 1.0 if its last-turn answer is correct, else `format_reward` (default 0.0) if the verifier read an answer, else 0.0; 0 at earlier turns |

### Arguments

```python
llm_marl_envs.make("split_arithmetic-v0", num_agents=2, num_turns=2, view="split", seat=None,
                   mask_messages=False, format_reward=0.0, split="test", num_tasks=500, min_digits=2, max_digits=2, operators="+",
                   max_action_chars=8192, render_mode=None, data_dir=None)
```

`min_digits`, `max_digits`: digits per number (1-digit numbers are 1-9, d-digit ones
10^(d-1) .. 10^d - 1; each number draws its digit count uniformly, then its value), at most 6.
There is no 0: "times 0" would give the answer from agent 1's view alone.

`operators`: the operations a task may use, a string of `+`, `-` and `*` (default `"+"`);
subtraction may give a negative result. Which operations are possible is not in the task
statement: the operation belongs to agent 1's view.

The default, two 2-digit numbers added, has 8,100 distinct tasks, about 4,000 per split, 8 times
the default `num_tasks`; 1-digit numbers (81 additions) are too few for disjoint splits of that size.

`view`, `seat`, `mask_messages`, `format_reward`, `num_tasks`, `split`: as in every information-split env
(`llm_marl_envs.envs.information_split`): tasks are assigned to a split by a hash of `a ∘ b`; the
remaining arguments are those of every env (`llm_marl_envs.core`); `data_dir` is unused.

### Version History

* v0: initial release
"""  # noqa: E501 (Markdown table rows cannot wrap)
from __future__ import annotations

import operator
from collections.abc import Callable, Collection
from typing import Any

import numpy as np

from verifiers import Verdict
from verifiers.math import verify_answer

from ..data import Record
from .information_split import InformationSplitEnv

# operator -> (name, the symbol shown, function)
OPERATIONS: dict[str, tuple[str, str, Callable[[int, int], int]]] = {
    "+": ("addition", "+", operator.add),
    "-": ("subtraction", "−", operator.sub),
    "*": ("multiplication", "×", operator.mul),
}
MAX_DIGITS = 6


def numbers_with_digits(digits: int) -> range:
    """The positive whole numbers written with ``digits`` digits (1-9 for one digit)."""
    return range(10 ** (digits - 1), 10 ** digits)


class SplitArithmeticEnv(InformationSplitEnv):
    """Agent 0 holds ``a``, agent 1 holds ``b`` and the operation; both must answer ``a ∘ b``."""

    metadata = {**InformationSplitEnv.metadata, "name": "split_arithmetic-v0"}
    data_source = "procedural a ∘ b, split operands (offline)"
    verifier_name = "verifiers.math.verify_answer"
    role_names = ("holder of the first number", "holder of the second number and the operation")
    answer_instruction = "Give the result as a whole number in \\boxed{}."

    def __init__(self, *, min_digits: int = 2, max_digits: int = 2, operators: str = "+", **kwargs: Any) -> None:
        if not all(isinstance(d, int) and not isinstance(d, bool) for d in (min_digits, max_digits)) \
                or not 1 <= min_digits <= max_digits <= MAX_DIGITS:
            raise ValueError(f"need 1 <= min_digits <= max_digits <= {MAX_DIGITS}, got min_digits={min_digits!r}, "
                             f"max_digits={max_digits!r}")
        if not isinstance(operators, str) or not operators or set(operators) - set(OPERATIONS):
            raise ValueError(f"operators must be a non-empty string of {''.join(OPERATIONS)!r} characters, got "
                             f"{operators!r}; e.g. operators='+-' for additions and subtractions")
        super().__init__(**kwargs)
        self.min_digits, self.max_digits = min_digits, max_digits
        self.operators = "".join(op for op in OPERATIONS if op in operators)

    def numbers(self) -> list[int]:
        """Every number a task may hold."""
        return [x for d in range(self.min_digits, self.max_digits + 1) for x in numbers_with_digits(d)]

    # -- the task
    def draw_task(self, rng: np.random.Generator) -> Record:
        a, b = (int(rng.choice(numbers_with_digits(int(rng.integers(self.min_digits, self.max_digits + 1)))))
                for _ in range(2))
        op = self.operators[int(rng.integers(len(self.operators)))]
        return {"a": a, "b": b, "operator": op, "answer": str(OPERATIONS[op][2](a, b))}

    def task_content(self, task: Record) -> str:
        return f"{task['a']} {task['operator']} {task['b']}"

    def task_statement(self, task: Record) -> str:
        return ("Your team must compute the result of an arithmetic operation applied to two whole numbers: "
                "the first number, then the operation, then the second number. The result is a whole number.")

    def view_text(self, task: Record, role: int) -> str:
        if role == 0:
            return f"The first number is {task['a']}."
        name, symbol, _ = OPERATIONS[task["operator"]]
        return f"The second number is {task['b']}. The operation is {name} ({symbol})."

    def private_facts(self, task: Record, role: int) -> list[str]:
        if role == 0:
            return [str(task["a"])]
        name, symbol, _ = OPERATIONS[task["operator"]]
        return [str(task["b"]), name, symbol]

    def verify(self, response: str, task: Record) -> Verdict:
        return verify_answer(response, task["answer"])

    def consistent_answers(self, task: Record, roles: Collection[int]) -> set[str]:
        firsts = [task["a"]] if 0 in roles else self.numbers()
        seconds, ops = ([task["b"]], task["operator"]) if 1 in roles else (self.numbers(), self.operators)
        return {str(OPERATIONS[op][2](a, b)) for a in firsts for b in seconds for op in ops}
