"""# Debate: the MAPoRL protocol shared by every `*_debate` env

The multi-turn debate of [MAPoRL](https://arxiv.org/abs/2502.18439) (Park et al., ACL 2025).

N agents answer the same question over T turns. At turn 0 each agent sees the question and an
answer-format instruction. At turn t >= 1 each agent sees its own history (its earlier answers
are already there as assistant messages) plus the other agents' answers from turn t-1, labelled
`Agent k`, and is asked to weigh them, fix errors and answer again. Every answer is scored
by the task's verifier; an agent's reward at a turn is its own verdict score. With N = 1 the
protocol is self-refinement: the agent is asked to review its own previous answer.

Per-turn correctness of every agent is in `infos[a]["correct"]` (a list per completed turn of
one bool per agent) and the extracted answers in `infos[a]["answers"]`, so transitions
(correct -> incorrect, ...) can be computed from any step.

### Arguments

Every debate env takes these, besides the arguments of `llm_marl_envs.core`
(`num_agents` >= 1, default 2; `num_turns`, default 3 here; `split`, `data_dir`,
`max_action_chars`, `render_mode`):

`show_scores`: show each other agent's verifier score next to its answer in the next prompt
(default `False`).

`stop_on_consensus`: end the episode before `num_turns` once every agent's extracted answer
is the same (default `False`).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from verifiers import Verdict

from ..core import TextEnv
from ..data import Record


class DebateEnv(TextEnv):
    """Base class of the debate envs; a task module sets its data, question text and verifier."""

    metadata = {**TextEnv.metadata, "name": "debate"}
    answer_instruction = "Think step by step, then give your final answer in \\boxed{}."
    verifier: Callable[[str, str], Verdict] | None = None  # (response, gold answer) -> Verdict

    def __init__(self, *, num_turns: int = 3, show_scores: bool = False, stop_on_consensus: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(num_turns=num_turns, **kwargs)
        self.show_scores = show_scores
        self.stop_on_consensus = stop_on_consensus

    # -- what a task module may override
    def question(self, task: Record) -> str:
        """The problem statement shown at turn 0; default: the record's ``question``."""
        return task["question"]

    def verify(self, response: str, task: Record) -> Verdict:
        """Judge one answer with the class's ``verifier`` against the record's gold ``answer``."""
        verifier = type(self).verifier  # read from the class: a plain function, not a bound method
        if verifier is None:
            raise NotImplementedError(f"{type(self).__name__} must set `verifier` or override verify()")
        return verifier(response, task["answer"])

    # -- TextEnv hooks
    def first_prompt(self, agent_index: int, task: Record) -> list[dict[str, str]]:
        n = len(self.possible_agents)
        team = (f"You are Agent {agent_index}, one of {n} agents solving the same problem together."
                if n > 1 else "You are solving a problem carefully.")
        return [
            {"role": "system", "content": f"{team} Be concise and precise."},
            {"role": "user", "content": f"{self.question(task)}\n\n{self.answer_instruction}"},
        ]

    def verify_turn(self, answers: dict[str, str]) -> dict[str, Verdict]:
        return {agent: self.verify(text, self.task) for agent, text in answers.items()}

    def next_prompt(self, agent_index: int) -> str:
        me = self.possible_agents[agent_index]
        last_answers, last_verdicts = self.answers[-1], self.verdicts[-1]
        others = [a for a in self.possible_agents if a != me]
        if not others:
            return ("Review your previous answer step by step, fix any errors, and answer again. "
                    + self.answer_instruction)
        parts = ["These are the answers of the other agents from the previous turn:"]
        for agent in others:
            label = f"Agent {self.agent_index(agent)}"
            if self.show_scores:
                label += f" (verifier score {last_verdicts[agent].score:g})"
            parts.append(f"{label}:\n{last_answers[agent]}")
        parts.append("Using their answers as additional information, examine your previous answer and theirs "
                     "step by step, fix any errors, and give your updated answer. " + self.answer_instruction)
        return "\n\n".join(parts)

    def should_stop_early(self) -> bool:
        if not self.stop_on_consensus:
            return False
        extracted = {v.details.get("answer") for v in self.verdicts[-1].values()}
        return len(extracted) == 1 and None not in extracted

    def _infos(self) -> dict[str, dict[str, Any]]:
        infos = super()._infos()
        for info in infos.values():
            info["answers"] = [[v[a].details.get("answer") for a in self.possible_agents] for v in self.verdicts]
        return infos
