"""MAGRPO: multi-agent group-relative policy optimisation (CoMLRL), readable top to bottom.

One training step:

1. **collect** — pick ``prompts_per_step`` tasks; each is the root of a tree. At every turn all
   live nodes are expanded together (:meth:`RolloutEngine.expand`: G samples per agent per
   node, one generate call per policy): ``aligned`` joint actions pair the g-th samples
   (G children), ``cross`` takes the Cartesian product (G^N children). Each joint action
   steps its own clone of the env, which supplies the next prompts (feedback).
   With ``early_termination_threshold`` set, a node whose mean joint reward exceeds it is not
   expanded further (CoMLRL; ``early_termination="joint_action"`` stops branch by branch).
2. **compute_returns** — joint reward r = mean over agents of the env rewards, plus the mean of
   MAPoRL's incentive bonuses when ``alpha0``/``alpha1`` are set (:func:`incentive_shaped`), and with
   ``reward_turns="final"`` zero for joint actions that do not end the episode; bottom-up
   ``R = r + γ · mean(R of the child's joint actions)`` (leaves: R = r).
3. **compute_advantages** — per node and agent, the value of sample k is the mean return of
   the joint actions containing it (aligned: R_k itself), minus ``β · Σ_t k3`` of the sample
   when ``kl_placement="reward"`` (CoMLRL, the default); then the group baseline:
   mean ``A = R - mean(R)``, rloo ``A = R - mean of the other G-1``, max ``A = R - max(R)``,
   raw ``A = R``; optionally divided by ``max(std(R), floor)``.
4. **loss / update** — per turn (the last turn first, as CoMLRL's post-order update; see
   ``update_order``), per agent (its own adapter or model):
   ``L = -(1/M) Σ_m A_m Σ_t log π(y_m,t | x_m, y_m,<t)``, plus ``β · (1/M) Σ_m mean_t k3_m,t``
   when ``kl_placement="loss"``; k3 is the KL estimator ``k3 = exp(ref - logp) - (ref - logp) - 1``
   against the reference (base with adapters disabled), zero at step 0, where adapters are zero.

With ``credit="counterfactual"`` (C3-style, :mod:`trainers.magrpo.counterfactual`) steps 1-3 change:
one transcript per task is sampled, and every message (turn t, agent i) is replayed with K alternatives
from the frozen transcript up to it, the rest of each branch sampled afresh; the transcript's outcome
R_0 and the alternatives' R_1..R_K form the message's group, whose advantages use the same baselines
(mean: ``A_k = R_k - mean(R_0..R_K)``). Step 4 is unchanged (per turn, per agent).

Every step logs what it sampled: ``completions_sampled`` and ``answer_tokens_sampled`` (over all processes).

Under ``accelerate launch`` (:mod:`trainers.common.distributed`) each process expands its share of
the step's ``prompts_per_step`` trees, ``M`` in the loss is the GLOBAL sample count of the turn and
agent, and each agent's gradients are summed over processes before its optimizer step: N
processes make the update one process would make on the whole batch.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from tqdm.auto import tqdm
from transformers import get_scheduler

from llm_marl.backends.hf import HFPolicy
from llm_marl.policy import SamplingParams
from llm_marl.rollout import Expansion, RolloutEngine
from llm_marl.team import Team
from llm_marl_envs.core import TextEnv

from ..common.checkpoint import latest_checkpoint, load_checkpoint, resolve_checkpoint, save_checkpoint
from ..common.distributed import prepare_training
from ..common.evaluation import EvalResult, eval_report_path, evaluate_episodes, held_out_tasks
from ..common.logging import MetricsLogger
from ..common.losses import kl_per_token, sequence_means
from ..mappo.rewards import IncentiveWeights, incentive_bonuses
from .config import MAGRPOConfig
from .counterfactual import CounterfactualBatch, MessageReplay, collect_counterfactual, team_outcome


@dataclass
class TreeNode:
    """One expanded node of the MAGRPO tree at ``turn``."""

    turn: int
    expansion: Expansion
    joint_rewards: list[float]                                  # r per joint action
    children: list[TreeNode | None] = field(default_factory=list)  # expansion of each joint action's child
    returns: list[float] = field(default_factory=list)          # R per joint action


def incentive_shaped(expansion: Expansion, joint_rewards: Sequence[float], weights: IncentiveWeights) -> list[float]:
    """Each joint action's reward plus the mean over agents of its incentive bonus for the turn just played.

    The bonus (:func:`trainers.mappo.rewards.incentive_bonuses`) reads the env's per-turn ``correct`` table in the
    infos, so a right answer kept or found earns α and, with penalties, a right answer turned wrong costs α.
    """
    shaped = []
    for reward, infos in zip(joint_rewards, expansion.infos):
        table = next(iter(infos.values()), {}).get("correct") if infos else None
        if table is None:
            raise ValueError("alpha0/alpha1 incentives need an env whose infos carry the per-turn 'correct' table "
                             "(the debate envs do); set alpha0=alpha1=0 for this env")
        shaped.append(reward + float(np.mean(incentive_bonuses(table, weights)[-1])))
    return shaped


def group_advantages(values: torch.Tensor, mode: str, normalize: bool = False, std_floor: float = 1e-4) -> torch.Tensor:
    """Group-relative advantages of G values (see the module docstring for the modes)."""
    g = values.numel()
    if mode == "mean":
        advantages = values - values.mean()
    elif mode == "rloo":
        advantages = values - (values.sum() - values) / (g - 1)
    elif mode == "max":
        advantages = values - values.max()
    elif mode == "raw":
        advantages = values.clone()
    else:
        raise ValueError(f"advantage_mode must be mean|rloo|max|raw, got {mode!r}")
    if normalize:
        advantages = advantages / values.std().clamp(min=std_floor)   # unbiased std of the group
    return advantages


def sample_values(node: TreeNode, agent_position: int, num_generations: int) -> torch.Tensor:
    """Value of each of an agent's G samples: mean return of the joint actions that contain it."""
    totals = torch.zeros(num_generations, dtype=torch.float64)
    counts = torch.zeros(num_generations, dtype=torch.float64)
    for combo, ret in zip(node.expansion.joint, node.returns):
        totals[combo[agent_position]] += ret
        counts[combo[agent_position]] += 1
    return totals / counts.clamp(min=1)


def sample_diagnostics(samples: Sequence[Any], group_advantages: Sequence[torch.Tensor]) -> dict[str, float]:
    """Why a step did or did not learn: the share of groups whose advantages are all 0 (no gradient), response
    length, and the mean negative log-prob of the sampled tokens (a Monte-Carlo estimate of the sampling entropy
    per token; it falls as the policy sharpens)."""
    lengths = [len(g.completion_ids) for g in samples]
    logprobs = [lp for g in samples for lp in (g.logprobs or [])]
    out = {"zero_advantage_groups": float(np.mean([bool((a == 0).all()) for a in group_advantages]))
           if group_advantages else 0.0,
           "response_tokens": float(np.mean(lengths)) if lengths else 0.0}
    if logprobs:
        out["entropy_estimate"] = float(-np.mean(logprobs))
    return out


class MAGRPOTrainer:
    """Trains a :class:`Team` on a :class:`TextEnv` with MAGRPO (see the module docstring)."""

    def __init__(self, env: TextEnv, team: Team, config: MAGRPOConfig | None = None, *,
                 eval_env: TextEnv | None = None, accelerator: Accelerator | None = None) -> None:
        self.config = config = config or MAGRPOConfig()
        team.check_covers(env.possible_agents)
        self.env, self.team, self.agents = env, team, list(env.possible_agents)
        for agent in self.agents:
            policy = team.policy(agent)
            if not isinstance(policy, HFPolicy):
                raise ValueError(f"{agent}'s policy {policy.name!r} cannot be trained (inference-only backend); "
                                 f"train HFPolicy members (Team.shared_lora / Team.separate)")
            if config.kl_coef > 0 and not policy.is_peft:
                raise ValueError(f"kl_coef={config.kl_coef} needs a LoRA policy (the reference is the base with the "
                                 f"adapter disabled); {agent} is fully fine-tuned: set kl_coef=0 or use LoRA")
        self.distributed = prepare_training(config, team, self.agents, config.prompts_per_step, "prompts_per_step",
                                            accelerator)
        self.accelerator = self.distributed.accelerator
        set_seed(config.seed, device_specific=True)     # sampling noise differs per process
        self.sampling = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                                       top_p=config.top_p, no_repeat_ngram=config.no_repeat_ngram)
        self.engine = RolloutEngine(env, team, self.sampling, progress=False)
        self.eval_engine = RolloutEngine(eval_env or env, team, progress=config.progress and self.distributed.is_main)
        self.train_tasks, self.eval_tasks = held_out_tasks(env, eval_env, config.eval_tasks)
        weights = IncentiveWeights(alpha0=config.alpha0, alpha1=config.alpha1, penalties=config.incentive_penalties)
        self.incentives = weights if weights.any_nonzero else None
        if self.incentives and len(self.agents) < 2:
            raise ValueError("alpha0/alpha1 incentives need at least 2 agents (they read the other agents' answers); "
                             "set them to 0")
        self.task_rng = np.random.default_rng(config.seed)   # the same on every process: draws the global batch
        self.optimizers, self.schedulers, self.parameters = {}, {}, {}
        # agents that act with the same weights (one policy and adapter) share one optimizer: an update group
        self.update_groups: dict[str, list[str]] = {}
        learning_rates = {a: (config.agent_learning_rates or {}).get(a, config.learning_rate) for a in self.agents}
        for agent in self.agents:
            leader = next((first for first in self.update_groups if team.policy(first) is team.policy(agent)
                           and team.adapter(first) == team.adapter(agent)), None)
            if leader is not None:
                lrs = {a: learning_rates[a] for a in (leader, agent)}
                if len(set(lrs.values())) > 1:
                    raise ValueError(f"{leader} and {agent} share one adapter ({team.adapter(agent)!r}) and so one "
                                     f"optimizer, but agent_learning_rates gives them {lrs}")
                self.update_groups[leader].append(agent)
                for table in (self.optimizers, self.schedulers, self.parameters):
                    table[agent] = table[leader]
                continue
            self.update_groups[agent] = [agent]
            params = team.policy(agent).trainable_parameters(team.adapter(agent))
            lr = learning_rates[agent]
            fused = all(p.device.type in ("cpu", "cuda") for p in params)   # one pass over the weights per step
            self.optimizers[agent] = torch.optim.AdamW(params, lr=lr, weight_decay=config.weight_decay, fused=fused)
            self.schedulers[agent] = get_scheduler(config.lr_scheduler, self.optimizers[agent],
                                                   num_warmup_steps=config.warmup_steps,
                                                   num_training_steps=config.max_steps * env.num_turns)
            self.parameters[agent] = params
        self.step = 0
        self.logger = MetricsLogger(config.output_dir, config.report_to, enabled=self.distributed.is_main,
                                    run_config=config.to_dict())

    # ------------------------------------------------------------------ 1. collect
    def collect(self) -> list[TreeNode]:
        """Expand this process's share of the step's ``prompts_per_step`` task trees level by level; the roots."""
        cfg = self.config
        frontier = self.step_roots()
        parents: list[tuple[TreeNode, int] | None] = [None] * len(frontier)
        roots: list[TreeNode] = []
        turn = 0
        while frontier:
            expansions = self.engine.expand(frontier, cfg.num_generations, cfg.joint_mode)
            next_frontier, next_parents = [], []
            for expansion, parent in zip(expansions, parents):
                joint_rewards = [float(np.mean(list(r.values()))) for r in expansion.rewards]   # shared joint reward
                shaped = joint_rewards if self.incentives is None else incentive_shaped(expansion, joint_rewards,
                                                                                         self.incentives)
                if cfg.reward_turns == "final":         # only the episode's last joint actions keep a reward
                    shaped = [r if done else 0.0 for r, done in zip(shaped, expansion.done)]
                node = TreeNode(turn, expansion, shaped, children=[None] * len(joint_rewards))
                if parent is None:
                    roots.append(node)
                else:
                    parent[0].children[parent[1]] = node
                node_stops = self.stops_here(joint_rewards)
                for j, (child, done, reward) in enumerate(zip(expansion.children, expansion.done, joint_rewards)):
                    stop = node_stops or (cfg.early_termination == "joint_action" and self.stops_here([reward]))
                    if not done and not stop:
                        next_frontier.append(child)
                        next_parents.append((node, j))
            frontier, parents, turn = next_frontier, next_parents, turn + 1
        self.engine.clear_caches()                 # the tree is complete: nothing extends its KV caches
        return roots

    def step_roots(self) -> list[TextEnv]:
        """This process's share of the step's ``prompts_per_step`` tasks, each as a freshly reset env."""
        cfg = self.config
        tasks = self.task_rng.choice(self.train_tasks, size=cfg.prompts_per_step).tolist()   # global, same everywhere
        seeds = self.task_rng.integers(0, 2**31 - 1, size=cfg.prompts_per_step).tolist()
        return self.engine.reset_nodes(self.distributed.shard(tasks), self.distributed.shard(seeds))

    def collect_counterfactual(self) -> CounterfactualBatch:
        """``credit="counterfactual"``: one transcript per task, then K replayed alternatives per message."""
        cfg = self.config
        batch = collect_counterfactual(self.engine, self.step_roots(), cfg.counterfactual_samples, self.sampling,
                                       cfg.counterfactual_reward)
        self.engine.clear_caches()                 # every branch is finished: nothing extends its KV caches
        return batch

    def stops_here(self, joint_rewards: Sequence[float]) -> bool:
        """Early termination: whether rewards stop the expansion (node mean > threshold, or one branch >= it)."""
        threshold = self.config.early_termination_threshold
        if threshold is None:
            return False
        if self.config.early_termination == "node_mean":
            return len(joint_rewards) > 1 and float(np.mean(joint_rewards)) > threshold
        return joint_rewards[0] >= threshold

    # ------------------------------------------------------------------ 2. returns
    def compute_returns(self, node: TreeNode) -> list[float]:
        """R_j = r_j + γ · mean(child returns) for every joint action j of ``node`` (recursively)."""
        node.returns = []
        for reward, child in zip(node.joint_rewards, node.children):
            future = float(np.mean(self.compute_returns(child))) if child is not None else 0.0
            node.returns.append(reward + self.config.discount * future)
        return node.returns

    # ------------------------------------------------------------------ 3. advantages
    def compute_advantages(self, node: TreeNode, kl: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Per agent: the G advantages of its samples at ``node`` (``kl[agent]``: Σ_t k3 per sample, adds -β·kl)."""
        cfg = self.config
        agents = list(node.expansion.samples)
        advantages = {}
        for i, agent in enumerate(agents):
            values = sample_values(node, i, cfg.num_generations)
            if kl is not None and agent in kl:
                values = values - cfg.kl_coef * kl[agent].to(values.dtype)     # R_k - β·Σ_t k3_k   (CoMLRL)
            advantages[agent] = group_advantages(values, cfg.advantage_mode, cfg.normalize_advantages,
                                                 cfg.advantage_std_floor)
        return advantages

    def counterfactual_advantages(self, replay: MessageReplay) -> torch.Tensor:
        """The K+1 advantages of a message's group: the transcript's message first, then its alternatives."""
        cfg = self.config
        outcomes = torch.tensor(replay.outcomes, dtype=torch.float64)     # R_0 (transcript), R_1..R_K
        return group_advantages(outcomes, cfg.advantage_mode, cfg.normalize_advantages, cfg.advantage_std_floor)

    @torch.no_grad()
    def sequence_kls(self, agent: str, rows: Sequence[tuple[list[int], list[int]]]) -> torch.Tensor:
        """Σ_t k3 of each ``(prompt ids, completion ids)`` row under the agent's policy against the reference."""
        policy, adapter, cfg = self.team.policy(agent), self.team.adapter(agent), self.config
        sums = []
        for chunk, real in self.micro_batches(agent, rows):
            prompts, completions = [r[0] for r in chunk], [r[1] for r in chunk]
            with self.accelerator.autocast():
                logp, mask = policy.token_logprobs(prompts, completions, adapter=adapter, temperature=cfg.temperature)
                ref, _ = policy.token_logprobs(prompts, completions, temperature=cfg.temperature, reference=True)
            if real:
                sums.append((kl_per_token(logp.float(), ref.float(), "k3") * mask).sum(-1).cpu())
        return torch.cat(sums) if sums else torch.zeros(0)

    def micro_batches(self, agent: str, rows: Sequence[tuple], *idle_extra: Any):
        """``(chunk, real)`` per forward pass: ``micro_batch_size`` rows at a time, then, with sharded weights, idle
        passes over one ``([pad], [pad], *idle_extra)`` row (``real=False``) until every process has run as many
        passes as the busiest."""
        size, pad = self.config.micro_batch_size, self.team.policy(agent).pad_id
        chunks = [list(rows[start:start + size]) for start in range(0, len(rows), size)]
        idle = [([pad], [pad], *idle_extra)]
        for index in range(self.distributed.lockstep(len(chunks))):
            yield (chunks[index], True) if index < len(chunks) else (idle, False)

    def node_kls(self, nodes: Sequence[TreeNode]) -> list[dict[str, torch.Tensor]] | None:
        """Per node and agent: Σ_t k3 of its G samples (``kl_placement="reward"``, ``kl_coef > 0``), else ``None``."""
        if self.config.kl_coef == 0 or self.config.kl_placement != "reward":
            return None
        per_node: list[dict[str, torch.Tensor]] = [{} for _ in nodes]
        for agent in self.agents:
            rows = [(g.prompt_ids, g.completion_ids) for node in nodes for g in node.expansion.samples.get(agent, [])]
            flat = iter(self.sequence_kls(agent, rows).tolist())
            for node, kls in zip(nodes, per_node):
                if agent in node.expansion.samples:
                    kls[agent] = torch.tensor([next(flat) for _ in node.expansion.samples[agent]])
        return per_node

    # ------------------------------------------------------------------ 4. loss and update
    def loss(self, agent: str, prompt_ids: Sequence[list[int]], completion_ids: Sequence[list[int]],
             advantages: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
        """REINFORCE on a micro-batch's summed token log-probs (+ β·k3 KL if ``kl_placement="loss"``); (loss, kl)."""
        policy, adapter = self.team.policy(agent), self.team.adapter(agent)
        logp, mask = policy.token_logprobs(prompt_ids, completion_ids, adapter=adapter,
                                           temperature=self.config.temperature)
        # L_pg = -(1/M) Σ_m A_m · Σ_t log π(y_m,t)     (M = total: samples over all processes)
        loss = -(advantages.to(logp.device, logp.dtype) * (logp * mask).sum(-1)).sum() / total
        kl = torch.zeros(())
        if self.config.kl_coef > 0 and self.config.kl_placement == "loss":
            ref, _ = policy.token_logprobs(prompt_ids, completion_ids, temperature=self.config.temperature,
                                           reference=True)
            k3 = kl_per_token(logp, ref, "k3") * mask                     # k3 = e^{ref-logp} - (ref-logp) - 1 >= 0
            kl = sequence_means(k3, mask).sum() / total                   # (1/M) Σ_m mean_t k3
            loss = loss + self.config.kl_coef * kl
        return loss, kl.detach()

    def update(self, roots: list[TreeNode]) -> dict[str, float]:
        """One optimiser step per turn per agent on that turn's samples (of every process); returns local metrics.

        Turns are stepped in ``update_order``; every KL that enters the rewards is measured first, under the
        policy that sampled (as CoMLRL does at generation time).
        """
        metrics: dict[str, float] = {}
        by_turn: dict[int, list[TreeNode]] = {}
        for node in _walk(roots):
            by_turn.setdefault(node.turn, []).append(node)
        num_turns = self.distributed.max(max(by_turn, default=-1) + 1)    # every process steps through the same turns
        kls = {turn: self.node_kls(by_turn.get(turn, [])) for turn in range(num_turns)}
        order = range(num_turns - 1, -1, -1) if self.config.update_order == "last_turn_first" else range(num_turns)
        for turn in order:
            nodes = by_turn.get(turn, [])
            node_kls = kls[turn] or [None] * len(nodes)
            advantages = [self.compute_advantages(node, kl) for node, kl in zip(nodes, node_kls)]
            if kls[turn]:
                metrics[f"turn{turn}/kl_sum_mean"] = float(
                    torch.cat([v for kl in node_kls for v in kl.values()]).mean()
                )
            for leader, group in self.update_groups.items():   # one step per group on all its agents' samples
                rows = [(g.prompt_ids, g.completion_ids, float(a))
                        for agent in group for node, adv in zip(nodes, advantages)
                        for g, a in zip(node.expansion.samples[agent], adv[agent])]
                metrics.update(self._update_agent(leader, turn, rows))
            for agent in self.agents:
                if not nodes:
                    continue
                rewards = [r[agent] for node in nodes for r in node.expansion.rewards]
                values = torch.cat([adv[agent] for adv in advantages])
                prefix = f"turn{turn}/{agent}"
                metrics.update(
                    {
                        f"{prefix}/reward_mean": float(np.mean(rewards)),
                        f"{prefix}/reward_std": float(np.std(rewards)),
                        f"{prefix}/advantage_mean": float(values.mean()),
                        f"{prefix}/advantage_std": float(values.std()),
                    }
                )
                metrics.update({f"{prefix}/{k}": v for k, v in sample_diagnostics(
                    [g for node in nodes for g in node.expansion.samples[agent]], [adv[agent] for adv in advantages]
                ).items()})
            if nodes:
                returns = [r for node in nodes for r in node.returns]
                metrics[f"turn{turn}/return_mean"] = float(np.mean(returns))
                metrics[f"turn{turn}/joint_reward_mean"] = float(np.mean([r for n in nodes for r in n.joint_rewards]))
        return metrics

    def update_counterfactual(self, batch: CounterfactualBatch) -> dict[str, float]:
        """Step 4 for ``credit="counterfactual"``: per turn (in ``update_order``), per agent, REINFORCE on its
        messages weighted by their counterfactual advantages; returns local metrics."""
        cfg, metrics = self.config, {}
        by_turn: dict[int, list[MessageReplay]] = {}
        for replay in batch.replays:
            by_turn.setdefault(replay.turn, []).append(replay)
        num_turns = self.distributed.max(max(by_turn, default=-1) + 1)    # every process steps through the same turns
        order = range(num_turns - 1, -1, -1) if cfg.update_order == "last_turn_first" else range(num_turns)
        for turn in order:
            replays = by_turn.get(turn, [])
            per_agent = {}
            for agent in self.agents:
                mine = [replay for replay in replays if replay.agent == agent]
                advantages = [self.counterfactual_advantages(replay) for replay in mine]
                if cfg.counterfactual_update == "transcript":
                    advantages = [adv[:1] for adv in advantages]
                trained = [[replay.actual, *replay.alternatives][:len(adv)] for replay, adv in zip(mine, advantages)]
                per_agent[agent] = (mine, advantages, trained)
            for leader, group in self.update_groups.items():   # one step per group on all its agents' messages
                rows = [(g.prompt_ids, g.completion_ids, float(a)) for agent in group
                        for messages, adv in zip(per_agent[agent][2], per_agent[agent][1])
                        for g, a in zip(messages, adv)]
                metrics.update(self._update_agent(leader, turn, rows))
            for agent, (mine, advantages, trained) in per_agent.items():
                if not mine:
                    continue
                credits = [float(adv[0]) for adv in advantages]          # the transcript messages' credit
                values = torch.cat(advantages)
                own_rewards = [batch.transcripts[r.transcript].rewards[turn][agent] for r in mine]
                prefix = f"turn{turn}/{agent}"
                metrics.update({
                    f"{prefix}/reward_mean": float(np.mean(own_rewards)),
                    f"{prefix}/reward_std": float(np.std(own_rewards)),
                    f"{prefix}/credit_mean": float(np.mean(credits)),
                    f"{prefix}/credit_abs_mean": float(np.mean(np.abs(credits))),
                    f"{prefix}/outcome_spread": float(np.mean([max(r.outcomes) - min(r.outcomes) for r in mine])),
                    f"{prefix}/advantage_mean": float(values.mean()),
                    f"{prefix}/advantage_std": float(values.std()) if values.numel() > 1 else 0.0})
                metrics.update({f"{prefix}/{k}": v for k, v in sample_diagnostics(
                    [g for messages in trained for g in messages], advantages).items()})
            if replays:
                rewards = [batch.transcripts[r.transcript].rewards[turn] for r in replays]
                metrics[f"turn{turn}/joint_reward_mean"] = float(np.mean([v for r in rewards for v in r.values()]))
        return metrics

    def _update_agent(self, agent: str, turn: int, rows: list[tuple[list[int], list[int], float]]) -> dict[str, float]:
        cfg, optimizer = self.config, self.optimizers[agent]
        optimizer.zero_grad(set_to_none=True)
        total = int(self.distributed.sum([len(rows)])[0])     # M: this turn's samples of the agent over all processes
        loss_sum, kl_sum = 0.0, 0.0
        if cfg.kl_coef == 0 or cfg.kl_placement == "reward":   # zero-advantage samples add no gradient: skip them
            rows = [row for row in rows if row[2] != 0.0]
        for chunk, real in self.micro_batches(agent, rows, 0.0):      # sharded weights: the idle passes weigh 0
            weight = 1.0 if real else 0.0
            with self.accelerator.autocast():
                loss, kl = self.loss(agent, [r[0] for r in chunk], [r[1] for r in chunk],
                                     torch.tensor([r[2] for r in chunk]), total)
            self.accelerator.backward(loss * weight)
            loss_sum, kl_sum = loss_sum + weight * float(loss.detach()), kl_sum + weight * float(kl)
        # Σ over processes of the agent's gradients, clip, step (trainers.common.distributed)
        grad_norm, = self.distributed.optimizer_step([(optimizer, self.parameters[agent])], cfg.max_grad_norm)
        self.schedulers[agent].step()
        prefix = f"turn{turn}/{agent}"
        return {f"{prefix}/loss": loss_sum, f"{prefix}/kl": kl_sum, f"{prefix}/grad_norm": grad_norm}

    # ------------------------------------------------------------------ the loop
    def train(self) -> list[dict[str, Any]]:
        """Run (or resume) training up to ``max_steps``; returns the logged metrics of this call."""
        cfg = self.config
        if cfg.resume_from_checkpoint is not None:
            self.load(resolve_checkpoint(cfg.resume_from_checkpoint, cfg.output_dir))
        history = []
        bar = tqdm(range(self.step, cfg.max_steps), desc="magrpo",
                   disable=not (cfg.progress and self.distributed.is_main))
        for _ in bar:
            self.step += 1
            started = time.perf_counter()
            with (
                self.accelerator.autocast(),
                self.distributed.full_weights(),
            ):  # sharded weights are gathered for sampling
                batch = self.collect_counterfactual() if cfg.credit == "counterfactual" else self.collect()
            rollout_time = time.perf_counter() - started
            if cfg.credit == "counterfactual":
                metrics = self.update_counterfactual(batch)
                completions, tokens = batch.completions_sampled, batch.answer_tokens_sampled
                outcomes = [team_outcome(t.rewards, cfg.counterfactual_reward) for t in batch.transcripts]
                metrics.update({"joint_reward_mean": float(np.mean([r for t in batch.transcripts
                                                                    for r in t.rewards[0].values()])),
                                "team_outcome_mean": float(np.mean(outcomes))})
            else:
                for root in batch:
                    self.compute_returns(root)
                metrics = self.update(batch)
                sampled = [g for node in _walk(batch) for s in node.expansion.samples.values() for g in s]
                completions, tokens = len(sampled), sum(g.num_tokens for g in sampled)
                if cfg.reward_turns == "final":       # earlier turns' rewards are zeroed: report the episodes' ends
                    ended = [r for n in _walk(batch) for r, done in zip(n.joint_rewards, n.expansion.done) if done]
                    metrics["joint_reward_mean"] = float(np.mean(ended)) if ended else 0.0
                else:
                    metrics["joint_reward_mean"] = float(np.mean([r for n in batch for r in n.joint_rewards]))
            metrics.update({"tokens_per_s": tokens / max(rollout_time, 1e-9), "rollout_s": rollout_time,
                            "step_s": time.perf_counter() - started, "completions_sampled": completions,
                            "answer_tokens_sampled": tokens})
            # one record for the step: partial losses, throughputs and sample counts summed over processes, wall
            # times maxed
            metrics = self.distributed.merge_metrics(
                metrics, sums=("/loss", "/kl", "tokens_per_s", "completions_sampled", "answer_tokens_sampled"),
                maxima=("rollout_s", "step_s"))
            if cfg.eval_every and self.step % cfg.eval_every == 0:
                metrics.update({f"eval/{k}": v for k, v in self.evaluate().metrics().items()})
            if self.step % cfg.logging_every == 0:
                self.logger.log(metrics, self.step)
            history.append({"step": self.step, **metrics})
            bar.set_postfix(joint_reward=f"{metrics['joint_reward_mean']:.3f}")
            if (cfg.save_every and self.step % cfg.save_every == 0) or self.step == cfg.max_steps:
                self.save()
        return history

    def evaluate(self, num_tasks: int | None = None) -> EvalResult:
        """Play the held-out tasks (the first ``num_tasks`` of them) at ``eval_temperature``; team reward with its CI.

        Under ``accelerate launch`` each process plays its share of the tasks; every process gets all episodes.
        """
        tasks = self.eval_tasks[: num_tasks or len(self.eval_tasks)]
        if not tasks:
            raise ValueError("no held-out tasks: set eval_tasks >= 1 or pass eval_env")
        params = SamplingParams(max_new_tokens=self.config.max_new_tokens, temperature=self.config.eval_temperature,
                                top_p=self.config.top_p)
        seeds = [self.config.seed + i for i in range(len(tasks))]
        return evaluate_episodes(self.eval_engine, self.distributed, self.accelerator, tasks, seeds, params,
                                 report_path=eval_report_path(self.config.output_dir, self.step))

    # ------------------------------------------------------------------ checkpoints
    def save(self) -> None:
        """Write a checkpoint of the current step (main process only; every process's RNG states in it)."""
        process_rng = self.distributed.rng_states()
        # every process: sharded ones are gathered
        gathered = self.distributed.checkpoint_tensors(self.team, self.optimizers)
        if self.distributed.is_main:
            weights, optimizer_states, _ = gathered
            save_checkpoint(self.config.output_dir, self.step, self.team, self.optimizers, self.schedulers,
                            self.config.to_dict(), extra={"task_rng": self.task_rng.bit_generator.state},
                            process_rng=process_rng, tensors=(weights, optimizer_states), env=self.env)
        self.distributed.barrier()

    def load(self, path) -> None:
        """Restore the trainer from a checkpoint directory (every process reads it)."""
        state = load_checkpoint(path, self.team, self.optimizers, self.schedulers, process_index=self.distributed.rank,
                                num_processes=self.distributed.num_processes)
        self.step = state["step"]
        self.task_rng.bit_generator.state = state["extra"]["task_rng"]

    def latest_checkpoint(self):
        """The newest checkpoint under ``output_dir`` (``None`` if none)."""
        return latest_checkpoint(self.config.output_dir)


def _walk(roots: list[TreeNode]):
    stack = list(roots)
    while stack:
        node = stack.pop()
        yield node
        stack += [c for c in node.children if c is not None]
