"""`MAPPOTrainer`: multi-agent PPO for debating LLM teams (MAPoRL).

One training step, top to bottom:

1. **collect** — play ``episodes_per_step`` debate episodes through the shared
   :class:`~llm_marl.rollout.RolloutEngine` (every agent's prompt of a turn in one batched
   generate call).
2. **score** — verifier scores ``s_i^t`` and correctness ``c_i^t`` of every answer: the env's
   answer-label verdicts, or a learned verifier (:mod:`verifiers.reward_model`).
3. **compute_rewards** — ``R_i^t`` = influence-aware return + incentives
   (:mod:`trainers.mappo.rewards`).
4. **compute_advantages** — per response: ``log π_old``, ``log π_ref`` (base, adapter off) and
   the centralized critic's ``V_k``; ``r_k = -β·kl_k``, ``r_K += R``; token-level GAE; whitening
   per (turn, agent) as MAPoRL's trainer does, or over the whole step (``whiten_scope``)
   (:mod:`trainers.mappo.ppo_math`).
5. **update** — ``ppo_epochs`` passes over shuffled minibatches of responses:
   ``L = L_clip(π) - entropy_coef · H + vf_coef · L_V``, each agent's policy loss on its own
   adapter, the value loss on the critic's adapter and head.
6. **log / checkpoint** — the shell's (:class:`trainers.common.trainer.Trainer`: loop, evaluation,
   checkpoints, seeding, optimizers); this module is the step (:meth:`MAPPOTrainer.run_step`).

Everything random in a step is derived from ``(seed, step)``: task choice, sampling noise. So a
run resumed from the checkpoint of step ``k`` replays step ``k + 1`` exactly.

Under ``accelerate launch`` (:mod:`trainers.common.distributed`) each process plays its share of the
step's ``episodes_per_step`` episodes (sampling noise from ``(seed, step, process)``); advantages are
whitened with moments over all processes; minibatches are drawn from the GLOBAL response list (one
shuffle, the same on every process) and each process computes its part of every minibatch's loss,
normalised by the minibatch's global response and token counts; each actor's and the critic's
gradients are summed over processes before their optimizer steps.
"""
from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator

from llm_marl.episode import Episode
from llm_marl.policy import SamplingParams
from llm_marl.rollout import RolloutEngine
from llm_marl.sharding import shard_optimizer_state
from llm_marl.team import Team
from llm_marl_envs.core import TextEnv, render_messages
from trainers.common.losses import kl_per_token, masked_mean
from trainers.common.trainer import Trainer, adamw, step_seed

from .config import MAPPOConfig
from .critic import CentralizedCritic, critic_context_parts, critic_task_text
from .logprobs_entropy import token_logprobs_with_entropy
from .ppo_math import clipped_policy_loss, clipped_value_loss, generalized_advantages, token_rewards, whiten
from .rewards import turn_rewards

CRITIC_ADAPTER = "critic"


@dataclass
class Response:
    """One agent's answer at one turn of one episode: the unit PPO trains on."""

    agent: str
    turn: int
    prompt_ids: list[int]
    completion_ids: list[int]
    critic_ids: list[int]
    reward: float = 0.0
    rollout_logprobs: list[float] | None = None     # per completion token, as the sampler computed them
    critic_prefix_ids: list[int] | None = None      # the critic context's task and earlier turns (a node's rows')
    # filled by compute_advantages (1-D, one entry per completion token)
    old_logprobs: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    value_targets: torch.Tensor | None = None
    kl: torch.Tensor | None = None
    critic_trunk: torch.Tensor | None = None         # the critic's frozen-layer states (config.critic_layers)


@dataclass
class EpisodeScores:
    """Verifier outcome of one episode: ``scores[t][i]``, ``correct[t][i]`` over the turns reached."""

    scores: list[list[float]]
    correct: list[list[bool | None]]
    extras: dict[str, Any] = field(default_factory=dict)


def _pad(rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """Right-pad 1-D tensors into ``[B, L]`` with zeros."""
    return torch.nn.utils.rnn.pad_sequence(list(rows), batch_first=True)


def _pad_with_mask(rows: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad 1-D tensors into ``[B, L]`` and the 0/1 float mask of their entries."""
    mask = _pad([torch.ones(len(row)) for row in rows])
    return _pad(rows), mask


class MAPPOTrainer(Trainer):
    """Multi-agent PPO with a centralized critic (see the module docstring)."""

    name = "mappo"
    batch_field = "episodes_per_step"
    progress_metric = "reward_mean"

    def __init__(self, env: TextEnv, team: Team, config: MAPPOConfig | None = None, *,
                 eval_env: TextEnv | None = None, verifier: Any = None, accelerator: Accelerator | None = None) -> None:
        config = config or MAPPOConfig()
        if config.future_mean == "others" and len(env.possible_agents) < 2:
            raise ValueError("future_mean='others' needs at least 2 agents; use future_mean='all'")
        self.verifier = verifier
        self._fused_value_stats: dict[str, dict[str, float]] | None = None   # set by a step whose critic runs once
        super().__init__(env, team, config, eval_env=eval_env, accelerator=accelerator)

    def build_models(self) -> list[torch.nn.Parameter]:
        """The centralized critic (its own adapter on the first agent's base, and a value head) and the learned
        verifier when one is configured; the critic's trainable parameters, synchronised with the agents'."""
        config = self.config
        self.critic = CentralizedCritic(self.team.policy(self.agents[0]), adapter=CRITIC_ADAPTER,
                                        lora_r=config.critic_lora_r,
                                        max_context_tokens=config.critic_max_context_tokens, seed=config.seed,
                                        layers=config.critic_layers, depth=config.critic_depth)
        for agent in self.agents:
            self.critic.check_tokenizer(agent, self.team.policy(agent))
        if self.verifier is None:
            self.verifier = self._load_verifier()
        return self.critic.trainable_parameters()

    def build_optimizers(self) -> None:
        """The agents' optimizers and the critic's (adapter and value head) at ``critic_learning_rate``."""
        if self.config.critic_layers is not None and self.distributed.sharded:
            raise ValueError("critic_layers runs the critic's frozen layers apart from the rest, which sharded "
                             "weights (FSDP) do not allow; use critic_layers=None with FSDP")
        if self.config.critic_depth is not None and self.distributed.sharded:
            raise ValueError("critic_depth runs part of the sharded layer stack, which FSDP's gathers do not allow; "
                             "use critic_depth=None with FSDP")
        self.critic.head.to(self.critic.policy.device)     # the value head is not in the team: it follows its base
        self.add_agent_optimizers()
        self.critic_params = self.critic.trainable_parameters()
        self.critic_optimizer = adamw(self.critic_params, self.config.critic_learning_rate, self.config.weight_decay)

    # ------------------------------------------------------------------ checkpoints (the shell's, plus the critic)
    def extra_state(self) -> dict[str, Any]:
        """The critic's adapter, value head and optimizer."""
        return {"critic": self.critic.trainable_state_dict(whole=False),
                "critic_optimizer": self.critic_optimizer.state_dict()}

    def load_extra_state(self, extra: Mapping[str, Any], path: Path) -> None:
        """Restore the critic and its optimizer."""
        if "critic" not in extra:
            raise ValueError(
                f"{path} is not a MAPPO checkpoint (no critic state); resume it with the trainer that wrote it"
            )
        self.critic.load_trainable_state_dict(extra["critic"])
        self.critic_optimizer.load_state_dict(shard_optimizer_state(self.critic_optimizer, extra["critic_optimizer"]))

    def _load_verifier(self) -> Any:
        if self.config.verifier == "label":
            return None
        if self.config.reward_server_url is not None:
            from verifiers.reward_server import RewardClient

            return RewardClient(self.config.reward_server_url)
        from verifiers.reward_model import RewardModel

        return RewardModel.from_pretrained(self.config.reward_model_path)

    # ------------------------------------------------------------------ 1. collect
    def sampling_params(self, step: int) -> SamplingParams:
        """Sampling settings of ``step`` on this process (seeded by step and process, so a resumed run replays it)."""
        c = self.config
        return SamplingParams(max_new_tokens=c.max_new_tokens, temperature=c.temperature, top_p=c.top_p,
                              seed=step_seed(c.seed, step, 1, self.distributed.rank))

    @property
    def plays_trees(self) -> bool:
        """Whether a step plays task trees (``num_generations > 1``) rather than plain episodes."""
        return self.config.num_generations > 1

    def collect(self, step: int) -> list[Episode]:
        """Play this process's share of the step's episodes (tasks drawn from ``(seed, step)``) through the engine:
        plain episodes, or each task's tree (``num_generations > 1``: its root-to-leaf episodes, which share the
        :class:`~llm_marl.episode.AgentTurn` of a common answer)."""
        rng = np.random.default_rng(step_seed(self.config.seed, step, 2))
        draws = rng.integers(len(self.train_tasks), size=self.config.episodes_per_step)    # global, same everywhere
        tasks = [self.train_tasks[i] for i in draws]
        seeds = [step_seed(self.config.seed, step, 3 + i) for i in range(len(tasks))]
        engine = RolloutEngine(self.env, self.team, self.sampling_params(step), progress=False)
        with self.accelerator.autocast():
            if self.plays_trees:
                return engine.play_trees(self.distributed.shard(tasks), self.distributed.shard(seeds),
                                         num_generations=self.config.num_generations)
            return engine.collect(seeds=self.distributed.shard(seeds), task_indices=self.distributed.shard(tasks),
                                  desc=f"mappo step {step}")

    # ------------------------------------------------------------------ 2. score
    def score(self, episode: Episode) -> EpisodeScores:
        """Verifier scores and correctness of every answer of ``episode`` (label or learned verifier)."""
        if self.verifier is None:
            return EpisodeScores([[float(turn[a].verdict["score"]) for a in self.agents] for turn in episode.turns],
                                 [[turn[a].correct for a in self.agents] for turn in episode.turns])
        pairs = [(self.question(episode), turn[a].text) for turn in episode.turns for a in self.agents]
        verdicts = self.verifier.score_batch(pairs)
        rows = [verdicts[t * len(self.agents):(t + 1) * len(self.agents)] for t in range(len(episode.turns))]
        # the learned scores replace s_i^t; the incentives keep the env's answer labels (MAPoRL)
        return EpisodeScores(
            [[v.score for v in row] for row in rows],
            [[turn[a].correct for a in self.agents] for turn in episode.turns],
            extras={"predicted_correct": [[v.correct for v in row] for row in rows]},
        )

    def question(self, episode: Episode) -> str:
        """The task text a learned verifier judges answers against (the record's question, else the first prompt)."""
        if episode.task_index is not None:
            question = self.env.tasks[episode.task_index].get("question")
            if isinstance(question, str):
                return question
        return render_messages(episode.turns[0][self.agents[0]].messages)

    def reward_examples(self, episodes: Sequence[Episode]) -> list[Any]:
        """Training data for a learned verifier: ``RewardExample(question, answer, correct)`` from label verdicts."""
        from verifiers.reward_model import RewardExample

        return [RewardExample(self.question(e), turn[a].text, bool(turn[a].correct))
                for e in episodes for turn in e.turns for a in self.agents if turn[a].correct is not None]

    # ------------------------------------------------------------------ 3. rewards
    def compute_rewards(self, episodes: Sequence[Any]) -> list[Response]:
        """One :class:`Response` per answer carrying ``R_i^t`` (returns + incentives).

        An answer that several episodes of a tree share (the same :class:`~llm_marl.episode.AgentTurn`) is one
        response whose reward is the mean of its ``R_i^t`` over those episodes.
        """
        c = self.config
        responses: list[Response] = []
        returns: dict[int, list[float]] = {}        # id(answer) -> its R_i^t in each episode through it
        answers_of: list[int] = []                   # id(answer) of each response
        for episode in episodes:
            outcome = self.score(episode)
            rewards = turn_rewards(outcome.scores, outcome.correct, gamma=c.reward_gamma, rule=c.reward_rule,
                                   future_mean=c.future_mean, incentives=c.incentives)
            answers = [{a: turn[a].text for a in self.agents} for turn in episode.turns]
            openings = {a: episode.turns[0][a].messages for a in self.agents}
            for t, turn in enumerate(episode.turns):
                for i, agent in enumerate(self.agents):
                    act = turn[agent]
                    if not act.completion_ids:
                        continue            # nothing was generated: no token to credit
                    if id(act) in returns:  # an earlier episode of the tree holds this answer's response
                        returns[id(act)].append(float(rewards[t, i]))
                        continue
                    returns[id(act)] = [float(rewards[t, i])]
                    task_text = critic_task_text(openings, agent)    # its opening prompt and the others' views
                    context = critic_context_parts(task_text, answers, agent, t)
                    if self.plays_trees:     # the task and earlier turns apart: the critic runs them once per node
                        earlier = 1 + sum(len(answers[k]) for k in range(t))
                        prefix, rest = self.critic.split_context_ids(context, shared=earlier)
                    else:
                        prefix, rest = None, self.critic.context_ids(context)
                    responses.append(Response(agent, t, list(act.prompt_ids), list(act.completion_ids), rest,
                                              rollout_logprobs=None if act.logprobs is None else list(act.logprobs),
                                              critic_prefix_ids=prefix))
                    answers_of.append(id(act))
        for response, answer in zip(responses, answers_of):
            response.reward = float(np.mean(returns[answer]))
        return responses

    # ------------------------------------------------------------------ 4. advantages
    def _minibatches(self, responses: Sequence[Response], shuffle_seed: int | None = None) -> list[list[Response]]:
        """Chunks of ``minibatch_size`` responses (shuffled when a seed is given)."""
        order = list(range(len(responses)))
        if shuffle_seed is not None:
            random.Random(shuffle_seed).shuffle(order)
        size = self.config.minibatch_size
        return [[responses[i] for i in order[k:k + size]] for k in range(0, len(order), size)]

    def _by_agent(self, batch: Sequence[Response]) -> dict[str, list[Response]]:
        groups: dict[str, list[Response]] = {}
        for response in batch:
            groups.setdefault(response.agent, []).append(response)
        return groups

    def compute_advantages(self, responses: Sequence[Response]) -> dict[str, float]:
        """Fill ``old_logprobs``, ``old_values``, ``advantages``, ``value_targets`` of every response (on the CPU).

        The reference policy is scored only when ``kl_coef > 0`` (``kl_ref`` is logged then). When
        :meth:`fuses_critic_pass`, the critic's forward here also takes the value loss's gradient.
        """
        c = self.config
        self._fused_value_stats = None
        if not responses:
            return {}
        with torch.no_grad():
            logp, mask = _pad_with_mask(self.old_logprobs(responses))
            score_reference = c.kl_coef > 0
            if score_reference:
                ref_logp, _ = _pad_with_mask(self.reference_logprobs(responses))
                kl = kl_per_token(logp, ref_logp, c.kl_estimator) * mask
            else:           # no KL penalty: the reference forward would only feed a term multiplied by 0
                kl = torch.zeros_like(logp)
            if self.critic.first_layer and not self.plays_trees:    # the frozen layers, once for the whole step
                self._store_trunk(responses)
            # r_k = -β·kl_k on every token, plus R_i^t on the last one
            rewards = token_rewards(torch.tensor([r.reward for r in responses]), mask, kl=kl, kl_coef=c.kl_coef)
        if self.fuses_critic_pass(responses):
            rows, self._fused_value_stats = self.values_with_value_gradient(responses, rewards, mask)
        else:
            with torch.no_grad():
                rows = self.rollout_values(responses)
        values, _ = _pad_with_mask(rows)
        # δ_k = r_k + γV_{k+1} - V_k ;  A_k = δ_k + γλA_{k+1} ;  G_k = A_k + V_k
        advantages, targets = generalized_advantages(rewards, values, mask, c.gae_gamma, c.gae_lambda)
        for row, response in enumerate(responses):
            n = len(response.completion_ids)
            response.old_logprobs, response.old_values = logp[row, :n].clone(), values[row, :n].clone()
            response.advantages, response.value_targets = advantages[row, :n].clone(), targets[row, :n].clone()
            response.kl = kl[row, :n].clone()
        if c.whiten_advantages:
            self.whiten_advantages(responses)
        stats = {"reward_mean": float(np.mean([r.reward for r in responses])),
                 "value_mean": float(torch.cat([r.old_values for r in responses]).mean()),
                 "response_tokens": float(np.mean([len(r.completion_ids) for r in responses]))}
        if score_reference:
            stats["kl_ref"] = float(torch.cat([r.kl for r in responses]).mean())
        return stats

    def old_logprobs(self, responses: Sequence[Response]) -> list[torch.Tensor]:
        """``log π_old`` of each completion token: the sampler's log-probs, else recomputed under the agent's adapter.

        The sampler computes the same quantity (the temperature-scaled distribution of the weights that
        sampled, before top-p) while it samples, so a second forward is needed only when a backend
        reports none or ``recompute_old_logprobs`` asks for one.
        """
        c = self.config
        if not c.recompute_old_logprobs and all(
                r.rollout_logprobs is not None and len(r.rollout_logprobs) == len(r.completion_ids) for r in responses):
            return [torch.tensor(r.rollout_logprobs, dtype=torch.float32) for r in responses]
        return self._scored(responses, key=lambda r: (id(self.team.policy(r.agent)), self.team.adapter(r.agent)),
                            score=lambda agent, chunk: self.team.policy(agent).token_logprobs(
                                [r.prompt_ids for r in chunk], [r.completion_ids for r in chunk],
                                adapter=self.team.adapter(agent), temperature=c.temperature)[0])

    def reference_logprobs(self, responses: Sequence[Response]) -> list[torch.Tensor]:
        """``log π_ref`` of every completion token: each base model with its adapters disabled."""
        return self._scored(responses, key=lambda r: id(self.team.policy(r.agent)),
                            score=lambda agent, chunk: self.team.policy(agent).token_logprobs(
                                [r.prompt_ids for r in chunk], [r.completion_ids for r in chunk],
                                temperature=self.config.temperature, reference=True)[0])

    def rollout_values(self, responses: Sequence[Response]) -> list[torch.Tensor]:
        """The centralized critic's ``V_k`` of every completion token, before the update."""
        return self._scored(responses, key=lambda r: 0, critic=True,
                            score=lambda agent, chunk: self.critic_values(chunk)[0])

    def fuses_critic_pass(self, responses: Sequence[Response]) -> bool:
        """Whether this step's critic runs once: ``fused_critic_pass``, one PPO epoch whose one minibatch holds
        every process's responses, and whole (unsharded) weights. The update's critic then equals the rollout's,
        so the value loss needs no forward of its own."""
        c = self.config
        return (c.fused_critic_pass and c.ppo_epochs == 1 and not self.distributed.sharded
                and self.distributed.sum([len(responses)])[0] <= c.minibatch_size)

    def values_with_value_gradient(self, responses: Sequence[Response], rewards: torch.Tensor, mask: torch.Tensor
                                   ) -> tuple[list[torch.Tensor], dict[str, dict[str, float]]]:
        """The critic's ``V_k`` of every response (CPU rows, in order), taking the gradient of the update's value
        loss on the way; and each agent's ``value_loss`` and ``vf_clipfrac`` stats.

        Each critic chunk (one agent's rows) gives its rows' GAE targets ``G_k`` (``rewards`` and ``mask``: the
        step's padded token rewards), and the chunk's :func:`clipped_value_loss` is backpropagated at once, weighted as
        :meth:`update` weights the agent's (``vf_coef`` times its share of the minibatch's responses, over its tokens
        in it). ``V`` equals ``V_old`` here, so the clip is never in force.
        """
        c = self.config
        shared = self.distributed.gather([(r.agent, len(r.completion_ids)) for r in responses])
        counts = agent_counts(pair for part in shared for pair in part)          # over all processes
        total = sum(size for size, _ in counts.values())
        row_of = {id(r): row for row, r in enumerate(responses)}
        values: dict[int, torch.Tensor] = {}
        parts: dict[str, list[tuple[dict[str, float], int]]] = {}
        self.critic_optimizer.zero_grad(set_to_none=True)
        # one agent's rows a chunk, as the update's value loss runs them: a chunk's graph is all the memory held
        for chunk in self._chunks(responses, key=lambda r: r.agent, critic=True):
            agent = chunk[0].agent
            size, tokens = counts[agent]
            with self.accelerator.autocast():
                chunk_values, chunk_mask = self.critic_values(chunk)
            chunk_values = chunk_values.float()
            detached = chunk_values.detach()
            on_cpu = detached.cpu()
            rows = [row_of[id(r)] for r in chunk]
            width = chunk_values.shape[1]
            with torch.no_grad():
                _, targets = generalized_advantages(rewards[rows, :width], on_cpu, mask[rows, :width],
                                                    c.gae_gamma, c.gae_lambda)
            loss, stats = clipped_value_loss(chunk_values, detached, targets.to(chunk_values.device), chunk_mask,
                                             c.value_clip, tokens=tokens)
            stats["value_loss"] = float(loss.detach())
            self.accelerator.backward(size / total * c.vf_coef * loss)
            parts.setdefault(agent, []).append((stats, sum(len(r.completion_ids) for r in chunk)))
            for row, response in enumerate(chunk):
                values[id(response)] = on_cpu[row, :len(response.completion_ids)]
        stats = {agent: _combined_stats(agent_parts) for agent, agent_parts in parts.items()}
        return [values[id(r)] for r in responses], stats

    def critic_values(self, group: Sequence[Response]) -> tuple[torch.Tensor, torch.Tensor]:
        """The critic's ``V_k`` ``[B, L]`` of the group's responses and their mask (from the stored trunk states, or
        running each shared task prefix once, where the step has either)."""
        prefixes = [r.critic_prefix_ids for r in group]
        return self.critic.values([r.critic_ids for r in group], [r.completion_ids for r in group],
                                  trunk=self._trunk(group), prefix_ids=None if None in prefixes else prefixes)

    def _store_trunk(self, responses: Sequence[Response]) -> None:
        """Keep each response's critic trunk states (the frozen layers' output), computed in length buckets."""
        for chunk in self._chunks(responses, key=lambda r: 0, critic=True):
            with self.accelerator.autocast():
                states = self.critic.trunk([r.critic_ids for r in chunk], [r.completion_ids for r in chunk])
            for response, state in zip(chunk, states):
                response.critic_trunk = state

    def _trunk(self, group: Sequence[Response]) -> list[torch.Tensor] | None:
        """The group's stored critic trunk states, or ``None`` when the critic runs every layer."""
        return [r.critic_trunk for r in group] if self.critic.first_layer and not self.plays_trees else None

    def _scored(self, responses: Sequence[Response], key, score, critic: bool = False) -> list[torch.Tensor]:
        """``score(agent, chunk)`` ``[B, L]`` over chunks of <= ``minibatch_size`` responses sharing ``key(response)``.

        Chunks are :func:`length_buckets` (the critic's when ``critic``: its context is the prefix), so
        they pad little; returns one CPU row per response, in the order given.
        """
        rows: dict[int, torch.Tensor] = {}
        for chunk in self._chunks(responses, key, critic):
            with self.accelerator.autocast():
                out = score(chunk[0].agent, chunk)
            # bookkeeping on the CPU: actors and critic may sit on different devices (agent_devices)
            out = out.float().cpu()
            for row, response in enumerate(chunk):
                rows[id(response)] = out[row, :len(response.completion_ids)]
        return [rows[id(r)] for r in responses]

    def _chunks(self, responses: Sequence[Response], key, critic: bool = False) -> list[list[Response]]:
        """Forward batches of <= ``minibatch_size`` responses sharing ``key(response)``: :func:`length_buckets`, or
        for a tree's responses :func:`prefix_batches` (rows with one prompt or task prefix together)."""
        groups: dict[Any, list[Response]] = {}
        for response in responses:
            groups.setdefault(key(response), []).append(response)
        batches = prefix_batches if self.plays_trees else length_buckets
        return [chunk for members in groups.values()
                for chunk in batches(members, critic=critic, max_rows=self.config.minibatch_size)]

    def whiten_advantages(self, responses: Sequence[Response]) -> None:
        """Whiten advantages over all processes' tokens: per (turn, agent) group, or all together (``whiten_scope``)."""
        if self.config.whiten_scope == "all":
            groups = {None: list(responses)}
        else:   # the same groups, in the same order, on every process (some may be empty here)
            turns = self.distributed.max(max((r.turn for r in responses), default=-1) + 1)
            groups = {
                (t, a): [r for r in responses if r.turn == t and r.agent == a]
                for t in range(turns)
                for a in self.agents
            }
        for group in groups.values():
            flat = torch.cat([r.advantages for r in group]) if group else torch.zeros(0)
            if self.distributed.sum([flat.numel()])[0] <= 1:
                continue
            # moments over all processes
            flat = whiten(flat, torch.ones_like(flat), reduce=self.distributed.sum_tensor)
            for response, part in zip(group, torch.split(flat, [len(r.completion_ids) for r in group])):
                response.advantages = part.clone()

    # ------------------------------------------------------------------ 5. loss and update
    def policy_loss(
        self, agent: str, group: Sequence[Response], tokens: int | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """``L_clip - entropy_coef·H`` of one agent's responses under its adapter.

        Token means are over ``tokens`` when given (the agent's tokens in the whole minibatch, all
        processes), else over the group's own tokens.
        """
        c = self.config
        policy, adapter = self.team.policy(agent), self.team.adapter(agent)
        prompts, completions = [r.prompt_ids for r in group], [r.completion_ids for r in group]
        entropy = None
        if c.entropy_coef > 0:  # the bonus needs the whole distribution, not only the sampled tokens' log-probs
            logp, mask, entropy = token_logprobs_with_entropy(
                policy, adapter, prompts, completions, temperature=c.temperature
            )
        else:
            logp, mask = policy.token_logprobs(prompts, completions, adapter=adapter, temperature=c.temperature)
        old, advantages = (
            _pad(rows).to(logp.device) for rows in ([r.old_logprobs for r in group], [r.advantages for r in group])
        )
        # L_clip = E[max(-A·ρ, -A·clip(ρ, 1-ε, 1+ε))],  ρ = π_θ / π_old
        loss, stats = clipped_policy_loss(logp, old, advantages, mask, c.clip_eps, tokens=tokens)
        stats["policy_loss"] = float(loss.detach())
        if entropy is not None:
            mean_entropy = masked_mean(entropy, mask, tokens)
            loss = loss - c.entropy_coef * mean_entropy
            stats["entropy"] = float(mean_entropy.detach())
        return loss, stats

    def value_loss(self, group: Sequence[Response], tokens: int | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """Clipped value loss ``½·E[max((V-G)², (V_clip-G)²)]`` of the centralized critic on these responses."""
        values, mask = self.critic_values(group)
        old, targets = (
            _pad(rows).to(values.device) for rows in ([r.old_values for r in group], [r.value_targets for r in group])
        )
        loss, stats = clipped_value_loss(values, old, targets, mask, self.config.value_clip, tokens=tokens)
        stats["value_loss"] = float(loss.detach())
        return loss, stats

    def update(self, responses: Sequence[Response], step: int) -> dict[str, float]:
        """``ppo_epochs`` passes of clipped-PPO minibatch updates over all processes' responses; the averaged stats.

        Minibatches are chunks of ONE shuffle of the global response list (the same on every
        process); a process computes the loss of its own members of each minibatch, normalised by
        the minibatch's global counts, and the gradients are summed over processes before each step.
        """
        c = self.config
        # (process, local index, agent, tokens) of every response of the step, on every process
        shared = self.distributed.gather([(r.agent, len(r.completion_ids)) for r in responses])
        layout = [(rank, i, agent, n) for rank, part in enumerate(shared) for i, (agent, n) in enumerate(part)]
        steps = [(self.optimizers[a], self.parameters[a]) for a in self.update_groups]   # one per shared adapter
        steps.append((self.critic_optimizer, self.critic_params))
        totals: dict[str, list[float]] = {}
        for epoch in range(c.ppo_epochs):
            for batch in self._minibatches(layout, shuffle_seed=step_seed(c.seed, step, 1000 + epoch)):
                counts = agent_counts((agent, n) for _, _, agent, n in batch)        # in the whole minibatch
                local = self._by_agent([responses[i] for rank, i, _, _ in batch if rank == self.distributed.rank])
                fused = self._fused_value_stats        # the critic's gradient is already taken
                for optimizer, _ in steps:
                    if not (fused is not None and optimizer is self.critic_optimizer):
                        optimizer.zero_grad(set_to_none=True)
                for agent in self.agents:
                    if agent not in counts:
                        continue
                    size, tokens = counts[agent]
                    group = local.get(agent, [])
                    weight = size / len(batch)          # the minibatch loss is a mean over responses
                    # backward right after each forward: PEFT marks only the active adapter trainable. Each loss
                    # runs in length buckets (token sums over the global count: their gradients add up to the
                    # whole group's); sharded weights: every process runs as many passes, idle ones weighted 0
                    actor_parts = self._loss_passes(
                        agent, group, weight, lambda part: self.policy_loss(agent, part, tokens)
                    )
                    critic_parts = [] if fused is not None else self._loss_passes(
                        agent, group, weight * c.vf_coef, lambda part: self.value_loss(part, tokens), critic=True
                    )
                    if not group:
                        continue
                    critic_stats = fused[agent] if fused is not None else _combined_stats(critic_parts)
                    stats = {**_combined_stats(actor_parts), **critic_stats}
                    stats["loss"] = stats["policy_loss"] + c.vf_coef * stats["value_loss"]
                    for key, value in stats.items():
                        totals.setdefault(key, []).append(value)
                # Σ over processes of each actor's and the critic's gradients, clip, step (trainers.common.distributed)
                self.distributed.optimizer_step(steps, c.max_grad_norm)
        return {key: float(np.mean(values)) for key, values in totals.items()}

    def _loss_passes(self, agent: str, group: Sequence[Response], weight: float, loss_of, critic: bool = False
                     ) -> list[tuple[dict[str, float], int]]:
        """Forward and backward ``weight · loss_of(part)`` over the group's length buckets (a tree's: one pass, its
        shared prefixes run once); (stats, tokens) per part."""
        parts = prefix_batches(group, critic=critic) if self.plays_trees else length_buckets(group, critic=critic)
        passes = self.distributed.lockstep(len(parts))          # the most any process has, under sharded weights
        done = []
        for k in range(passes):
            idle = k >= len(parts)
            part = [_idle_response(agent, self.team.policy(agent).pad_id)] if idle else parts[k]
            with self.accelerator.autocast():
                loss, stats = loss_of(part)
            self.accelerator.backward((0.0 if idle else weight) * loss)
            if not idle:
                done.append((stats, sum(len(r.completion_ids) for r in part)))
        return done

    # ------------------------------------------------------------------ 6. the step
    def run_step(self, step: int) -> dict[str, float]:
        """Collect, reward, advantage, update once; the step's metrics, merged over processes."""
        local: dict[str, float] = {}
        clock = PhaseClock()
        with self.distributed.full_weights():          # sharded weights are gathered for the gradient-free passes
            with clock("collect"):
                episodes = self.collect(step)
            with clock("rewards"):
                responses = self.compute_rewards(episodes)
            if self.distributed.sum([len(responses)])[0] == 0:
                raise RuntimeError(f"step {step}: every response was empty; raise max_new_tokens or check the policy")
            with clock("advantages"):
                local.update(self.compute_advantages(responses))
        with clock("update"):
            local.update(self.update(responses, step))
        answers = {id(act): act for e in episodes for turn in e.turns for act in turn.values()}   # a tree's once
        local["train_accuracy"] = float(np.mean([bool(act.correct) for act in answers.values()]))
        local["responses"] = float(len(responses))
        local.update(clock.metrics())
        # wall times: the slowest process's; response counts: summed over processes
        return self.distributed.merge_metrics(local, sums=("responses",), maxima=tuple(clock.keys()))


class PhaseClock:
    """Wall seconds of a step's named phases, logged as ``time/<phase>`` and their sum as ``time/step``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - started

    def metrics(self) -> dict[str, float]:
        """``{"time/<phase>": s, ..., "time/step": total}``."""
        timings = {f"time/{phase}": s for phase, s in self.seconds.items()}
        timings["time/step"] = sum(self.seconds.values())
        return timings

    def keys(self) -> list[str]:
        """The metric names :meth:`metrics` returns."""
        return list(self.metrics())


def length_buckets(responses: Sequence[Response], *, critic: bool = False, max_rows: int | None = None,
                   slack: float = 0.25) -> list[list[Response]]:
    """Responses sorted by length and cut into forward batches that waste little on padding.

    A batch of prefixes (prompts, or the critic's contexts when ``critic``) and completions is padded
    to ``rows · (longest prefix + longest completion)`` tokens; a batch grows while that stays within
    ``1 + slack`` times its real tokens (and ``max_rows``). Which rows share a forward changes only the
    float rounding of their results.
    """
    def prefix(r: Response) -> int:
        return len(r.critic_ids) if critic else len(r.prompt_ids)

    buckets: list[list[Response]] = []
    longest_prefix = longest_completion = real = 0
    for r in sorted(responses, key=lambda r: prefix(r) + len(r.completion_ids)):
        bucket = buckets[-1] if buckets else None
        p, n = prefix(r), len(r.completion_ids)
        if bucket is not None and (max_rows is None or len(bucket) < max_rows):
            padded = (len(bucket) + 1) * (max(longest_prefix, p) + max(longest_completion, n))
            if padded <= (1 + slack) * (real + p + n):
                bucket.append(r)
                longest_prefix, longest_completion, real = (
                    max(longest_prefix, p),
                    max(longest_completion, n),
                    real + p + n,
                )
                continue
        buckets.append([r])
        longest_prefix, longest_completion, real = p, n, p + n
    return buckets


def prefix_batches(responses: Sequence[Response], *, critic: bool = False,
                   max_rows: int | None = None) -> list[list[Response]]:
    """Responses ordered so that those sharing a prefix (the prompt, or the critic's task part when ``critic``) sit
    together, cut into batches of at most ``max_rows`` (all in one when ``None``).

    A forward runs each distinct prefix of its batch once, so a tree's responses pad only their completions
    and the rest of the critic's context.
    """
    def prefix(r: Response) -> tuple[int, ...]:
        return tuple((r.critic_prefix_ids or []) if critic else r.prompt_ids)

    ordered = sorted(responses, key=lambda r: (prefix(r), len(r.critic_ids) if critic else 0, len(r.completion_ids)))
    size = max_rows or max(len(ordered), 1)
    return [ordered[start:start + size] for start in range(0, len(ordered), size)]


def agent_counts(pairs: Iterable[tuple[str, int]]) -> dict[str, tuple[int, int]]:
    """``agent -> (responses, tokens)`` of ``(agent, completion tokens)`` pairs, agents in order of first sight."""
    counts: dict[str, tuple[int, int]] = {}
    for agent, n in pairs:
        size, tokens = counts.get(agent, (0, 0))
        counts[agent] = (size + 1, tokens + n)
    return counts


def _combined_stats(parts: Sequence[tuple[dict[str, float], int]]) -> dict[str, float]:
    """One agent's loss stats from its buckets': losses and the entropy bonus are shares of one mean (they add
    up), the rest are means over each bucket's tokens (weighted by them)."""
    combined: dict[str, float] = {}
    tokens = sum(n for _, n in parts) or 1
    for stats, n in parts:
        for key, value in stats.items():
            share = key.endswith("loss") or key == "entropy"
            combined[key] = combined.get(key, 0.0) + (value if share else value * n / tokens)
    return combined


def _idle_response(agent: str, pad_id: int) -> Response:
    """A one-token stand-in for the loss passes a process runs without responses of ``agent`` (weighted 0)."""
    zero = torch.zeros(1)
    return Response(agent, 0, [pad_id], [pad_id], [pad_id], old_logprobs=zero, old_values=zero, advantages=zero,
                    value_targets=zero, kl=zero)


__all__ = ["MAPPOTrainer", "Response", "EpisodeScores"]
