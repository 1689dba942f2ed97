"""# GSM8K debate

Agents debate grade-school math word problems from GSM8K, following the protocol of
`llm_marl_envs.envs.debate` (MAPoRL).

| Import | `llm_marl_envs.make("gsm8k_debate-v0")` |
|---|---|
| Agents | `agent_0 .. agent_{N-1}`, N >= 1 (default 2) |
| Turns | 3 by default (fewer with `stop_on_consensus`) |
| Action space | `TextSpace(max_action_chars)`: a worked answer ending in `\\boxed{number}` |
| Observation space | `TextSpace`: the agent's chat history rendered as text |
| Data | GSM8K: hub `openai/gsm8k` (config `main`) or local `gsm8k/{train,test}.jsonl` |
| Verifier | `verifiers.math.verify_answer` against the number after `####` in the reference solution |
| Reward | per agent per turn: 1.0 if its answer is correct, else 0.0 |

### Arguments

```python
llm_marl_envs.make("gsm8k_debate-v0", num_agents=2, num_turns=3, split="test", data_dir=None,
                   show_scores=False, stop_on_consensus=False, max_action_chars=8192, render_mode=None)
```

`split`: `"train"` (7473 problems) or `"test"` (1319).

`show_scores`, `stop_on_consensus`: as in every debate env (`llm_marl_envs.envs.debate`); the
remaining arguments are those of every env (`llm_marl_envs.core`).

### Version History

* v0: initial release
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
