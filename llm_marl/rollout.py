"""`RolloutEngine`: the one rollout path of both trainers and the benchmark.

Every turn, the prompts of all agents of all parallel episodes are grouped by policy and
sampled in ONE batched ``generate`` call per policy (agents sharing a base go in one
mixed-adapter batch; separate models on the CPU sample concurrently, a share of the cores
each, see :func:`llm_marl.backends.hf.generate_all`), then every env is stepped.

- :meth:`RolloutEngine.collect` runs plain episodes (MAPPO, the benchmark, evaluation).
- :meth:`RolloutEngine.expand` is the tree primitive of MAGRPO: from env nodes (mid-episode),
  sample G completions per agent per node, form joint actions — ``aligned`` (the g-th sample
  of every agent together: G children) or ``cross`` (Cartesian product: G^N children) — and
  step a clone of the node per joint action.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from llm_marl_envs.core import TextEnv

from .episode import AgentTurn, Episode, jsonable_info
from .policy import Conversation, Generation, SamplingParams

if TYPE_CHECKING:
    from .team import Team

JOINT_MODES = ("aligned", "cross")


class GreedyCache:
    """Greedy answers kept by prompt, so that playing a prompt again with the same weights does not generate again.

    At temperature 0 an answer is a function of the weights and the prompt. Two plays that share prompts share
    those answers: a team and the same team with its partners' messages masked
    (``mask_messages=True``) see the same turn-0 prompts, so the second play generates only its later turns.
    Pass one cache to the :class:`RolloutEngine` of each play. Within one play, episodes whose agent sees the same
    prompt (two tasks that give it the same view) generate that answer once.

    An answer is kept under (the policy, its adapter, ``max_new_tokens``, ``no_repeat_ngram``, the conversation)
    and the policy's ``weights_version()``, so a load or an optimizer step makes the kept answers stale rather
    than wrong. Only policies that report ``weights_version`` are cached. A kept answer is handed to the policy's
    ``adopt`` (where it has one), so the next turn's prompt holds its ids as sampled. As with a prefix from the KV
    store, the answer a fresh generation would give differs only where two tokens tie within float rounding.
    """

    def __init__(self) -> None:
        self._answers: dict[tuple, Generation] = {}
        self.hits = 0      # answers taken from the cache
        self.misses = 0    # greedy answers generated (and kept)

    def __len__(self) -> int:
        return len(self._answers)

    @staticmethod
    def key(policy: Any, adapter: str | None, params: SamplingParams, conversation: Conversation) -> tuple | None:
        """The key of one greedy answer, or ``None`` where it cannot be cached (sampled, or no weights version)."""
        version = getattr(policy, "weights_version", None)
        if params.temperature != 0 or version is None:
            return None
        return (id(policy), version(), adapter, params.max_new_tokens, params.no_repeat_ngram,
                tuple((m["role"], m["content"]) for m in conversation))

    def get(self, key: tuple | None) -> Generation | None:
        """The kept answer under ``key`` (counted as a hit), else ``None``."""
        found = self._answers.get(key) if key is not None else None
        self.hits += found is not None
        return found

    def put(self, key: tuple | None, generation: Generation) -> None:
        """Keep ``generation`` under ``key`` (nothing when ``key`` is ``None``)."""
        if key is not None:
            self._answers[key] = generation
            self.misses += 1

    def clear(self) -> None:
        """Forget every answer (the counters stay)."""
        self._answers.clear()


@dataclass
class Expansion:
    """One tree node expanded: G samples per agent, the joint actions and the child env of each."""

    node: TextEnv                              # the env before acting (not modified)
    prompts: dict[str, Conversation]           # agent -> conversation it answered
    samples: dict[str, list[Generation]]       # agent -> G samples
    joint: list[tuple[int, ...]]               # per joint action: sample index of each agent (team.agents order)
    children: list[TextEnv]                    # per joint action: the env after stepping it
    rewards: list[dict[str, float]]            # per joint action: agent -> reward
    done: list[bool]                           # per joint action: episode ended
    infos: list[dict[str, dict[str, Any]]]     # per joint action: env infos


def joint_actions(num_generations: int, num_agents: int, mode: str) -> list[tuple[int, ...]]:
    """Sample-index tuples of the joint actions: ``aligned`` -> G tuples (g,..,g); ``cross`` -> G^N tuples."""
    if mode == "aligned":
        return [(g,) * num_agents for g in range(num_generations)]
    if mode == "cross":
        return list(itertools.product(range(num_generations), repeat=num_agents))
    raise ValueError(f"joint_mode must be one of {JOINT_MODES}, got {mode!r}")


class RolloutEngine:
    """Runs episodes of any :class:`TextEnv` with a :class:`Team`, batching generation per policy."""

    def __init__(self, env: TextEnv, team: Team, params: SamplingParams | None = None, *, progress: bool = True,
                 env_name: str | None = None, concurrent_policies: bool = True,
                 greedy_cache: GreedyCache | None = None) -> None:
        team.check_covers(env.possible_agents)
        self.greedy_cache = greedy_cache     # greedy answers shared with other plays of the same prompts
        self.concurrent_policies = concurrent_policies   # separate CPU models sample at once (hf.generate_all)
        self.env = env
        self.team = team
        self.params = params or SamplingParams()
        self.progress = progress
        self.env_name = env_name or env.metadata.get("name", type(env).__name__)

    # ------------------------------------------------------------------ batched sampling
    def sample(self, requests: Sequence[tuple[str, Conversation]], num_samples: int = 1,
               params: SamplingParams | None = None) -> list[list[Generation]]:
        """Sample for ``(agent, conversation)`` requests: one generate call per policy, results in input order.

        With a :class:`GreedyCache`, a greedy request whose answer the cache holds is not generated again, and
        greedy requests that are the same (policy, adapter, settings and conversation) are generated once.
        """
        params = params or self.params
        results: list[list[Generation] | None] = [None] * len(requests)
        keys: list[tuple | None] = [None] * len(requests)
        first_asked: dict[tuple, int] = {}     # key -> the request of this call that generates it
        repeats: set[int] = set()              # requests that take the answer of an earlier, identical one
        if self.greedy_cache is not None and num_samples == 1:
            for i, (agent, conversation) in enumerate(requests):
                keys[i] = self.greedy_cache.key(self.team.policy(agent), self.team.adapter(agent), params,
                                                conversation)
                kept = self.greedy_cache.get(keys[i])
                if kept is not None:
                    self._adopt(agent, conversation, kept)
                    results[i] = [kept]
                elif keys[i] is not None and keys[i] in first_asked:
                    repeats.add(i)
                elif keys[i] is not None:
                    first_asked[keys[i]] = i
        by_policy: dict[int, list[int]] = {}
        for i, (agent, _) in enumerate(requests):
            if results[i] is None and i not in repeats:
                by_policy.setdefault(id(self.team.policy(agent)), []).append(i)
        if not by_policy:
            return results  # type: ignore[return-value]
        calls = [(self.team.policy(requests[rows[0]][0]), [requests[i][1] for i in rows],
                  {"adapters": [self.team.adapter(requests[i][0]) for i in rows], "num_samples": num_samples})
                 for rows in by_policy.values()]
        from .backends.hf import generate_all  # torch and transformers load with the first batch

        outs = generate_all(calls, params, concurrent=self.concurrent_policies)
        for rows, out in zip(by_policy.values(), outs):
            for i, generations in zip(rows, out):
                results[i] = generations
                if self.greedy_cache is not None:
                    self.greedy_cache.put(keys[i], generations[0])
        for i in repeats:
            agent, conversation = requests[i]
            kept = self.greedy_cache.get(keys[i])
            self._adopt(agent, conversation, kept)
            results[i] = [kept]
        return results  # type: ignore[return-value]

    def _adopt(self, agent: str, conversation: Conversation, generation: Generation) -> None:
        """Hand a kept answer to the agent's policy (where it takes one), so its next prompt holds these ids."""
        adopt = getattr(self.team.policy(agent), "adopt", None)
        if adopt is not None:
            adopt(conversation, generation)

    # ------------------------------------------------------------------ plain episodes
    def collect(self, num_episodes: int | None = None, *, seeds: Sequence[int] | None = None,
                task_indices: Sequence[int | None] | None = None, parallel: int | None = None,
                params: SamplingParams | None = None, desc: str = "rollout") -> list[Episode]:
        """Run episodes; give ``num_episodes`` (seeds 0..n-1), ``seeds`` and/or ``task_indices`` (pinned tasks).

        ``parallel`` episodes (default: all) advance together, so each turn is one generate call
        per policy. Returns the episodes in input order.
        """
        seeds, task_indices = self._episode_specs(num_episodes, seeds, task_indices)
        parallel = parallel or len(seeds)
        if parallel < 1:
            raise ValueError(f"parallel must be >= 1, got {parallel}")
        episodes: list[Episode] = []
        # smoothing=0: the ETA from the mean rate, since a chunk's episodes all end at its last turn
        with tqdm(total=len(seeds), desc=desc, disable=not self.progress, leave=False, smoothing=0) as bar:
            for start in range(0, len(seeds), parallel):
                chunk = range(start, min(start + parallel, len(seeds)))
                episodes += self._run_batch([seeds[i] for i in chunk], [task_indices[i] for i in chunk], params, bar)
                self.clear_caches()                # these episodes are over: their KV caches cannot be extended
        return episodes

    def clear_caches(self) -> None:
        """Drop what the team's policies keep between calls (KV caches of earlier turns), where they keep any."""
        for policy in self.team.policies():
            clear = getattr(policy, "clear_cache", None)
            if clear is not None:
                clear()

    @staticmethod
    def _episode_specs(num_episodes, seeds, task_indices) -> tuple[list[int | None], list[int | None]]:
        n = next((len(x) for x in (seeds, task_indices) if x is not None), num_episodes)
        if n is None or n < 1:
            raise ValueError(f"say how many episodes: num_episodes >= 1, seeds or task_indices (got {num_episodes!r})")
        for name, value in (("seeds", seeds), ("task_indices", task_indices)):
            if value is not None and len(value) != n:
                raise ValueError(f"{name} has {len(value)} entries but {n} episodes were asked for; give equal lengths")
        seeds = list(seeds) if seeds is not None else list(range(n))
        task_indices = list(task_indices) if task_indices is not None else [None] * n
        return seeds, task_indices

    def _reset(self, seed: int | None, task_index: int | None) -> tuple[TextEnv, dict[str, dict[str, Any]]]:
        env = self.env.clone()
        options = {"task_index": task_index} if task_index is not None else None
        _, infos = env.reset(seed=seed, options=options)
        return env, infos

    def _run_batch(self, seeds, task_indices, params, bar) -> list[Episode]:
        started = time.perf_counter()
        envs, infos, episodes = [], [], []
        for seed, index in zip(seeds, task_indices):
            env, info = self._reset(seed, index)
            envs.append(env)
            infos.append(info)
            episodes.append(Episode(env=self.env_name, task_id=env.task.get("task_id"), seed=seed, task_index=index))
        live = list(range(len(envs)))
        params = params or self.params
        turn_call = 0
        while live:
            requests = [(agent, infos[e][agent]["messages"]) for e in live for agent in envs[e].agents]
            # a fresh seed for every turn: reusing the call's seed would replay turn 0's noise
            generations = iter(self.sample(requests, params=params.for_call(turn_call)))
            turn_call += 1
            bar.set_postfix_str(f"turn {turn_call} played by {len(live)} episodes")  # a chunk ends at its last turn
            still_live = []
            for e in live:
                env = envs[e]
                asked = {agent: next(generations)[0] for agent in env.agents}
                turn = env.turn
                _, rewards, terminations, truncations, new_infos = env.step({a: g.text for a, g in asked.items()})
                episodes[e].turns.append({
                    agent: self._agent_turn(agent, turn, infos[e][agent]["messages"], g, rewards[agent],
                                            env.verdicts[-1][agent], new_infos.get(agent, {}))
                    for agent, g in asked.items()})
                infos[e] = new_infos
                if env.agents:
                    still_live.append(e)
            bar.update(len(live) - len(still_live))       # those that ended this turn, at once
            live = still_live
        share = (time.perf_counter() - started) / len(episodes)      # played together: each its share of the batch
        for episode in episodes:
            episode.wall_time = share
        return episodes

    def _agent_turn(self, agent, turn, messages, generation: Generation, reward, verdict, info) -> AgentTurn:
        return AgentTurn(
            agent=agent, turn=turn, messages=[dict(m) for m in messages], text=generation.text, reward=float(reward),
            verdict=verdict.to_dict() if verdict is not None else None, prompt_ids=generation.prompt_ids,
            completion_ids=generation.completion_ids, logprobs=generation.logprobs,
            finish_reason=generation.finish_reason, reported_tokens=generation.num_tokens,
            policy=self.team.policy(agent).name,
            adapter=self.team.adapter(agent), info=jsonable_info(info))

    # ------------------------------------------------------------------ MAGRPO tree primitive
    def reset_nodes(self, task_indices: Sequence[int], seeds: Sequence[int | None] | None = None) -> list[TextEnv]:
        """Root nodes: one env per task index, reset with the task pinned (``reset(options={"task_index": i})``)."""
        seeds = list(seeds) if seeds is not None else [None] * len(task_indices)
        return [self._reset(seed, index)[0] for seed, index in zip(seeds, task_indices)]

    def expand(self, nodes: Sequence[TextEnv], num_generations: int, joint_mode: str = "aligned",
               params: SamplingParams | None = None) -> list[Expansion]:
        """Expand live env nodes: G samples per agent per node (one generate call per policy), step joint actions."""
        if num_generations < 1:
            raise ValueError(f"num_generations must be >= 1, got {num_generations}")
        for node in nodes:
            if not node.agents:
                raise ValueError("cannot expand a finished episode; expand only nodes whose env has live agents")
        requests = [(agent, [dict(m) for m in node.messages[agent]]) for node in nodes for agent in node.agents]
        params = (params or self.params).for_call(*sorted({node.turn for node in nodes}))   # seeded: fresh per turn
        generations = iter(self.sample(requests, num_samples=num_generations, params=params))
        expansions = []
        for node in nodes:
            agents = list(node.agents)
            samples = {agent: next(generations) for agent in agents}
            prompts = {agent: [dict(m) for m in node.messages[agent]] for agent in agents}
            joint = joint_actions(num_generations, len(agents), joint_mode)
            children, rewards, done, infos = [], [], [], []
            for combo in joint:
                child = node.clone()
                _, reward, terminations, truncations, info = child.step(
                    {agent: samples[agent][g].text for agent, g in zip(agents, combo)})
                children.append(child)
                rewards.append({a: float(r) for a, r in reward.items()})
                done.append(not child.agents)
                infos.append(info)
            expansions.append(Expansion(node, prompts, samples, joint, children, rewards, done, infos))
        return expansions

    def play_trees(self, task_indices: Sequence[int], seeds: Sequence[int | None] | None = None, *,
                   num_generations: int, params: SamplingParams | None = None) -> list[Episode]:
        """Play each task as an ``aligned`` tree (:meth:`expand` to the end) and return its finished episodes.

        Every node samples G answers per agent and the g-th answers act together, so a task with T turns
        ends in ``G^T`` episodes, root to leaf. Episodes that pass through one node's sample hold the
        same :class:`AgentTurn` object for it (its ``id`` names the sample), in task order, then leaf order.
        """
        roots = self.reset_nodes(task_indices, seeds)
        seeds = list(seeds) if seeds is not None else [None] * len(roots)
        frontier = [(node, root, []) for root, node in enumerate(roots)]
        finished: list[list[list[dict[str, AgentTurn]]]] = [[] for _ in roots]    # per task: its episodes' turns
        while frontier:
            expansions = self.expand([node for node, _, _ in frontier], num_generations, "aligned", params)
            next_frontier = []
            for (node, root, path), expansion in zip(frontier, expansions):
                agents = list(expansion.samples)
                for j, combo in enumerate(expansion.joint):
                    child = expansion.children[j]
                    acts = {agent: self._agent_turn(agent, node.turn, expansion.prompts[agent],
                                                    expansion.samples[agent][g], expansion.rewards[j][agent],
                                                    child.verdicts[-1][agent], expansion.infos[j].get(agent, {}))
                            for agent, g in zip(agents, combo)}
                    if expansion.done[j]:
                        finished[root].append(path + [acts])
                    else:
                        next_frontier.append((child, root, path + [acts]))
            frontier = next_frontier
        self.clear_caches()                  # the trees are complete: nothing extends their KV caches
        return [Episode(env=self.env_name, task_id=roots[root].task.get("task_id"), seed=seeds[root],
                        task_index=task_indices[root], turns=turns)
                for root, paths in enumerate(finished) for turns in paths]
