"""# MBPP coding

Helper writer(s) and an entry-point writer solve one basic Python task from MBPP together,
following the protocol of `llm_marl_envs.envs.coding` (MAGRPO).

| Import | `llm_marl_envs.make("mbpp_coding-v0")` |
|---|---|
| Agents | `agent_0 .. agent_{N-1}`, N >= 2 (default 2): `agent_0` writes `aux` (N > 2: `agent_k` writes `aux_k`), the last agent writes the entry point |
| Turns | 2 by default: feedback on the joint program between turns |
| Action space | `TextSpace(max_action_chars)`: the agent's function in a fenced Python code block |
| Observation space | `TextSpace`: the agent's chat history rendered as text |
| Data | hub `google-research-datasets/mbpp` config `sanitized` (427 rows), or local `mbpp/mbpp.jsonl` (the full 974-row set, standard split by id) |
| Verifier | `verifiers.coding.score_collaboration`; the three asserts of `test_list` run in the sandbox `verifiers.sandbox.run_tests` |
| Reward | joint, the same for every agent: structure (<= 1.0), syntax (0.5), tests (<= 1.0), cooperation (<= 1.5), max 4.0 (CoMLRL's weights, `reward_config`) |

The entry point is the function of the reference solution that the first assert calls; agents
see the problem text, that function's signature and the first assert as a format example. Test
imports / setup code run before the asserts.

### Arguments

```python
llm_marl_envs.make("mbpp_coding-v0", num_agents=2, num_turns=2, split="test", data_dir=None,
                   reward_config=None, test_timeout_s=10.0, max_action_chars=8192, render_mode=None)
```

`split`: on the hub (sanitized), `"train"` 120, `"validation"` 43, `"test"` 257 rows. Locally (the
full set, split by `task_id` as in the MBPP paper): `"test"` 11-510 (500), `"validation"` 511-600
(90), `"train"` 601-974 (374); ids 1-10 are few-shot prompts and belong to no split.

`reward_config`, `test_timeout_s`: as in every coding env (`llm_marl_envs.envs.coding`); the
remaining arguments are those of every env (`llm_marl_envs.core`).

### Version History

* v0: initial release
"""  # noqa: E501 (Markdown table rows cannot wrap)
from __future__ import annotations

import ast
import re

from verifiers.coding import function_signature, parse_python

from ..data import DatasetSpec, Record
from .coding import CodingCollabEnv

MBPP_ID_RANGES = {"test": range(11, 511), "validation": range(511, 601), "train": range(601, 975)}


def mbpp_entry_point(code: str, tests: list[str]) -> str:
    """The reference solution's function that the first assert calls (else its last function)."""
    try:
        names = [n.name for n in parse_python(code).body if isinstance(n, ast.FunctionDef)]
    except SyntaxError:
        names = re.findall(r"^def\s+(\w+)\s*\(", code, re.MULTILINE)
    for name in names:
        if re.search(rf"\b{re.escape(name)}\s*\(", tests[0]):
            return name
    if not names:
        raise ValueError(f"MBPP reference solution defines no function: {code[:80]!r}")
    return names[-1]


def mbpp_record(row: Record, index: int) -> Record:
    """A full-set (``text``) or sanitized (``prompt``) MBPP row -> the env's record."""
    code = row["code"].replace("\r\n", "\n")
    tests = list(row["test_list"])
    setup = "\n".join(row.get("test_imports") or []) or (row.get("test_setup_code") or "")
    entry = mbpp_entry_point(code, tests)
    signature = function_signature(code, entry)
    text = (row.get("prompt") or row["text"]).strip()
    return {
        "task_id": f"mbpp/{row['task_id']}",
        "mbpp_id": int(row["task_id"]),
        "problem": f"{text}\n\nFunction: `{signature}`\nExample test: {tests[0]}",
        "context": "",
        "test": "\n".join([setup, *tests]) if setup.strip() else "\n".join(tests),
        "entry_point": entry,
        "signature": signature,
        "canonical_solution": code,
    }


def in_standard_split(record: Record, split: str) -> bool:
    """Whether a full-set row belongs to ``split`` under the standard split by task id."""
    return record["mbpp_id"] in MBPP_ID_RANGES[split]


MBPP = DatasetSpec(
    name="mbpp",
    local_dir="mbpp",
    local_files={split: "mbpp.jsonl" for split in MBPP_ID_RANGES},
    normalize=mbpp_record,
    hub_id="google-research-datasets/mbpp",
    hub_config="sanitized",
    hub_splits={split: split for split in MBPP_ID_RANGES},
    local_filter=in_standard_split,
)


class MBPPCodingEnv(CodingCollabEnv):
    """Coding collaboration on MBPP (see the module docstring)."""

    metadata = {**CodingCollabEnv.metadata, "name": "mbpp_coding-v0"}
    dataset = MBPP
    data_source = "MBPP (google-research-datasets/mbpp sanitized, or mbpp/mbpp.jsonl full set)"

