"""# TL;DR writing

Two agents summarise the same Reddit post: one a concise summary, the other a detailed one, and
share one reward for the pair, following the protocol of `llm_marl_envs.envs.writing` (MAGRPO).

| Import | `llm_marl_envs.make("tldr_writing-v0")` |
|---|---|
| Agents | exactly 2: `agent_0` writes a concise one-to-few-sentence summary, `agent_1` a detailed summary with more distinct vocabulary and explicit transitions |
| Turns | 1 by default; `num_turns > 1` adds feedback and revision turns |
| Action space | `TextSpace(max_action_chars)`: the agent's summary |
| Observation space | `TextSpace`: the agent's chat history rendered as text |
| Data | hub `trl-lib/tldr` (`prompt` / `completion`) or local JSONL (see `split`) |
| Verifier | `verifiers.writing.score_writing` with `verifiers.writing.TLDR_BANDS` (CoMLRL's TLDR reward; its bands are tabled in `verifiers.writing`) |
| Reward | joint, the same for both agents: structure (<= 2.0), style_consistency (<= 0.6), coherence (<= 0.4), max 3.0, each times the quality factor (0 for repeated, copied, header-laden or filler text); with `semantic_judge`, also semantic_coverage and semantic_consistency |

Every post is rendered in `trl-lib/tldr`'s prompt layout `SUBREDDIT: r/...\\n\\nTITLE: ...\\n\\nPOST: ...`
(without the trailing `TL;DR:`); records carry `task_id`, `source` (that text) and `reference`
(the human TL;DR, which the reward never reads).

### Arguments

```python
llm_marl_envs.make("tldr_writing-v0", num_agents=2, num_turns=1, split="test", data_dir=None,
                   reward_config=TLDR_BANDS, semantic_judge=False, max_action_chars=8192, render_mode=None)
```

`split`: on the hub, `"train"` / `"validation"` / `"test"` are `trl-lib/tldr`'s splits of the same
names. Locally (`data_dir` or `$LLM_MARL_DATA_DIR`):

* `"test"`: `tldr_openai_dove_test500/test.jsonl`, 500 posts of the OpenAI TL;DR test split
  (fields `instruction_id`, `subreddit`, `title`, `instruction` = post, `gold_response`).
* `"train"`: `reddit_tifu_superni511/train.jsonl` (1000 posts) and `"validation"`:
  `reddit_tifu_superni511/test.jsonl` (100 posts): Reddit TIFU posts with TL;DRs (fields `id`,
  `input` = `"Text: " + post`, `output` = [TL;DR]). No offline copy of the TL;DR train split
  exists; TIFU posts are the same genre (Reddit posts with author TL;DRs, median ~300 words), so
  they serve for training and model selection. They are lowercased and from r/tifu only; the
  reward never reads the reference summary, so the shift affects only the input distribution.

`reward_config`, `semantic_judge`: as in every writing env (`llm_marl_envs.envs.writing`); the
remaining arguments are those of every env (`llm_marl_envs.core`).

### Version History

* v0: initial release
"""  # noqa: E501 (Markdown table rows cannot wrap)
from __future__ import annotations

from verifiers.writing import TLDR_BANDS

from ..data import DatasetSpec, Record
from .writing import WritingCollabEnv

TLDR_SUFFIX = "TL;DR:"


def tldr_post_text(subreddit: str | None, title: str | None, post: str) -> str:
    """A post in ``trl-lib/tldr``'s prompt layout, without the trailing ``TL;DR:``."""
    header = [f"SUBREDDIT: r/{subreddit}"] if subreddit else []
    header += [f"TITLE: {title}"] if title else []
    return "\n\n".join(header + [f"POST: {post.strip()}"])


def normalize_tldr_row(row: Record, index: int) -> Record:
    """Map a hub (``prompt``), DOVE (``instruction``) or TIFU (``input``) row to the env's record."""
    if "prompt" in row:  # trl-lib/tldr: the prompt already has the layout, ending in "TL;DR:"
        source = row["prompt"].strip()
        if source.endswith(TLDR_SUFFIX):
            source = source[: -len(TLDR_SUFFIX)].rstrip()
        return {"task_id": f"tldr-{index}", "source": source, "reference": row.get("completion", "").strip()}
    if "instruction" in row:  # OpenAI TL;DR filtered test sample (DOVE field names)
        return {
            "task_id": row["instruction_id"],
            "source": tldr_post_text(row["subreddit"], row["title"], row["instruction"]),
            "reference": row["gold_response"].strip(),
        }
    if "input" in row:  # Reddit TIFU via Super-NaturalInstructions task511
        post = row["input"].strip()
        post = post[len("Text:"):].strip() if post.startswith("Text:") else post
        reference = row["output"][0] if isinstance(row.get("output"), list) and row["output"] else ""
        return {"task_id": row["id"], "source": tldr_post_text("tifu", None, post), "reference": reference.strip()}
    raise ValueError(f"TL;DR row {index} has none of the fields prompt / instruction / input: {sorted(row)}")


TLDR_DATASET = DatasetSpec(
    name="tldr",
    local_dir=".",
    local_files={
        "train": "reddit_tifu_superni511/train.jsonl",
        "validation": "reddit_tifu_superni511/test.jsonl",
        "test": "tldr_openai_dove_test500/test.jsonl",
    },
    normalize=normalize_tldr_row,
    hub_id="trl-lib/tldr",
    hub_splits={"train": "train", "validation": "validation", "test": "test"},
)


class TLDRWritingEnv(WritingCollabEnv):
    """Agent 0: concise summary; agent 1: detailed summary (see the module docstring)."""

    metadata = {**WritingCollabEnv.metadata, "name": "tldr_writing-v0"}
    dataset = TLDR_DATASET
    data_source = "trl-lib/tldr (hub) or local OpenAI TL;DR test sample / Reddit TIFU"
    reward_config = TLDR_BANDS
    system_prompt = "You are a careful writer. You and another writer each summarize the same Reddit post."
    roles = ("the concise summary", "the detailed summary")

    def task_prompt(self, agent_index: int, task: Record) -> str:
        """Concise-summary instructions for agent 0, detailed-summary instructions for agent 1."""
        words = f"{self.reward_config.min_words}-{self.reward_config.max_words} words"
        if agent_index == 0:
            return (
                f"Write a concise summary of this post.\n\n{task['source']}\n\n"
                "Instructions:\n"
                f"- One sentence or a few sentences ({words}).\n"
                "- Be factual and informative: state only what the post says.\n"
                "- Another writer adds a longer, detailed summary, so keep yours brief."
            )
        return (
            f"Write a detailed summary of this post.\n\n{task['source']}\n\n"
            "Instructions:\n"
            "- Another writer gives a one-to-few-sentence summary; yours should be about two to three "
            f"times as long ({words}).\n"
            "- Use rich, varied vocabulary: many more distinct words than a short summary.\n"
            "- Connect ideas with explicit transition words (first, however, as a result, for example, overall)."
        )

