"""# Coding collaboration: the MAGRPO coding protocol shared by every `*_coding` env

The coding collaboration of CoMLRL ([LLM Collaboration With Multi-Agent Reinforcement
Learning](https://arxiv.org/abs/2508.04652), Liu et al., 2025).

N agents write one Python program for a task: agents `0 .. N-2` each write one helper
function (`aux`, `aux_1`, ...) and the last agent writes the task's entry point, which should
call the helpers. Every agent gets the same reward: the verdict of
`verifiers.coding.score_collaboration` on the joint program (structure, syntax, sandboxed
tests and cooperation; `verifiers.coding` states the rules and weights). The components are
in `infos[a]["reward_components"]` and, with the checks behind them and the sandbox's
per-assert results, in `infos[a]["verdict"].details`.

Between turns each agent gets feedback on the joint program
(`verifiers.coding.format_coding_feedback`): syntax errors with the agent and line, whether
each helper and the entry point are defined and return, tests passed k/n with the first failing
assert and its error type, warnings when the entry point ignores the helpers, only wraps one or
discards its result, and its teammates' code.

### Arguments

Every coding env takes these, besides the arguments of `llm_marl_envs.core`
(`num_agents` >= 2, default 2: N-1 helper writers, then the entry-point writer; `num_turns`,
default 2 here; `split`, `data_dir`, `max_action_chars`, `render_mode`):

`reward_config`: a `verifiers.coding.CodingRewardConfig` with the weights of the reward
(default: CoMLRL's, max 4.0).

`test_timeout_s`: wall-clock limit of one sandboxed test run, in (0, 3600] seconds (default 10).
"""
from __future__ import annotations

from typing import Any

from verifiers import Verdict
from verifiers.coding import CodingRewardConfig, extract_code, format_coding_feedback, helper_names, score_collaboration
from verifiers.sandbox import DEFAULT_TIMEOUT_S

from ..core import TextEnv
from ..data import Record


class CodingCollabEnv(TextEnv):
    """N agents write one program: helpers first, the entry point last (see the module docstring).

    Subclasses set ``dataset`` (or override ``load_tasks``) yielding records with ``task_id``,
    ``problem`` (text shown to agents), ``context`` (code prepended to the joint program),
    ``test``, ``entry_point`` and ``signature``.
    """

    metadata = {**TextEnv.metadata, "name": "coding_collab"}
    verifier_name = "verifiers.coding.score_collaboration (joint; tests run in verifiers.sandbox)"
    min_agents = 2
    system_prompt = (
        "You are an expert Python programmer. You write one part of a program together with other programmers."
    )

    def __init__(self, *, num_turns: int = 2, reward_config: CodingRewardConfig | None = None,
                 test_timeout_s: float = DEFAULT_TIMEOUT_S, **kwargs: Any) -> None:
        if reward_config is not None and not isinstance(reward_config, CodingRewardConfig):
            raise ValueError(
                f"reward_config must be a verifiers.coding.CodingRewardConfig, got {type(reward_config).__name__}"
            )
        if not isinstance(test_timeout_s, (int, float)) or not 0 < test_timeout_s <= 3600:
            raise ValueError(f"test_timeout_s must be a number in (0, 3600], got {test_timeout_s!r}")
        super().__init__(num_turns=num_turns, **kwargs)
        self.reward_config = reward_config or CodingRewardConfig()
        self.test_timeout_s = float(test_timeout_s)
        self.helpers = helper_names(len(self.possible_agents))

    def role(self, agent_index: int) -> str:
        """The function ``agent_index`` writes: a helper name or the task's entry point."""
        return self.helpers[agent_index] if agent_index < len(self.helpers) else self.task["entry_point"]

    def first_prompt(self, agent_index: int, task: Record) -> list[dict[str, str]]:
        """System prompt plus the problem and this agent's role."""
        entry = task["entry_point"]
        helpers = ", ".join(f"`{h}`" for h in self.helpers)
        if agent_index < len(self.helpers):
            name = self.helpers[agent_index]
            role = (f"Your job: write ONE helper function named `{name}` that solves a useful sub-problem and "
                    f"returns its result. Another programmer writes `{entry}` and will call `{name}`. "
                    f"Do not write `{entry}` yourself.")
        else:
            role = (f"Your job: write the function `{entry}` (signature: `{task['signature']}`). Helper function(s) "
                    f"{helpers}, written by your teammates, are defined in the same file: call them and use their "
                    f"return values, and add your own logic. Do not define {helpers} yourself.")
        return [{"role": "system", "content": self.system_prompt},
                {"role": "user", "content": f"Problem:\n{task['problem']}\n\n{role}\n\n"
                                            "Reply with the Python code only, in one ```python code block."}]

    def verify_turn(self, answers: dict[str, str]) -> dict[str, Verdict]:
        """One joint verdict of all agents' code, given to every agent: all are rewarded its score."""
        codes = [extract_code(answers[a]) for a in self.possible_agents]
        verdict = score_collaboration(codes, self.task, self.reward_config, self.test_timeout_s)
        return {agent: verdict for agent in answers}

    def next_prompt(self, agent_index: int) -> str:
        """Feedback on the joint program, the teammates' code and a revision request."""
        verdict = self.verdicts[-1][self.possible_agents[agent_index]]
        teammates = "\n\n".join(
            f"{agent} wrote `{self.role(i)}`:\n```python\n{extract_code(self.answers[-1][agent])}\n```"
            for i, agent in enumerate(self.possible_agents) if i != agent_index)
        return (f"Feedback on the joint program after turn {self.turn}:\n{format_coding_feedback(verdict)}\n\n"
                f"{teammates}\n\nRevise your function `{self.role(agent_index)}` to raise the joint reward. "
                "Reply with the Python code only, in one ```python code block.")

    def _infos(self) -> dict[str, dict[str, Any]]:
        infos = super()._infos()
        for info in infos.values():
            verdict = info["verdict"]
            info["reward_components"] = dict(verdict.details["components"]) if verdict is not None else None
        return infos
