"""`TextEnv`: the PettingZoo parallel base class of every environment in this library.

A text environment holds one task (a dataset record), ``num_agents`` agents named
``agent_0 .. agent_{N-1}`` and ``num_turns`` turns. At every turn each agent sends one string;
the env records it in the agent's chat history, asks the task's verifier for a
:class:`~verifiers.Verdict` per agent, turns verdicts into rewards and writes the next prompt.

Observations are the agent's whole text history rendered as a string
(:func:`render_messages`); ``infos[agent]["messages"]`` holds the same history as chat
messages for chat templates. ``infos[agent]`` also carries ``turn`` (turns completed),
``task_id``, ``verdict`` (of the agent's last answer), ``scores`` and ``correct`` (one list per
completed turn, one entry per agent) and ``action_truncated``.

Subclasses implement four hooks: :meth:`TextEnv.load_tasks`, :meth:`TextEnv.first_prompt`,
:meth:`TextEnv.verify_turn` and :meth:`TextEnv.next_prompt` (and may override
:meth:`TextEnv.rewards_from_verdicts` and :meth:`TextEnv.should_stop_early`).

Arguments. A subclass's ``__init__`` declares only its own arguments (or one whose default it
changes, such as ``num_turns``) as keyword-only and passes ``**kwargs`` on; ``make`` follows that
chain, so every env takes the arguments of all its base classes. The arguments of every env:

``num_agents``: agents ``agent_0 .. agent_{N-1}``; an env class bounds N with ``min_agents`` and
``max_agents``.

``num_turns``: answering rounds; the episode ends after the last one (or earlier where the env
says so, see :meth:`TextEnv.should_stop_early`).

``split``: the dataset split tasks come from (each env lists its splits).

``data_dir``: local data folder, else ``$LLM_MARL_DATA_DIR``, else the dataset hub
(:func:`~llm_marl_envs.data.load_records`).

``max_action_chars``: longer actions are truncated (``infos[a]["action_truncated"]``).

``render_mode``: ``"human"`` prints the transcript on ``render()``, ``"ansi"`` returns it.

Bad input is refused with ``ValueError``: a non-dict or a dict whose keys are not exactly the
live agents, a non-string action, a step after the episode ended or before ``reset``. Actions
longer than ``max_action_chars`` are truncated (documented; ``infos[a]["action_truncated"]``).
"""
from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium.utils import seeding
from pettingzoo import ParallelEnv

from verifiers import Verdict

from .data import DatasetSpec, Record, load_records

DEFAULT_MAX_ACTION_CHARS = 8192
DEFAULT_MAX_OBSERVATION_CHARS = 1_000_000


class TextSpace(gymnasium.spaces.Text):
    """A :class:`gymnasium.spaces.Text` that contains any Unicode string up to ``max_length``.

    ``sample()`` draws from gymnasium's alphanumeric charset (what PettingZoo's API test sends
    as random actions); ``contains()`` accepts every character, since model output and
    dataset text are arbitrary Unicode.
    """

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"TextSpace(max_length={self.max_length})"


def render_messages(messages: Sequence[dict[str, str]]) -> str:
    """Render chat messages as the plain-text history used for observations."""
    return "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in messages)


class TextEnv(ParallelEnv):
    """Base class for multi-agent text environments (see the module docstring)."""

    metadata: dict[str, Any] = {"name": "text_env", "render_modes": ["human", "ansi"], "is_parallelizable": True}
    dataset: DatasetSpec | None = None     # subclasses with dataset-backed tasks set this
    data_source: str = ""                  # one line for tables: where tasks come from
    verifier_name: str = ""                # one line for tables: what scores answers
    env_id: str | None = None              # the registry id make() built it as (None: built directly)
    min_agents: int = 1
    max_agents: int | None = None          # None: no upper bound

    def __init__(
        self,
        num_agents: int = 2,
        num_turns: int = 1,
        split: str = "test",
        data_dir: str | os.PathLike | None = None,
        max_action_chars: int = DEFAULT_MAX_ACTION_CHARS,
        render_mode: str | None = None,
    ) -> None:
        for name, value in (("num_agents", num_agents), ("num_turns", num_turns)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__}); pass {name}=2, "
                                "not a string or a float")
        if num_agents < self.min_agents or (self.max_agents is not None and num_agents > self.max_agents):
            if self.max_agents == self.min_agents:
                wanted = f"exactly {self.min_agents} agents"
            elif self.max_agents is None:
                wanted = f"num_agents >= {self.min_agents}"
            else:
                wanted = f"{self.min_agents} <= num_agents <= {self.max_agents}"
            raise ValueError(f"{type(self).__name__} needs {wanted}, got num_agents={num_agents!r}; "
                             f"pass num_agents={self.min_agents}")
        if num_turns < 1:
            raise ValueError(f"num_turns must be an int >= 1, got {num_turns!r}")
        if max_action_chars < 1:
            raise ValueError(f"max_action_chars must be >= 1, got {max_action_chars}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}")
        self.num_turns = num_turns
        self.split = split
        self.data_dir = data_dir
        self.max_action_chars = max_action_chars
        self.render_mode = render_mode
        self.possible_agents = [f"agent_{i}" for i in range(num_agents)]
        self.agents: list[str] = []
        self._action_space = TextSpace(max_length=max_action_chars)
        self._observation_space = TextSpace(max_length=DEFAULT_MAX_OBSERVATION_CHARS)
        self._tasks: Sequence[Record] | None = None
        self._task_source: TextEnv | None = None      # the env this one was cloned from, while neither loaded tasks
        self.np_random, self.np_random_seed = seeding.np_random()
        self.task: Record | None = None
        self.turn = 0
        self.messages: dict[str, list[dict[str, str]]] = {}
        self.answers: list[dict[str, str]] = []       # per completed turn: agent -> answer
        self.verdicts: list[dict[str, Verdict]] = []  # per completed turn: agent -> verdict
        self._truncated_actions: set[str] = set()
        self._ended = False

    # ---------------------------------------------------------------- hooks
    def load_tasks(self) -> Sequence[Record]:
        """All tasks of ``self.split``; default: the class's :class:`DatasetSpec`."""
        if self.dataset is None:
            raise NotImplementedError(f"{type(self).__name__} must set `dataset` or override load_tasks()")
        return load_records(self.dataset, self.split, self.data_dir)

    def first_prompt(self, agent_index: int, task: Record) -> list[dict[str, str]]:
        """The opening messages (system and user) of ``agent_index`` for ``task``."""
        raise NotImplementedError

    def verify_turn(self, answers: dict[str, str]) -> dict[str, Verdict]:
        """One verdict per agent for this turn's answers (``self.turn`` is the turn being judged)."""
        raise NotImplementedError

    def next_prompt(self, agent_index: int) -> str:
        """The user message that opens the next turn for ``agent_index``."""
        raise NotImplementedError

    def rewards_from_verdicts(self, verdicts: dict[str, Verdict]) -> dict[str, float]:
        """Rewards of this turn; default: each agent's own verdict score."""
        return {agent: float(v.score) for agent, v in verdicts.items()}

    def should_stop_early(self) -> bool:
        """Whether to end the episode before ``num_turns`` (e.g. consensus); default never."""
        return False

    # ---------------------------------------------------------------- PettingZoo API
    @property
    def tasks(self) -> Sequence[Record]:
        """The task records of this env's split (loaded on first use)."""
        if self._tasks is None:
            source = self._task_source
            self._tasks = source.tasks if source is not None else self.load_tasks()
            self._task_source = None
        return self._tasks

    def observation_space(self, agent: str) -> gymnasium.spaces.Space:
        self._check_known_agent(agent)
        return self._observation_space

    def action_space(self, agent: str) -> gymnasium.spaces.Space:
        self._check_known_agent(agent)
        return self._action_space

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start an episode; ``options`` may pin the task with ``task_index`` or ``task``.

        The seed fixes the task choice and everything random; other option keys are ignored
        with a warning.
        """
        if seed is not None or self.task is None:
            self.np_random, self.np_random_seed = seeding.np_random(seed)
        options = dict(options or {})
        unknown = set(options) - {"task_index", "task"}
        if unknown:  # PettingZoo's API test passes arbitrary options: warn, do not fail
            warnings.warn(f"ignoring unknown reset option(s) {sorted(unknown)}; valid: ['task', 'task_index']",
                          UserWarning, stacklevel=2)
        if "task" in options:
            task = options["task"]
            if not isinstance(task, dict):
                raise ValueError(f"options['task'] must be a task record (dict), got {type(task).__name__}")
            self.task = dict(task)
            self.task.setdefault("task_id", "custom")
        else:
            n = len(self.tasks)
            index = options.get("task_index")
            if index is None:
                index = int(self.np_random.integers(n))
            elif not isinstance(index, (int, np.integer)) or not -n <= index < n:
                raise ValueError(f"task_index must be an int in [0, {n}), got {index!r}")
            self.task = self.tasks[int(index)]
        self.agents = list(self.possible_agents)
        self.turn = 0
        self.answers, self.verdicts = [], []
        self._truncated_actions = set()
        self._ended = False
        self.messages = {a: self.first_prompt(i, self.task) for i, a in enumerate(self.agents)}
        return self._observations(), self._infos()

    def step(self, actions: dict[str, str]):
        """Record every live agent's answer, verify it, reward it and open the next turn."""
        answers = self._validate_actions(actions)
        for agent, text in answers.items():
            self.messages[agent].append({"role": "assistant", "content": text})
        verdicts = self.verify_turn(answers)
        rewards = self.rewards_from_verdicts(verdicts)
        self.answers.append(answers)
        self.verdicts.append(verdicts)
        self.turn += 1
        done = self.turn >= self.num_turns or self.should_stop_early()
        if not done:
            for i, agent in enumerate(self.agents):
                self.messages[agent].append({"role": "user", "content": self.next_prompt(i)})
        observations, infos = self._observations(), self._infos()
        terminations = {a: done for a in self.agents}
        truncations = {a: False for a in self.agents}
        if done:
            self.agents = []
            self._ended = True
        return observations, rewards, terminations, truncations, infos

    def render(self) -> str | None:
        """Print (``"human"``) or return (``"ansi"``) the transcript of the episode so far."""
        if self.render_mode is None:
            warnings.warn("render() called without render_mode; pass render_mode='human' or 'ansi' to make().",
                          UserWarning, stacklevel=2)
            return None
        text = self.transcript()
        if self.render_mode == "human":
            print(text)
            return None
        return text

    def close(self) -> None:
        """Nothing to release; present for API compliance."""

    # ---------------------------------------------------------------- helpers
    def transcript(self) -> str:
        """A readable transcript: the task, then every agent's answer and verdict per turn."""
        lines = [f"=== {self.metadata['name']} | task {self.task.get('task_id') if self.task else None} ==="]
        for t, (answers, verdicts) in enumerate(zip(self.answers, self.verdicts)):
            lines.append(f"--- turn {t} ---")
            for agent, text in answers.items():
                v = verdicts[agent]
                lines.append(f"{agent} (score {v.score:.3g}, correct={v.correct}):\n{text}")
        return "\n".join(lines)

    def clone(self) -> TextEnv:
        """An independent copy of the env mid-episode (shares the read-only task list).

        A clone of an env that has not loaded its tasks yet loads them through that env when it needs
        them, so the list is loaded (or generated) once however many episodes the rollout engine clones
        from one template.
        """
        tasks, source = self._tasks, self._task_source
        self._tasks = self._task_source = None
        try:
            twin = copy.deepcopy(self)
        finally:
            self._tasks, self._task_source = tasks, source
        twin._tasks = tasks
        twin._task_source = None if tasks is not None else self
        return twin

    def agent_index(self, agent: str) -> int:
        """``"agent_3"`` -> 3."""
        return self.possible_agents.index(agent)

    def _check_known_agent(self, agent: str) -> None:
        if agent not in self.possible_agents:
            raise ValueError(f"unknown agent {agent!r}; agents are {self.possible_agents}")

    def _validate_actions(self, actions: Any) -> dict[str, str]:
        if self._ended:
            raise ValueError("the episode has ended; call reset() before step()")
        if self.task is None:
            raise ValueError("step() called before reset(); call reset() first")
        if not isinstance(actions, dict):
            raise ValueError(f"actions must be a dict agent -> str, got {type(actions).__name__}")
        unknown = sorted(set(actions) - set(self.agents))
        missing = sorted(set(self.agents) - set(actions))
        if unknown:
            raise ValueError(f"unknown agent(s) {unknown} in actions; live agents are {self.agents}")
        if missing:
            raise ValueError(f"missing action(s) for {missing}; every live agent must act each turn")
        answers: dict[str, str] = {}
        for agent in self.agents:
            text = actions[agent]
            if not isinstance(text, str):
                raise ValueError(f"action of {agent} must be a str, got {type(text).__name__}: {text!r:.80}")
            if len(text) > self.max_action_chars:
                text = text[: self.max_action_chars]
                self._truncated_actions.add(agent)
            else:
                self._truncated_actions.discard(agent)
            answers[agent] = text
        return answers

    def _observations(self) -> dict[str, str]:
        return {a: render_messages(self.messages[a]) for a in self.agents}

    def _infos(self) -> dict[str, dict[str, Any]]:
        last = self.verdicts[-1] if self.verdicts else {}
        scores = [[v[a].score for a in self.possible_agents] for v in self.verdicts]
        correct = [[v[a].correct for a in self.possible_agents] for v in self.verdicts]
        return {
            a: {
                "turn": self.turn,
                "task_id": self.task.get("task_id"),
                "verdict": last.get(a),
                "messages": [dict(m) for m in self.messages[a]],
                "scores": scores,
                "correct": correct,
                "action_truncated": a in self._truncated_actions,
            }
            for a in self.agents
        }
