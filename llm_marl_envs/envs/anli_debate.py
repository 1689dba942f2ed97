"""# ANLI debate

Agents debate natural language inference on ANLI round 3 (does the premise entail the
hypothesis, contradict it, or neither?), following the protocol of `llm_marl_envs.envs.debate`
(MAPoRL).

| Import | `llm_marl_envs.make("anli_debate-v1")` |
|---|---|
| Agents | `agent_0 .. agent_{N-1}`, N >= 1 (default 2) |
| Turns | 3 by default (fewer with `stop_on_consensus`) |
| Action space | `TextSpace(max_action_chars)`: reasoning ending in `\\boxed{label}` |
| Observation space | `TextSpace`: the agent's chat history rendered as text |
| Data | ANLI R3: local `anli_r3/{train,dev,test}.jsonl` or hub `facebook/anli` (`train_r3` / `dev_r3` / `test_r3`); offline, train stands in with `dev.jsonl` |
| Verifier | `verifiers.nli.verify_label`: the label the answer commits to, against `entailment` / `neutral` / `contradiction` |
| Reward | per agent per turn: 1.0 if its label is correct, else 0.0 |

The local files call the premise `context` and use the labels `e` / `n` / `c`; the hub uses
`premise` and 0 / 1 / 2. Both map to the same record.

### Arguments

```python
llm_marl_envs.make("anli_debate-v1", num_agents=2, num_turns=3, split="test", data_dir=None,
                   show_scores=False, stop_on_consensus=False, max_action_chars=8192, render_mode=None)
```

`split`: `"train"`, `"dev"` or `"test"` (dev and test: 1200 problems each; train: 100,459 on the hub).
Each is read from `anli_r3/<split>.jsonl` under `data_dir` / `$LLM_MARL_DATA_DIR`, else from the
hub. When neither has the train split (the offline copies hold only dev and test), `"train"` is
`anli_r3/dev.jsonl`, with a warning: training then uses the 1200 dev problems, which share no
problem with test, and `"dev"` is no longer held out from training.

`show_scores`, `stop_on_consensus`: as in every debate env (`llm_marl_envs.envs.debate`); the
remaining arguments are those of every env (`llm_marl_envs.core`).

### Version History

* v1: `split="train"` reads a local `anli_r3/train.jsonl` when present, else the hub, else (offline)
  `anli_r3/dev.jsonl` with a warning; training data can differ from v0's, hence the new version
* v0: initial release (deprecated, making it warns): `split="train"` from the hub only; `dev` and
  `test` as in v1
"""  # noqa: E501 (Markdown table rows cannot wrap)
from __future__ import annotations

import dataclasses

from verifiers.nli import verify_label

from ..data import DatasetSpec, Record
from .debate import DebateEnv

LABELS = {"e": "entailment", "n": "neutral", "c": "contradiction",
          0: "entailment", 1: "neutral", 2: "contradiction"}


def anli_record(row: Record, index: int) -> Record:
    """An ANLI row (local or hub shape) -> ``{task_id, premise, hypothesis, answer}``."""
    label = row["label"]
    if label not in LABELS:
        raise ValueError(f"ANLI row {index}: unknown label {label!r}; expected one of {sorted(map(str, LABELS))}")
    return {
        "task_id": f"anli_r3/{row.get('uid', index)}",
        "premise": row.get("premise", row.get("context")),
        "hypothesis": row["hypothesis"],
        "answer": LABELS[label],
    }


ANLI_R3 = DatasetSpec(
    name="anli_r3",
    local_dir="anli_r3",
    local_files={"train": "train.jsonl", "dev": "dev.jsonl", "test": "test.jsonl"},
    normalize=anli_record,
    hub_id="facebook/anli",
    hub_splits={"train": "train_r3", "dev": "dev_r3", "test": "test_r3"},
    fallback_files={"train": "dev.jsonl"},   # no offline copy of R3 train exists (see shared/data/README.md)
)

# anli_debate-v0's data: train only from the hub, dev and test from a local file or the hub
ANLI_R3_V0 = dataclasses.replace(ANLI_R3, local_files={"dev": "dev.jsonl", "test": "test.jsonl"}, fallback_files={})


class ANLIDebateEnv(DebateEnv):
    """Debate on adversarial NLI: does the premise entail, contradict, or neither?"""

    metadata = {**DebateEnv.metadata, "name": "anli_debate-v1"}
    dataset = ANLI_R3
    data_source = "ANLI R3 (anli_r3/*.jsonl, or facebook/anli)"
    verifier = verify_label
    verifier_name = "verifiers.nli.verify_label"
    answer_instruction = ("Reason step by step, then give your final label in \\boxed{} as exactly one of: "
                          "entailment, neutral, contradiction.")

    def question(self, task: Record) -> str:
        return (f"Premise: {task['premise']}\nHypothesis: {task['hypothesis']}\n\n"
                "Does the premise entail the hypothesis (entailment), contradict it (contradiction), "
                "or neither (neutral)?")


class ANLIDebateEnvV0(ANLIDebateEnv):
    """``anli_debate-v0``: the same debate on the data of the initial release (deprecated: use ``anli_debate-v1``)."""

    metadata = {**ANLIDebateEnv.metadata, "name": "anli_debate-v0"}
    dataset = ANLI_R3_V0
