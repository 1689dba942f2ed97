"""# Arithmetic debate

Agents debate short chains of additions and subtractions generated offline by `reasoning-gym`
(`chain_sum`), following the protocol of `llm_marl_envs.envs.debate` (MAPoRL). Small models
can partly solve it (SmolLM2-135M-Instruct answers about 30% of the default problems right) and
answers are a few tokens long: the quick, cheap debate for trainer examples and smoke tests on
a CPU.

| Import | `llm_marl_envs.make("arithmetic_debate-v0")` |
|---|---|
| Agents | `agent_0 .. agent_{N-1}`, N >= 1 (default 2) |
| Turns | 3 by default (fewer with `stop_on_consensus`) |
| Action space | `TextSpace(max_action_chars)`: an answer ending in `\\boxed{number}` |
| Observation space | `TextSpace`: the agent's chat history rendered as text |
| Data | `reasoning_gym.create_dataset("chain_sum", ...)`, e.g. "State the final answer to the following arithmetic problem: 44 + 27 - 33 =" |
| Verifier | `verifiers.math.verify_answer` against the generator's answer |
| Reward | per agent per turn: 1.0 if its answer is correct, else 0.0 |

### Arguments

```python
llm_marl_envs.make("arithmetic_debate-v0", num_agents=2, num_turns=3, split="test", num_tasks=500,
                   min_terms=2, max_terms=3, min_digits=1, max_digits=2, show_scores=False,
                   stop_on_consensus=False, max_action_chars=8192, render_mode=None, data_dir=None)
```

`min_terms`, `max_terms`: numbers per problem.

`min_digits`, `max_digits`: digits per number.

`num_tasks`, `split`, `data_dir`: as in `gsm_symbolic_debate-v0` (train seed 1, test seed 2).
reasoning-gym seeds item i of a dataset with seed + i, so for `chain_sum` train item i + 1 is test
item i: the two splits share almost all their problems and are not a held-out pair.

`show_scores`, `stop_on_consensus`: as in every debate env (`llm_marl_envs.envs.debate`); the
remaining arguments are those of every env (`llm_marl_envs.core`).

### Version History

* v0: initial release
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
