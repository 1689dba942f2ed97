"""A tiny deterministic TextEnv for trainer tests: agents are asked to say a number."""
from __future__ import annotations

from llm_marl_envs.core import TextEnv
from verifiers import Verdict


class SayNumberEnv(TextEnv):
    """Each agent is asked to say the task's number.

    Score: 1 for the exact number, else half the fraction of digits and vowels in the answer
    (a graded signal, so even a random tiny model gets different rewards per sample).
    """

    metadata = {"name": "say_number", "render_modes": ["human", "ansi"], "is_parallelizable": True}
    data_source = "generated: numbers 0..num_tasks-1"
    verifier_name = "exact match, else digit fraction"

    def __init__(self, num_agents: int = 2, num_turns: int = 1, num_tasks: int = 20, **kwargs) -> None:
        super().__init__(num_agents=num_agents, num_turns=num_turns, **kwargs)
        self.num_tasks = num_tasks

    def load_tasks(self):
        return [{"task_id": f"n{i}", "number": str(i)} for i in range(self.num_tasks)]

    def first_prompt(self, agent_index, task):
        return [{"role": "user", "content": f"Agent {agent_index}: say the number {task['number']}."}]

    def verify_turn(self, answers):
        verdicts = {}
        for agent, text in answers.items():
            exact = text.strip() == self.task["number"]
            graded = 0.5 * sum(c.isdigit() or c in "aeiou" for c in text) / max(1, len(text))
            verdicts[agent] = Verdict(score=1.0 if exact else graded, correct=exact, details={})
        return verdicts

    def next_prompt(self, agent_index):
        others = [a for a in self.possible_agents if a != self.possible_agents[agent_index]]
        said = "; ".join(f"{a} said {self.answers[-1][a]!r}" for a in others)
        return f"{said}. Say the number {self.task['number']} again."
