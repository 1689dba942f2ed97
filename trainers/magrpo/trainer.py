"""MAGRPO: multi-agent group-relative policy optimisation (CoMLRL), readable top to bottom.

One training step:

1. **collect** — pick ``prompts_per_step`` tasks; each is the root of a tree. At every turn all
   live nodes are expanded together (:meth:`RolloutEngine.expand`: G samples per agent per
   node, one generate call per policy): ``aligned`` joint actions pair the g-th samples
   (G children), ``cross`` takes the Cartesian product (G^N children). Each joint action
   steps its own clone of the env, which supplies the next prompts (feedback).
   With ``early_termination_threshold`` set, a node whose mean joint reward exceeds it is not
   expanded further (CoMLRL; ``early_termination="joint_action"`` stops branch by branch).
2. **compute_returns** — joint reward r = mean over agents of the env rewards (:meth:`MAGRPOTrainer.shape_rewards`
   is where the experimental options change it); bottom-up ``R = r + γ · mean(R of the child's joint actions)``
   (leaves: R = r).
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

The loop, evaluation, checkpoints, seeding and optimizers are the shell's
(:class:`trainers.common.trainer.Trainer`); this module is the step (:meth:`MAGRPOTrainer.run_step`).
Experimental options (counterfactual credit, incentives on the tree, final-turn rewards, n-gram-free
sampling) subclass it in :mod:`trainers.experimental`.

Every step logs what it sampled: ``completions_sampled`` and ``answer_tokens_sampled`` (over all processes).

Under ``accelerate launch`` (:mod:`trainers.common.distributed`) each process expands its share of
the step's ``prompts_per_step`` trees, ``M`` in the loss is the GLOBAL sample count of the turn and
agent, and each agent's gradients are summed over processes before its optimizer step: N
processes make the update one process would make on the whole batch.
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator

from llm_marl.policy import SamplingParams
from llm_marl.rollout import Expansion, RolloutEngine
from llm_marl.team import Team
from llm_marl_envs.core import TextEnv

from ..common.losses import kl_per_token, sequence_means
from ..common.trainer import Trainer
from .config import MAGRPOConfig


@dataclass
class TreeNode:
    """One expanded node of the MAGRPO tree at ``turn``."""

    turn: int
    expansion: Expansion
    joint_rewards: list[float]                                  # r per joint action
    children: list[TreeNode | None] = field(default_factory=list)  # expansion of each joint action's child
    returns: list[float] = field(default_factory=list)          # R per joint action


def group_advantages(values: torch.Tensor, mode: str, normalize: bool = False, std_floor: float = 1e-4) -> torch.Tensor:
    """Group-relative advantages of G values (see the module docstring for the modes).

    A group whose values agree to rounding (e.g. three rewards of 0.1, whose mean is not exactly 0.1) has exactly
    zero advantages in every relative mode: it carries no signal, and normalising would only scale rounding noise.
    """
    g = values.numel()
    if mode in ("mean", "rloo", "max") and g > 1:
        scale = float(values.abs().max())
        if float(values.max() - values.min()) <= 4 * g * torch.finfo(values.dtype).eps * max(1.0, scale):
            return torch.zeros_like(values)
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


class MAGRPOTrainer(Trainer):
    """Trains a :class:`Team` on a :class:`TextEnv` with MAGRPO (see the module docstring)."""

    name = "magrpo"
    batch_field = "prompts_per_step"
    progress_metric = "final_joint_reward_mean"

    def __init__(self, env: TextEnv, team: Team, config: MAGRPOConfig | None = None, *,
                 eval_env: TextEnv | None = None, accelerator: Accelerator | None = None) -> None:
        config = config or MAGRPOConfig()
        self.task_rng = np.random.default_rng(config.seed)   # the same on every process: draws the global batch
        super().__init__(env, team, config, eval_env=eval_env, accelerator=accelerator)
        self.sampling = self.sampling_params()
        self.engine = RolloutEngine(env, team, self.sampling, progress=False)

    def sampling_params(self) -> SamplingParams:
        """Sampling settings of the training rollouts."""
        cfg = self.config
        return SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p)

    def build_optimizers(self) -> None:
        """One AdamW per update group at its agents' learning rate, each with ``lr_scheduler`` over the run's
        optimizer steps (one per turn per step)."""
        cfg = self.config
        self.add_agent_optimizers(cfg.agent_learning_rates,
                                  schedule=(cfg.lr_scheduler, cfg.warmup_steps, cfg.max_steps * self.env.num_turns))

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
                node = TreeNode(turn, expansion, self.shape_rewards(expansion, joint_rewards),
                                children=[None] * len(joint_rewards))
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

    def stops_here(self, joint_rewards: Sequence[float]) -> bool:
        """Early termination: whether rewards stop the expansion (node mean > threshold, or one branch >= it)."""
        threshold = self.config.early_termination_threshold
        if threshold is None:
            return False
        if self.config.early_termination == "node_mean":
            return len(joint_rewards) > 1 and float(np.mean(joint_rewards)) > threshold
        return joint_rewards[0] >= threshold

    # ------------------------------------------------------------------ 2. returns
    def shape_rewards(self, expansion: Expansion, joint_rewards: list[float]) -> list[float]:
        """The reward r of each joint action of ``expansion`` in the tree: its joint reward (the experimental
        trainer adds incentives or keeps only the episode's end)."""
        return joint_rewards

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
        for node in walk_tree(roots):
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
        return {f"{prefix}/loss": loss_sum, f"{prefix}/kl": kl_sum, f"{prefix}/grad_norm": grad_norm,
                f"{prefix}/updated_samples": float(len(rows))}

    # ------------------------------------------------------------------ the step
    def run_step(self, step: int) -> dict[str, float]:
        """Steps 1-4 on this step's trees; the step's metrics, merged over processes."""
        started = time.perf_counter()
        with self.accelerator.autocast(), self.distributed.full_weights():   # sharded weights gathered for sampling
            roots = self.collect()
        rollout_time = time.perf_counter() - started
        for root in roots:
            self.compute_returns(root)
        metrics = self.update(roots)
        metrics["joint_reward_mean"] = self.joint_reward_mean(roots)
        metrics["final_joint_reward_mean"] = self.final_joint_reward_mean(roots)
        sampled = [g for node in walk_tree(roots) for s in node.expansion.samples.values() for g in s]
        return self.step_metrics(metrics, started, rollout_time, len(sampled), sum(g.num_tokens for g in sampled))

    def joint_reward_mean(self, roots: list[TreeNode]) -> float:
        """The step's headline reward: the mean joint reward of its root nodes (turn 0)."""
        return float(np.mean([r for n in roots for r in n.joint_rewards]))

    def final_joint_reward_mean(self, roots: list[TreeNode]) -> float:
        """The mean joint reward of the step's joint actions that end an episode (shown on the progress bar: on an
        env that pays only the last turn, the turn-0 reward is always 0)."""
        ended = [r for node in walk_tree(roots) for r, done in zip(node.joint_rewards, node.expansion.done) if done]
        return float(np.mean(ended)) if ended else 0.0

    def step_metrics(self, metrics: dict[str, float], started: float, rollout_time: float, completions: int,
                     tokens: int) -> dict[str, float]:
        """``metrics`` with the step's throughput and sample counts, as one record merged over processes."""
        metrics.update({"tokens_per_s": tokens / max(rollout_time, 1e-9), "rollout_s": rollout_time,
                        "step_s": time.perf_counter() - started, "completions_sampled": completions,
                        "answer_tokens_sampled": tokens})
        # partial losses, throughputs and sample counts summed over processes, wall times maxed
        return self.distributed.merge_metrics(
            metrics, sums=("/loss", "/kl", "/updated_samples", "tokens_per_s", "completions_sampled",
                           "answer_tokens_sampled"),
            maxima=("rollout_s", "step_s"))

    # ------------------------------------------------------------------ checkpoints
    def extra_state(self) -> dict[str, Any]:
        """The task sampler's state (the global batch of the next steps)."""
        return {"task_rng": self.task_rng.bit_generator.state}

    def load_extra_state(self, extra: Mapping[str, Any], path: Path) -> None:
        """Restore the task sampler."""
        if "task_rng" not in extra:
            raise ValueError(f"{path} is not a MAGRPO checkpoint (no task sampler state); resume it with the "
                             f"trainer that wrote it")
        self.task_rng.bit_generator.state = extra["task_rng"]


def walk_tree(roots: list[TreeNode]) -> Iterator[TreeNode]:
    """Every node of the trees under ``roots`` (depth first)."""
    stack = list(roots)
    while stack:
        node = stack.pop()
        yield node
        stack += [c for c in node.children if c is not None]


__all__ = ["MAGRPOTrainer", "TreeNode", "group_advantages", "sample_diagnostics", "sample_values", "walk_tree"]
