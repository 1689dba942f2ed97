"""# Writing collaboration: the MAGRPO writing protocol shared by every `*_writing` env

The writing collaboration of CoMLRL ([LLM Collaboration With Multi-Agent Reinforcement
Learning](https://arxiv.org/abs/2508.04652), Liu et al., 2025).

Two agents each write one part of a joint text about the same source (a Reddit post, an
abstract). Both receive **one joint reward**, `verifiers.writing.score_writing` of
(agent 0's part, agent 1's part) and the source; its components (structure, style consistency,
coherence, and the semantic judge's terms when enabled) are in `infos[agent]["verdict"].details`,
each already multiplied by the quality factor (`details["quality"]`: repetition, copying the
source, header labels, filler or word salad, relevance), so degenerate text cannot max it.
`reward_config=verifiers.writing.without_quality_factor(...)` gives CoMLRL's reward as published.

With `num_turns > 1` each agent then receives the component scores and measurements of the
joint text together with its partner's part and is asked for a revision; every turn is scored
the same way.

### Arguments

Every writing env takes these, besides the arguments of `llm_marl_envs.core`
(`num_agents`: exactly 2, other values raise `ValueError`; `num_turns`, default 1;
`split`, `data_dir`, `max_action_chars`, `render_mode`):

`reward_config`: a `verifiers.writing.WritingRewardConfig` with the bands and weights
of the reward (default: the env's preset, `TLDR_BANDS` or `ARXIV_BANDS`).

`semantic_judge`: `True` adds the embedding terms of `verifiers.semantic.SemanticJudge`
(coverage of the source, consistency of the two parts) to the reward; a `SemanticJudge`
instance picks its model and device (default `False`).
"""
from __future__ import annotations

from typing import Any

from verifiers import Verdict
from verifiers.semantic import SemanticJudge
from verifiers.writing import TLDR_BANDS, WritingRewardConfig, format_writing_feedback, score_writing

from ..core import TextEnv
from ..data import Record


class WritingCollabEnv(TextEnv):
    """Two agents write complementary parts of one text and share one level-gated reward.

    Subclasses set ``dataset`` (records with ``task_id`` and ``source``), ``reward_config``,
    ``system_prompt``, ``roles`` (a short description of each agent's part) and implement
    :meth:`task_prompt`.
    """

    metadata = {**TextEnv.metadata, "name": "writing_collab"}
    verifier_name = "verifiers.writing.score_writing (joint, level-gated; optional SemanticJudge)"
    min_agents = 2
    max_agents = 2
    reward_config: WritingRewardConfig = TLDR_BANDS
    system_prompt: str = "You are a careful writer collaborating with another writer on one text."
    roles: tuple[str, str] = ("the first part", "the second part")

    def __init__(self, *, reward_config: WritingRewardConfig | None = None,
                 semantic_judge: bool | SemanticJudge = False, **kwargs: Any) -> None:
        if reward_config is not None and not isinstance(reward_config, WritingRewardConfig):
            raise ValueError(
                f"reward_config must be a verifiers.writing.WritingRewardConfig, got {type(reward_config).__name__}"
            )
        if not isinstance(semantic_judge, (bool, SemanticJudge)):
            raise ValueError(
                f"semantic_judge must be True/False or a SemanticJudge, got {type(semantic_judge).__name__}"
            )
        super().__init__(**kwargs)
        self.reward_config = reward_config if reward_config is not None else type(self).reward_config
        self.judge: SemanticJudge | None = SemanticJudge() if semantic_judge is True else (semantic_judge or None)

    # ---------------------------------------------------------------- hooks
    def task_prompt(self, agent_index: int, task: Record) -> str:
        """The first user message of ``agent_index``: the source and the agent's instructions."""
        raise NotImplementedError

    def first_prompt(self, agent_index: int, task: Record) -> list[dict[str, str]]:
        """System prompt plus the agent's task prompt."""
        return [{"role": "system", "content": self.system_prompt},
                {"role": "user", "content": self.task_prompt(agent_index, task)}]

    def verify_turn(self, answers: dict[str, str]) -> dict[str, Verdict]:
        """One joint verdict of (agent 0's part, agent 1's part), given to both: both are rewarded its score."""
        part0, part1 = (answers[a] for a in self.possible_agents)
        verdict = score_writing(part0, part1, self.reward_config, source=self.task["source"], judge=self.judge)
        return {agent: verdict for agent in answers}

    def next_prompt(self, agent_index: int) -> str:
        """Feedback on the joint text (component scores), the partner's part, and a revision request."""
        partner = self.possible_agents[1 - agent_index]
        verdict = self.verdicts[-1][self.possible_agents[agent_index]]
        return (
            f"Feedback on the joint text after turn {self.turn} (your part is part {agent_index + 1}):\n"
            f"{format_writing_feedback(verdict, self.reward_config)}\n\n"
            f"Your partner wrote {self.roles[1 - agent_index]} (part {2 - agent_index}):\n"
            f"<<<\n{self.answers[-1][partner]}\n>>>\n\n"
            f"Revise {self.roles[agent_index]} to raise the joint score. Reply with your revised part only."
        )

