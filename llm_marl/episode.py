"""Episode records produced by the rollout engine (JSON-serialisable for the benchmark's JSONL)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from verifiers import Verdict


def jsonable_info(info: dict[str, Any]) -> dict[str, Any]:
    """An env ``infos[agent]`` dict without the (large) message history, verdicts as dicts."""
    out = {}
    for key, value in info.items():
        if key == "messages":
            continue
        out[key] = value.to_dict() if isinstance(value, Verdict) else value
    return out


@dataclass
class AgentTurn:
    """One agent's action at one turn: what it saw, what it said, how it was scored."""

    agent: str
    turn: int
    messages: list[dict[str, str]]          # the conversation the policy answered
    text: str
    reward: float
    verdict: dict[str, Any] | None = None   # Verdict.to_dict() of this answer
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None     # per completion token, under the sampling policy
    finish_reason: str = "stop"
    policy: str = ""
    adapter: str | None = None
    info: dict[str, Any] = field(default_factory=dict)   # the env's infos[agent] after the step (no messages)
    reported_tokens: int = 0                # completion length a backend reports without ids (HTTP servers)

    @property
    def num_tokens(self) -> int:
        """Completion length in tokens (the ids' length, else the backend's count, else 0)."""
        return len(self.completion_ids) if self.completion_ids is not None else self.reported_tokens

    @property
    def correct(self) -> bool | None:
        """The verdict's correctness flag (``None`` when the verifier has none)."""
        return None if self.verdict is None else self.verdict.get("correct")


@dataclass
class Episode:
    """One finished episode: per turn, one :class:`AgentTurn` per agent.

    ``wall_time``: the episode's share of the time its batch took (the batch's seconds divided by
    the episodes played together), so that the wall times of a run's episodes sum to its wall time.
    """

    env: str
    task_id: Any
    seed: int | None
    task_index: int | None
    turns: list[dict[str, AgentTurn]] = field(default_factory=list)
    wall_time: float = 0.0

    @property
    def agents(self) -> list[str]:
        """Agents in the order they acted."""
        return list(self.turns[0]) if self.turns else []

    @property
    def rewards(self) -> list[dict[str, float]]:
        """Per turn: agent -> reward."""
        return [{a: t.reward for a, t in turn.items()} for turn in self.turns]

    @property
    def correct(self) -> list[dict[str, bool | None]]:
        """Per turn: agent -> correctness of its answer."""
        return [{a: t.correct for a, t in turn.items()} for turn in self.turns]

    @property
    def num_tokens(self) -> int:
        """Completion tokens generated in the episode."""
        return sum(t.num_tokens for turn in self.turns for t in turn.values())

    @property
    def team_reward(self) -> float:
        """Mean reward over agents and turns (the cooperative score of the episode)."""
        values = [r for turn in self.rewards for r in turn.values()]
        return sum(values) / len(values) if values else 0.0

    def to_dict(self, tokens: bool = True) -> dict[str, Any]:
        """JSON-serialisable form; ``tokens=False`` drops token ids and log-probs."""
        data = asdict(self)
        if not tokens:
            for turn in data["turns"]:
                for record in turn.values():
                    record.update(prompt_ids=None, completion_ids=None, logprobs=None)
        data["team_reward"] = self.team_reward
        data["num_tokens"] = self.num_tokens
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Episode:
        """Inverse of :meth:`to_dict`."""
        turns = [{a: AgentTurn(**record) for a, record in turn.items()} for turn in data["turns"]]
        return cls(env=data["env"], task_id=data["task_id"], seed=data["seed"], task_index=data["task_index"],
                   turns=turns, wall_time=data.get("wall_time", 0.0))
