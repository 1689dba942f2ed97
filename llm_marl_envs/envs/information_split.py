"""# Information split: the protocol shared by the tasks that need a team

Each task is split between roles (e.g. a speaker and a listener): every role holds a private
*view*, and no view alone determines the answer, while all views together do: each env has a
brute-force solver (`llm_marl_envs.envs.information_split.InformationSplitEnv.consistent_answers`)
that `llm_marl_envs.testing.information_split_test` runs on its tasks.

At turn 0 each agent's prompt holds the task statement every role knows and its own view only.
At turn t >= 1 it holds its own history plus its partners' messages from turn t-1, labelled
`Agent k`. The turns before the last ask the agent to tell its partners what they need; at the
last turn every agent gives its final answer. Every turn's text is judged by the task's verifier
(the verdicts are in `infos`), and only the last turn is paid: an agent's reward is 0 at earlier
turns and its final answer's verdict score at the last one (plus `format_reward` for a wrong answer
the verifier could read, when that is set).

Per-turn correctness of every agent is in `infos[a]["correct"]`, the extracted answers in
`infos[a]["answers"]` and the roles whose views the agent holds in `infos[a]["roles"]`.

### Arguments

Every information-split env takes these, besides the arguments of `llm_marl_envs.core`
(`num_agents`, default 2; `num_turns`, default 2 here; `split`, `data_dir`, `max_action_chars`,
`render_mode`):

`view`: who sees what (default `"split"`).

* `"split"`: one agent per role (`num_agents` must equal the number of roles); agent k holds role
  k's view: the team.
* `"full"`: every agent holds every view, under the same protocol; with `num_agents=1` one agent
  solves the whole task alone (the upper bound of a team, the `full_view_solo` control).
* `"own"`: each agent holds one role's view and works alone: no partner, no messages. With
  `num_agents=1`, `seat=k` says which role (the `own_view_solo` control); with one agent per
  role, agent k takes role k (every role alone, side by side, on the same task).

`seat`: the role of the one agent of `view="own", num_agents=1` (required there, refused
elsewhere).

`mask_messages`: the communication ablation: every partner's message is replaced by an empty
message in every prompt, so no text of a partner ever reaches an agent (default `False`; only
for envs whose agents have partners).

`format_reward`: the reward of a last-turn answer that the verifier could read but judged wrong (a
number in [0, 1), default 0): a small bonus lets a weak model learn the answer format before it is
ever right, so that group-relative advantages are not all 0. It changes the reward only: whether an
answer is right (`infos[a]["correct"]`, every accuracy) is the verifier's verdict alone.

`chance_accuracy` (an attribute, not an argument): the accuracy of a uniform guess among the task's
choices (`1 / choices` for a multiple-choice task, `None` for an exact answer such as an integer),
the line that a trained team's accuracy is read against.

`num_tasks`: distinct tasks per split. Tasks are generated offline from a fixed stream and
assigned to `"train"` or `"test"` by a hash of their content
(`llm_marl_envs.data.hash_split`), so the splits share no task; an option set whose task space
is too small for `num_tasks` tasks per split is a `ValueError`.
"""
from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import numpy as np

from verifiers import Verdict

from ..core import TextEnv
from ..data import Record, hash_split

VIEWS = ("split", "full", "own")
SPLITS = ("train", "test")
GENERATOR_SEED = 0          # one task stream for both splits; hash_split decides each task's split
DRAWS_PER_TASK = 50         # give up (task space too small) after this many draws per requested task


class InformationSplitEnv(TextEnv):
    """Base class of the information-split envs; a task module writes the task, its views, verifier and solver.

    A subclass sets ``role_names`` (one per role) and implements :meth:`draw_task`,
    :meth:`task_content`, :meth:`task_statement`, :meth:`view_text`, :meth:`private_facts`,
    :meth:`verify` and :meth:`consistent_answers` (or overrides :meth:`load_tasks`).
    """

    metadata = {**TextEnv.metadata, "name": "information_split"}
    role_names: tuple[str, ...] = ()
    answer_instruction = "Give your final answer in \\boxed{}."

    def __init__(self, *, num_turns: int = 2, view: str = "split", seat: int | None = None,
                 mask_messages: bool = False, format_reward: float = 0.0, num_tasks: int = 500,
                 **kwargs: Any) -> None:
        super().__init__(num_turns=num_turns, **kwargs)
        n, roles = len(self.possible_agents), len(self.role_names)
        if view not in VIEWS:
            raise ValueError(f"view must be one of {list(VIEWS)}, got {view!r}")
        if not isinstance(mask_messages, bool):
            raise ValueError(f"mask_messages must be True or False, got {mask_messages!r}")
        if isinstance(format_reward, bool) or not isinstance(format_reward, (int, float)) \
                or not 0 <= format_reward < 1:
            raise ValueError(f"format_reward must be a number in [0, 1) (a wrong but readable answer earns less than "
                             f"a right one), got {format_reward!r}")
        if not isinstance(num_tasks, int) or isinstance(num_tasks, bool) or num_tasks < 1:
            raise ValueError(f"num_tasks must be an int >= 1, got {num_tasks!r}")
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}, got {self.split!r}")
        role_list = ", ".join(self.role_names)
        if view == "split" and n != roles:
            raise ValueError(f"view='split' seats one agent per role ({role_list}): pass num_agents={roles}, got "
                             f"{n}; for one agent use view='own' with seat=k, or view='full'")
        if view == "own" and n not in (1, roles):
            raise ValueError(f"view='own' takes num_agents=1 (one role, seat=k) or num_agents={roles} (every role "
                             f"alone), got {n}")
        if view == "own" and n == 1:
            if seat is None:
                raise ValueError(f"view='own' with one agent needs seat=k, the role it holds: 0..{roles - 1} "
                                 f"({role_list})")
            if not isinstance(seat, int) or isinstance(seat, bool) or not 0 <= seat < roles:
                raise ValueError(f"seat must be an int in [0, {roles}) ({role_list}), got {seat!r}")
        elif seat is not None:
            raise ValueError(f"seat picks the role of the one agent of view='own', num_agents=1; got seat={seat!r} "
                             f"with view={view!r}, num_agents={n}")
        if mask_messages and not self._has_partners(view, n):
            raise ValueError(f"mask_messages hides partners' messages, but view={view!r} with num_agents={n} gives "
                             "no agent a partner")
        self.view = view
        self.seat = seat
        self.mask_messages = mask_messages
        self.format_reward = float(format_reward)
        self.num_tasks = num_tasks

    @property
    def chance_accuracy(self) -> float | None:
        """The accuracy of a uniform guess among the choices; ``None`` when the answer is not a choice."""
        return None

    @staticmethod
    def _has_partners(view: str, num_agents: int) -> bool:
        return view != "own" and num_agents > 1

    # -- what a task module writes
    def draw_task(self, rng: np.random.Generator) -> Record:
        """One random task record (without ``task_id``), drawn from ``rng``."""
        raise NotImplementedError

    def task_content(self, task: Record) -> str:
        """The text that makes two tasks the same; its hash decides the task's split."""
        raise NotImplementedError

    def task_statement(self, task: Record) -> str:
        """What every role knows: the task and what its answer must be (no private information)."""
        raise NotImplementedError

    def view_text(self, task: Record, role: int) -> str:
        """What ``role`` alone knows about ``task``, as shown in its prompt."""
        raise NotImplementedError

    def private_facts(self, task: Record, role: int) -> list[str]:
        """Strings that only ``role``'s view holds (what a leak check searches the other roles' prompts for)."""
        raise NotImplementedError

    def verify(self, response: str, task: Record) -> Verdict:
        """Judge one answer against the task's gold answer."""
        raise NotImplementedError

    def consistent_answers(self, task: Record, roles: Collection[int]) -> set[str]:
        """Every answer some task agreeing with the views of ``roles`` has (brute force over what they do not see)."""
        raise NotImplementedError

    # -- tasks
    def load_tasks(self) -> list[Record]:
        return self.generated_tasks(self.draw_task)

    def generated_tasks(self, draw: Callable[[np.random.Generator], Record]) -> list[Record]:
        """``num_tasks`` distinct tasks of ``self.split`` drawn from one seeded stream, ids ``<name>/<draw index>``."""
        rng = np.random.default_rng(GENERATOR_SEED)
        name = self.metadata["name"].rsplit("-v", 1)[0]
        tasks: list[Record] = []
        seen: set[str] = set()
        draws = DRAWS_PER_TASK * self.num_tasks + 1000
        for index in range(draws):
            task = draw(rng)
            content = self.task_content(task)
            if content in seen or hash_split(content) != self.split:
                continue
            seen.add(content)
            tasks.append({"task_id": f"{name}/{index}", **task})
            if len(tasks) == self.num_tasks:
                return tasks
        raise ValueError(f"{name}: only {len(tasks)} distinct {self.split!r} tasks in {draws} draws, fewer than "
                         f"num_tasks={self.num_tasks}; lower num_tasks or widen the task options")

    # -- roles and views
    def agent_roles(self, agent_index: int) -> tuple[int, ...]:
        """The roles whose views ``agent_index`` holds."""
        if self.view == "full":
            return tuple(range(len(self.role_names)))
        if self.view == "own" and len(self.possible_agents) == 1:
            return (self.seat,)
        return (agent_index,)

    @property
    def has_partners(self) -> bool:
        """Whether agents see each other's messages (a team), rather than each working alone."""
        return self._has_partners(self.view, len(self.possible_agents))

    # -- TextEnv hooks
    def first_prompt(self, agent_index: int, task: Record) -> list[dict[str, str]]:
        n = len(self.possible_agents)
        if self.has_partners:
            team = (f"You are Agent {agent_index}, one of a team of {n} agents solving one task together. "
                    + ("Each of you holds information the others lack. " if self.view == "split" else ""))
        else:
            team = "You are solving a task on your own. "
        roles = self.agent_roles(agent_index)
        if len(roles) == 1:
            known = f"What you know (as the {self.role_names[roles[0]]}):\n{self.view_text(task, roles[0])}"
        else:
            known = "What you know:\n" + "\n\n".join(f"As the {self.role_names[r]}:\n{self.view_text(task, r)}"
                                                    for r in roles)
        return [
            {"role": "system", "content": team + "Be concise and precise."},
            {"role": "user", "content": f"{self.task_statement(task)}\n\n{known}\n\n{self.turn_instruction(0)}"},
        ]

    def turn_instruction(self, turn: int) -> str:
        """What the agent is asked to do at ``turn``."""
        last = self.num_turns - 1
        if turn == last:
            return f"Give your final answer now. {self.answer_instruction}"
        if not self.has_partners:
            return f"Think the task through. You will give your final answer in your message at turn {last + 1}."
        partner, every = ("partner", "both") if len(self.possible_agents) == 2 else ("partners", "all")
        later = f"You will {every} give your final answers in your messages at turn {last + 1}."
        if turn == 0:
            return f"Tell your {partner} everything you know that they need to solve the task. {later}"
        return f"Reply to your {partner}. {later}"

    def verify_turn(self, answers: dict[str, str]) -> dict[str, Verdict]:
        return {agent: self.verify(text, self.task) for agent, text in answers.items()}

    def rewards_from_verdicts(self, verdicts: dict[str, Verdict]) -> dict[str, float]:
        """Only the last turn is paid: its verdict scores, ``format_reward`` for a wrong answer the verifier read;
        0 at earlier turns (``self.turn``: the turn judged)."""
        if self.turn != self.num_turns - 1:
            return dict.fromkeys(verdicts, 0.0)
        return {agent: float(v.score) if v.correct or v.details.get("answer") is None
                else max(float(v.score), self.format_reward) for agent, v in verdicts.items()}

    def next_prompt(self, agent_index: int) -> str:
        instruction = self.turn_instruction(self.turn)
        if not self.has_partners:
            return instruction
        me = self.possible_agents[agent_index]
        parts = [f"Message from Agent {self.agent_index(agent)}:\n{'' if self.mask_messages else text}".rstrip()
                 for agent, text in self.answers[-1].items() if agent != me]
        return "\n\n".join([*parts, instruction])

    def _infos(self) -> dict[str, dict[str, Any]]:
        infos = super()._infos()
        answers = [[v[a].details.get("answer") for a in self.possible_agents] for v in self.verdicts]
        for agent, info in infos.items():
            info["answers"] = answers
            info["roles"] = [self.role_names[r] for r in self.agent_roles(self.agent_index(agent))]
        return infos

