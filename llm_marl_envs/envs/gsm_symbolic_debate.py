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
| Data | `reasoning_gym.create_dataset("gsm_symbolic", ...)`, split by a hash of each question (see `split`) |
| Verifier | `verifiers.math.verify_answer` against the generator's answer |
| Reward | per agent per turn: 1.0 if its answer is correct, else 0.0 |

### Arguments

```python
llm_marl_envs.make("gsm_symbolic_debate-v0", num_agents=2, num_turns=3, split="test", num_tasks=500,
                   show_scores=False, stop_on_consensus=False, max_action_chars=8192, render_mode=None,
                   data_dir=None)
```

`num_tasks`: distinct problems per split.

`split`: `"train"` or `"test"`, disjoint by construction. Both come from one generator stream
(seed 0); a problem belongs to the split that `llm_marl_envs.data.hash_split` (a SHA-256 of its
lower-cased, whitespace-collapsed question) names, about half the problem space each, and repeats
are skipped. So no question is in both splits. (Different seeds would not do: reasoning-gym
seeds item i with seed + i, so seed 1's item i + 1 is seed 2's item i.) The splits share the
templates and differ in numbers and names, not in problem types.

`data_dir`: unused (the problems are generated).

`show_scores`, `stop_on_consensus`: as in every debate env (`llm_marl_envs.envs.debate`); the
remaining arguments are those of every env (`llm_marl_envs.core`).

### Version History

* v0: initial release
* v0 (splits revision): train and test split by a hash of the question (were seeds 1 and 2, which shared 7 of
  500 problems); task ids are `gsm_symbolic/<index in the stream>`
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from verifiers.math import verify_answer

from ..data import Record, canonical_text, hash_split
from .debate import DebateEnv

GENERATOR_SEED = 0          # one problem stream for both splits; hash_split decides each problem's split
SPLITS = ("train", "test")
DRAWS_PER_TASK = 20          # give up (problem space too small) after this many draws per requested task


def reasoning_gym_records(task_name: str, split: str, size: int, accept: Callable[[Record], bool] | None = None,
                          **task_config: Any) -> list[Record]:
    """``size`` distinct problems of a reasoning-gym task that belong to ``split`` (``task_config``: its options).

    Problems are drawn from one stream (seed ``GENERATOR_SEED``) and kept when
    :func:`~llm_marl_envs.data.hash_split` of their question is ``split`` (and ``accept`` of the
    generated row is true, when given), skipping repeats, so train and test share no question by
    construction. A task id names the problem's index in the stream. Raises ``ValueError`` when
    the options allow too few distinct problems for ``size``.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    if size < 1:
        raise ValueError(f"num_tasks must be >= 1, got {size}")
    import reasoning_gym  # heavy import, only when tasks are generated

    draws = DRAWS_PER_TASK * size + 1000
    dataset = reasoning_gym.create_dataset(task_name, size=draws, seed=GENERATOR_SEED, **task_config)
    records: list[Record] = []
    seen: set[str] = set()
    for index in range(draws):
        row = dataset[index]
        key = canonical_text(row["question"])
        if key in seen or hash_split(key) != split or (accept is not None and not accept(row)):
            continue
        seen.add(key)
        records.append({"task_id": f"{task_name}/{index}", "question": row["question"], "answer": str(row["answer"])})
        if len(records) == size:
            return records
    raise ValueError(f"{task_name} with {task_config or 'its defaults'} gave only {len(records)} distinct {split} "
                     f"problems in {draws} draws, fewer than num_tasks={size}: the problem space is too small; "
                     f"lower num_tasks or make the problems harder")


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
