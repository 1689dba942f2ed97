"""# CoopHumanEval coding

Helper writer(s) and an entry-point writer solve one CoopHumanEval problem together (HumanEval-style
problems chosen to need a helper), following the protocol of `llm_marl_envs.envs.coding` (MAGRPO).

| Import | `llm_marl_envs.make("coophumaneval_coding-v0")` |
|---|---|
| Agents | `agent_0 .. agent_{N-1}`, N >= 2 (default 2): `agent_0` writes `aux` (N > 2: `agent_k` writes `aux_k`), the last agent writes the entry point |
| Turns | 2 by default: feedback on the joint program between turns |
| Action space | `TextSpace(max_action_chars)`: the agent's function in a fenced Python code block |
| Observation space | `TextSpace`: the agent's chat history rendered as text |
| Data | CoopHumanEval (82 problems): local `coophumaneval/test.jsonl` or hub `OpenMLRL/CoopHumanEval` split `test`, split as in CoMLRL (see `split`) |
| Verifier | `verifiers.coding.score_collaboration`; the problem's `check(candidate)` asserts run in the sandbox `verifiers.sandbox.run_tests` |
| Reward | joint, the same for every agent: structure (<= 1.0), syntax (0.5), tests (<= 1.0), cooperation (<= 1.5), max 4.0 (CoMLRL's weights, `reward_config`) |

Rows have HumanEval's fields (`task_id`, `prompt`, `test`, `entry_point`) and become records as
in `humaneval_coding-v0`.

### Arguments

```python
llm_marl_envs.make("coophumaneval_coding-v0", num_agents=2, num_turns=2, split="test", data_dir=None,
                   reward_config=None, test_timeout_s=10.0, max_action_chars=8192, render_mode=None)
```

`split`: CoMLRL's CoopHumanEval split, by task number (`CoopHumanEval/<n>`; its MAGRPO config
`magrpo_che_config.yaml` in OpenMLRL/LLM_Collab_Code_Generation evaluates on the first 16 rows and
trains on the rest): `"test"` is CoopHumanEval/0-15 (16 problems), `"train"` CoopHumanEval/16-81
(66). `"all"` is the 82 problems (it overlaps both). Many problems are adapted from HumanEval, so
a team trained on one set is not held out from the other.

`reward_config`, `test_timeout_s`: as in every coding env (`llm_marl_envs.envs.coding`); the
remaining arguments are those of every env (`llm_marl_envs.core`).

### Version History

* v0: initial release
* v0 (splits revision): `"test"` is CoMLRL's 16 held-out problems (was all 82, now `"all"`); new `"train"` split
"""  # noqa: E501 (Markdown table rows cannot wrap)
from __future__ import annotations

from collections.abc import Sequence

from ..data import DatasetSpec, Record, load_records
from .coding import CodingCollabEnv
from .humaneval_coding import humaneval_record, numbered_split

COOP_HUMANEVAL = DatasetSpec(       # one split holding every problem; the env splits it by task number
    name="coophumaneval",
    local_dir="coophumaneval",
    local_files={"all": "test.jsonl"},
    normalize=humaneval_record,
    hub_id="OpenMLRL/CoopHumanEval",
    hub_splits={"all": "test"},
)
# CoMLRL's split: eval_split "train[:16]", train_split "train[16:]" (magrpo_che_config.yaml)
COOP_HUMANEVAL_SPLITS = {"train": range(16, 82), "test": range(0, 16)}


class CoopHumanEvalCodingEnv(CodingCollabEnv):
    """Coding collaboration on CoopHumanEval (see the module docstring)."""

    metadata = {**CodingCollabEnv.metadata, "name": "coophumaneval_coding-v0"}
    dataset = COOP_HUMANEVAL
    data_source = "CoopHumanEval, 82 problems (coophumaneval/test.jsonl or OpenMLRL/CoopHumanEval), CoMLRL's split"

    def load_tasks(self) -> Sequence[Record]:
        """The problems of ``self.split`` (see ``COOP_HUMANEVAL_SPLITS``)."""
        if self.split != "all" and self.split not in COOP_HUMANEVAL_SPLITS:   # refuse before loading any data
            numbered_split([], self.split, COOP_HUMANEVAL_SPLITS, "coophumaneval_coding-v0")
        records = load_records(self.dataset, "all", self.data_dir)
        return numbered_split(records, self.split, COOP_HUMANEVAL_SPLITS, "coophumaneval_coding-v0")

