"""Entry point of the multi-process tests, run under ``accelerate launch`` (or plainly, as one process).

    accelerate launch --multi_gpu --num_processes 2 tests/ddp_worker.py OUT JOB [JOB ...]

Jobs run in order, each with a fresh trainer on the same tiny model and toy env:

- ``update``: one ``MAGRPOTrainer.update`` on the pre-collected batch ``OUT/batch.pkl`` (tree roots),
  each process taking its shard of the roots; writes ``OUT/update-rank<r>.pt`` (gradients left by
  the update, trainable weights, fingerprint). ``fsdp-update``: the same with the weights sharded
  (``fsdp=True``), into ``OUT/fsdp-update-rank<r>.pt``; ``fsdp-train`` / ``fsdp-resume`` likewise.
- ``fsdp-agent-devices``: builds a sharded trainer with ``agent_devices``; writes the error to
  ``OUT/fsdp-agent-devices-rank<r>.txt``.
- ``train:NAME:STEPS``: train ``STEPS`` steps into ``OUT/NAME`` (checkpoint every step);
  ``resume:NAME:STEPS`` continues ``OUT/NAME`` from its latest checkpoint. Both write
  ``OUT/NAME/rank<r>.json`` (weights fingerprint, tasks this process collected) and, on the main
  process, ``OUT/NAME/weights.pt``.
- ``mappo-update``: MAPPO's advantage pass and one update on this process's shard of the
  pre-collected responses ``OUT/mappo-batch.pkl``; writes ``OUT/mappo-update-rank<r>.pt``. ``mappo-fused-update``:
  the same with one epoch of one minibatch (the critic runs once); writes ``OUT/mappo-fused-update-rank<r>.pt``.
- ``mappo-train:NAME:STEPS``: MAPPO training into ``OUT/NAME``; writes ``OUT/NAME/rank<r>.json``.
  ``mappo-fsdp-update``, ``mappo-fsdp-train`` and ``mappo-fsdp-resume``: the same with sharded weights.

Every process initialises the LoRA adapters from its OWN seed (rank), so replicas only agree if the
trainer synchronises them.
"""
from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from llm_marl.models import tiny_model
from llm_marl.sharding import full_tensor
from llm_marl.team import Team
from tests.toy_env import SayNumberEnv
from trainers.magrpo import MAGRPOConfig, MAGRPOTrainer
from trainers.mappo import MAPPOConfig, MAPPOTrainer


class RecordingTrainer(MAGRPOTrainer):
    """A MAGRPO trainer that remembers which tasks this process expanded."""

    collected: list[list[str]]

    def collect(self):
        roots = super().collect()
        self.collected = getattr(self, "collected", []) + [[r.expansion.node.task["task_id"] for r in roots]]
        return roots


def rank() -> int:
    """This process's index under the launcher (0 when run plainly)."""
    import os

    return int(os.environ.get("RANK", "0"))


def build_trainer(output_dir: str | Path, max_steps: int = 3, resume: bool = False, init_seed: int | None = None,
                  **overrides) -> RecordingTrainer:
    """The tests' trainer: 2 agents sharing a tiny base (one LoRA each), 2 turns, 3 prompts per step."""
    torch.set_num_threads(1)
    model, tokenizer = tiny_model(seed=0)
    torch.manual_seed(rank() if init_seed is None else init_seed)   # LoRA A matrices differ per process
    team = Team.adapter_per_agent(model, tokenizer, 2)
    settings = dict(num_generations=3, max_new_tokens=6, max_steps=max_steps, prompts_per_step=3, micro_batch_size=4,
                    save_every=1, eval_tasks=2, learning_rate=5e-3, kl_coef=0.05, output_dir=str(output_dir),
                    report_to=("jsonl",), resume_from_checkpoint="latest" if resume else None, progress=False, seed=1)
    settings.update(overrides)
    return RecordingTrainer(SayNumberEnv(num_turns=2), team, MAGRPOConfig(**settings))


def trainable(trainer: MAGRPOTrainer) -> dict[str, torch.Tensor]:
    """Every agent's trainable tensors, keyed ``agent/name``."""
    return {f"{a}/{n}": t for a in trainer.agents
            for n, t in trainer.team.policy(a).trainable_state_dict(trainer.team.adapter(a)).items()}


def gradients(named: dict[str, torch.nn.Parameter]) -> dict[str, torch.Tensor]:
    """The gradients the parameters hold (those of the last optimizer step), ``None`` entries left out."""
    return {name: p.grad.detach().clone() for name, p in named.items() if p.grad is not None}


def adapter_parameters(model, adapters) -> dict[str, torch.nn.Parameter]:
    """The LoRA parameters of ``adapters`` on a PEFT model, keyed ``adapter/name``."""
    return {f"{a}/{n}": p for a in adapters for n, p in model.named_parameters() if f".{a}." in n}


def strip_envs(roots):
    """Tree roots without their env objects (the update needs samples, rewards and returns only)."""
    import dataclasses

    for node in roots:
        node.expansion = dataclasses.replace(node.expansion, node=None, children=[], infos=[])
        strip_envs([c for c in node.children if c is not None])
    return roots


def build_mappo(output_dir: str | Path, max_steps: int = 2, init_seed: int | None = None, fsdp: bool = False,
                resume: bool = False, env=None, **overrides) -> MAPPOTrainer:
    """2 agents x 2 turns of arithmetic debate (or ``env``) on a tiny shared base, scored by a tiny learned
    verifier; ``overrides``: other config fields."""
    import llm_marl_envs
    from verifiers.reward_model import RewardModel

    torch.set_num_threads(1)
    model, tokenizer = tiny_model(seed=0)
    torch.manual_seed(rank() if init_seed is None else init_seed)
    team = Team.adapter_per_agent(model, tokenizer, agents=2)
    verifier_lm, verifier_tokenizer = tiny_model(seed=1)
    verifier = RewardModel.from_causal_lm(verifier_lm, verifier_tokenizer, seed=1, max_length=96)
    if env is None:
        env = llm_marl_envs.make("arithmetic_debate-v0", num_agents=2, num_turns=2, num_tasks=20, split="train")
    settings = dict(max_new_tokens=6, episodes_per_step=3, minibatch_size=5, ppo_epochs=2, learning_rate=1e-3,
                    critic_learning_rate=1e-3, max_steps=max_steps, output_dir=str(output_dir), progress=False,
                    report_to=("jsonl",), eval_tasks=2, alpha1=0.5, beta1=0.5, fsdp=fsdp,
                    resume_from_checkpoint="latest" if resume else None)
    config = MAPPOConfig(**{**settings, **overrides})
    return MAPPOTrainer(env, team, config, verifier=verifier)


def mappo_trainable(trainer: MAPPOTrainer) -> dict[str, torch.Tensor]:
    """Every actor's adapter and the critic (adapter + value head), keyed ``owner/name``."""
    weights = {f"{a}/{n}": t for a in trainer.agents
               for n, t in trainer.team.policy(a).trainable_state_dict(trainer.team.adapter(a)).items()}
    weights.update({f"critic/{n}": t for n, t in trainer.critic.trainable_state_dict().items()})
    return weights


def run_mappo_update(out: Path, batch_file: Path, fsdp: bool = False, fused: bool = False) -> dict:
    """Advantages and one PPO update (all epochs and minibatches) on this process's shard of the responses;
    ``fused``: one epoch of one minibatch, so the critic runs once (``fused_critic_pass``)."""
    name = "mappo-fsdp-update-run" if fsdp else "mappo-fused-update-run" if fused else "mappo-update-run"
    one_pass = {"ppo_epochs": 1, "minibatch_size": 12} if fused else {}
    trainer = build_mappo(out / name, max_steps=1, fsdp=fsdp, **one_pass)
    responses = trainer.distributed.shard(pickle.loads(batch_file.read_bytes()))
    fuses = trainer.fuses_critic_pass(responses)
    with trainer.distributed.full_weights():
        stats = trainer.compute_advantages(responses)
    trainer.update(responses, step=1)
    weights = mappo_trainable(trainer)
    named = adapter_parameters(trainer.critic.policy.model, [*trainer.agents, trainer.critic.adapter])
    named.update({f"head/{n}": p for n, p in trainer.critic.head.named_parameters()})
    grads = {name: full_tensor(g) for name, g in gradients(named).items()}
    return {"gradients": grads, "weights": weights, "fingerprint": trainer.distributed.fingerprint(weights.values()),
            "sharded": sorted(name for name, p in named.items() if isinstance(p, DTensor)),
            "responses": len(responses),
            "advantages": [r.advantages for r in responses], "num_processes": trainer.distributed.num_processes,
            "stats": stats, "fused": fuses}


def run_update(out: Path, batch_file: Path, fsdp: bool = False) -> dict:
    """One update on this process's shard of the pre-collected roots; returns what it left (whole tensors)."""
    trainer = build_trainer(out / ("fsdp-update-run" if fsdp else "update-run"), max_steps=1, fsdp=fsdp)
    roots = pickle.loads(batch_file.read_bytes())
    trainer.update(trainer.distributed.shard(roots))
    weights = trainable(trainer)
    named = adapter_parameters(trainer.team.policy("agent_0").model, trainer.agents)
    grads = {name: full_tensor(g) for name, g in gradients(named).items()}
    return {"gradients": grads, "weights": weights, "fingerprint": trainer.distributed.fingerprint(weights.values()),
            "num_processes": trainer.distributed.num_processes, "roots": len(trainer.distributed.shard(roots)),
            "sharded": sorted(name for name, p in named.items() if isinstance(p, DTensor)),
            "local_numel": sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in named.values()),
            "numel": sum(p.numel() for p in named.values())}


def run_training(out: Path, name: str, steps: int, resume: bool, fsdp: bool = False) -> None:
    """Train (or resume) ``OUT/NAME`` to ``steps``; write this process's report."""
    trainer = build_trainer(out / name, max_steps=steps, resume=resume, fsdp=fsdp)
    trainer.train()
    weights = trainable(trainer)
    evaluation = trainer.evaluate()                  # the 2 held-out tasks, one per process
    report = {"rank": trainer.distributed.rank, "num_processes": trainer.distributed.num_processes,
              "step": trainer.step, "fingerprint": trainer.distributed.fingerprint(weights.values()),
              "tasks": getattr(trainer, "collected", []),
              "eval_rewards": evaluation.rewards}
    (out / name / f"rank{trainer.distributed.rank}.json").write_text(json.dumps(report))
    if trainer.distributed.is_main:
        torch.save(weights, out / name / "weights.pt")


def run_mappo_training(out: Path, name: str, steps: int, fsdp: bool = False, resume: bool = False) -> None:
    """MAPPO training (or its resumption) into ``OUT/NAME``; writes this process's report (and, main, the weights)."""
    trainer = build_mappo(out / name, max_steps=steps, fsdp=fsdp, resume=resume)
    trainer.train()
    weights = mappo_trainable(trainer)
    evaluation = trainer.evaluate()
    report = {"rank": trainer.distributed.rank, "num_processes": trainer.distributed.num_processes,
              "step": trainer.step, "fingerprint": trainer.distributed.fingerprint(weights.values()),
              "history": trainer.history,           # the run's records, those its checkpoint restored included
              "eval_tasks": [e["task_id"] for e in evaluation.episodes]}
    (out / name / f"rank{trainer.distributed.rank}.json").write_text(json.dumps(report))
    if trainer.distributed.is_main:
        torch.save(weights, out / name / "weights.pt")


def main() -> None:
    out, jobs = Path(sys.argv[1]), sys.argv[2:]
    for job in jobs:
        if job in ("update", "fsdp-update"):
            result = run_update(out, out / "batch.pkl", fsdp=job == "fsdp-update")
            torch.save(result, out / f"{job}-rank{rank()}.pt")
        elif job == "fsdp-agent-devices":               # refused: sharding and per-agent placement exclude each other
            try:
                build_trainer(out / job, fsdp=True, agent_devices={"agent_0": "cpu"})
                message = "accepted"
            except ValueError as err:
                message = str(err)
            (out / f"{job}-rank{rank()}.txt").write_text(message)
        elif job in ("mappo-update", "mappo-fsdp-update", "mappo-fused-update"):
            result = run_mappo_update(out, out / "mappo-batch.pkl", fsdp="fsdp" in job, fused="fused" in job)
            torch.save(result, out / f"{job}-rank{rank()}.pt")
        elif job.startswith("mappo-"):                 # mappo-train, mappo-fsdp-train, mappo-fsdp-resume
            kind, name, steps = job.split(":")
            run_mappo_training(out, name, int(steps), fsdp="fsdp" in kind, resume=kind.endswith("resume"))
        else:
            kind, name, steps = job.split(":")       # train, resume, fsdp-train or fsdp-resume
            run_training(out, name, int(steps), resume=kind.endswith("resume"), fsdp=kind.startswith("fsdp-"))


if __name__ == "__main__":
    main()
