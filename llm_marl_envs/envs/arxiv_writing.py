"""# arXiv writing

Two agents expand the same scientific abstract into a two-part introduction and share one reward
for the pair, following the protocol of `llm_marl_envs.envs.writing` (MAGRPO).

| Import | `llm_marl_envs.make("arxiv_writing-v0")` |
|---|---|
| Agents | exactly 2: `agent_0` writes background and motivation, `agent_1` methodology and implications; each is told the other covers the rest |
| Turns | 1 by default; `num_turns > 1` adds feedback and revision turns |
| Action space | `TextSpace(max_action_chars)`: the agent's part of the introduction |
| Observation space | `TextSpace`: the agent's chat history rendered as text |
| Data | hub `OpenMLRL/arXiv_abstract` (`article_id`, `abstract_text`) or local JSONL (see `split`) |
| Verifier | `verifiers.writing.score_writing` with `verifiers.writing.ARXIV_BANDS` (CoMLRL's arXiv reward; its bands are tabled in `verifiers.writing`) |
| Reward | joint, the same for both agents: structure (<= 2.0), style_consistency (<= 0.6), coherence (<= 0.4), max 3.0, each times the quality factor (0 for repeated, copied, header-laden or filler text); with `semantic_judge`, also semantic_coverage and semantic_consistency |

Records carry `task_id`, `source` (the abstract) and `title` where known.

### Arguments

```python
llm_marl_envs.make("arxiv_writing-v0", num_agents=2, num_turns=1, split="test", data_dir=None,
                   reward_config=ARXIV_BANDS, semantic_judge=False, max_action_chars=8192, render_mode=None)
```

`split`: on the hub (`OpenMLRL/arXiv_abstract`, abstracts of 100-300 tokens from the Cohan et al.
arXiv set), `"train"` is `train`, and `"validation"` and `"test"` are `val` (CoMLRL trains on
`train` and evaluates on `val`). Locally (`data_dir` or `$LLM_MARL_DATA_DIR`):

* `"test"`: `arxiv_abstracts_ai134/abstracts.jsonl`, 134 genuine arXiv abstracts (cs.AI query,
  200-324 words; fields `idx`, `title`, `abstract`), held out for evaluation.
* `"train"` / `"validation"` / `"test_scitldr"`: `scitldr_a/{train,dev,test}.jsonl`
  (1992 / 619 / 618 CS/ML paper abstracts from OpenReview, SciTLDR-A; the abstract is
  `" ".join(source)`). No offline copy of the arXiv_abstract set exists; these abstracts are the
  same genre and mostly 75-225 words, close to its 100-300-token range.

`reward_config`, `semantic_judge`: as in every writing env (`llm_marl_envs.envs.writing`); the
remaining arguments are those of every env (`llm_marl_envs.core`).

### Version History

* v0: initial release
"""  # noqa: E501 (Markdown table rows cannot wrap)
from __future__ import annotations

from verifiers.writing import ARXIV_BANDS

from ..data import DatasetSpec, Record
from .writing import WritingCollabEnv


def _joined(text: str | list[str]) -> str:
    return " ".join(s.strip() for s in text) if isinstance(text, list) else str(text).strip()


def normalize_arxiv_row(row: Record, index: int) -> Record:
    """Map a hub (``abstract_text``), arXiv-AI (``abstract``) or SciTLDR (``source``) row to the env's record."""
    if "abstract_text" in row:  # OpenMLRL/arXiv_abstract: sentence list (or text)
        return {
            "task_id": str(row.get("article_id") or f"arxiv-{index}"),
            "source": _joined(row["abstract_text"]),
            "title": "",
        }
    if "abstract" in row:  # arxiv_abstracts_ai134
        return {
            "task_id": f"arxiv-ai-{row.get('idx', index)}",
            "source": _joined(row["abstract"]),
            "title": row.get("title", ""),
        }
    if "source" in row:  # SciTLDR-A: abstract as a sentence list
        return {"task_id": row["paper_id"], "source": _joined(row["source"]), "title": row.get("title", "")}
    raise ValueError(f"arXiv row {index} has none of the fields abstract_text / abstract / source: {sorted(row)}")


ARXIV_DATASET = DatasetSpec(
    name="arxiv_abstract",
    local_dir=".",
    local_files={
        "train": "scitldr_a/train.jsonl",
        "validation": "scitldr_a/dev.jsonl",
        "test": "arxiv_abstracts_ai134/abstracts.jsonl",
        "test_scitldr": "scitldr_a/test.jsonl",
    },
    normalize=normalize_arxiv_row,
    hub_id="OpenMLRL/arXiv_abstract",
    hub_splits={"train": "train", "validation": "val", "test": "val"},
)


class ArxivWritingEnv(WritingCollabEnv):
    """Agent 0: background and motivation; agent 1: methodology and implications."""

    metadata = {**WritingCollabEnv.metadata, "name": "arxiv_writing-v0"}
    dataset = ARXIV_DATASET
    data_source = "OpenMLRL/arXiv_abstract (hub) or local arXiv cs.AI abstracts / SciTLDR-A"
    reward_config = ARXIV_BANDS
    system_prompt = "You are a careful scientific writer. You and another writer draft one introduction together."
    roles = ("the background and motivation", "the methodology and implications")

    def task_prompt(self, agent_index: int, task: Record) -> str:
        """Expand the abstract into this agent's half of the introduction."""
        mine, theirs = self.roles[agent_index], self.roles[1 - agent_index]
        return (
            "Based on the following scientific abstract, write part of the introduction section.\n\n"
            f"Abstract:\n{task['source']}\n\n"
            "Instructions:\n"
            f"- Focus on {mine}.\n"
            f"- Another writer covers {theirs}; do not repeat that content.\n"
            f"- Write {self.reward_config.min_words}-{self.reward_config.max_words} words of connected prose."
        )

