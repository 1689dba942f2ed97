"""Where one MAPPO step of ``examples/mappo_debate.py`` spends its time, phase by phase.

    PYTHONPATH=. python benchmarks/mappo_step_profile.py --threads 1
    PYTHONPATH=. python benchmarks/mappo_step_profile.py --tiny --steps 2        # the code path, in seconds

Builds the example's team and config (SmolLM2-135M-Instruct fp32, one LoRA adapter per agent, the
critic's adapter and head; ``arithmetic_debate-v0``, 2 agents x 2 turns, 40 new tokens, T 0.7,
``--episodes-per-step`` debates, ppo_epochs 1, minibatch 8), runs ``--steps`` training steps (model
loading excluded) and prints, per step, the wall and CPU seconds of its phases (``collect``,
``compute_rewards``, ``compute_advantages``, ``update``; the trainer logs the same as ``time/*``) and a
finer split measured by wrapping the calls the phases make:

- ``actor logp``: ``HFPolicy.token_logprobs`` under an agent's adapter (the loss forward, and log π_old
  where the sampler did not provide it),
- ``ref logp``: the same under the reference (adapters disabled),
- ``critic values``: ``CentralizedCritic.values`` (advantage pass and value loss),
- ``backward``: ``accelerator.backward`` of the actor and critic losses,
- ``optimizer``: clip and AdamW steps of every adapter and the head.

On a shared machine wall time depends on the load (printed beside it); with ``--threads 1`` the CPU
seconds do much less, so compare those between runs. The script runs with the library's OpenMP wait,
a short spin (:func:`llm_marl.hardware.short_openmp_spin`), as the ``llm-marl`` CLI does; set
``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` to choose another. The current figures, with their command,
date, commit and machine, are on the documentation's Performance page (``docs/performance.md``).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import os
import time

from llm_marl.hardware import short_openmp_spin

short_openmp_spin()   # the library's OpenMP wait (a short spin), before torch starts its runtime

import torch  # noqa: E402


class PhaseClock:
    """Sums of wall seconds and call counts per named phase, filled by wrapped callables."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.cpu: dict[str, float] = collections.defaultdict(float)
        self.calls: dict[str, int] = collections.defaultdict(int)

    @contextlib.contextmanager
    def timing(self, name: str):
        start, start_cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start
            self.cpu[name] += time.process_time() - start_cpu
            self.calls[name] += 1

    def wrap(self, owner, attribute: str, name_of) -> None:
        """Replace ``owner.attribute`` by a timed call of itself; ``name_of(*args, **kwargs)`` names the phase."""
        inner = getattr(owner, attribute)

        def timed(*args, **kwargs):
            with self.timing(name_of(*args, **kwargs)):
                return inner(*args, **kwargs)

        setattr(owner, attribute, timed)

    def reset(self) -> None:
        self.seconds.clear()
        self.cpu.clear()
        self.calls.clear()


def build(args):
    """``(trainer, model name)`` with the example's settings (tiny random model with ``--tiny``)."""
    import llm_marl_envs
    from llm_marl.models import load, tiny_model
    from llm_marl.team import Team
    from trainers.mappo import MAPPOConfig, MAPPOTrainer

    torch.manual_seed(args.seed)
    model, tokenizer = tiny_model(seed=0) if args.tiny else load("smollm2-135m")
    team = Team.adapter_per_agent(model, tokenizer, agents=2, name="tiny" if args.tiny else "smollm2-135m")
    env = llm_marl_envs.make("arithmetic_debate-v0", num_agents=2, num_turns=2, split="train")
    eval_env = llm_marl_envs.make("arithmetic_debate-v0", num_agents=2, num_turns=2, split="test")
    config = MAPPOConfig(
        max_steps=args.steps, episodes_per_step=args.episodes_per_step, max_new_tokens=args.max_new_tokens,
        ppo_epochs=args.ppo_epochs, minibatch_size=args.minibatch_size, learning_rate=1e-4,
        critic_learning_rate=1e-4, kl_coef=0.02, temperature=0.7, reward_gamma=0.3, alpha1=0.2, beta1=0.2,
        eval_tasks=4, output_dir=args.out, seed=args.seed, save_every=0, progress=False, report_to=("jsonl",))
    return MAPPOTrainer(env, team, config, eval_env=eval_env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1, help="training steps to time")
    parser.add_argument("--episodes-per-step", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--ppo-epochs", type=int, default=1)
    parser.add_argument("--minibatch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tiny", action="store_true", help="a tiny random model instead of SmolLM2 (checks the script)"
    )
    parser.add_argument("--out", default="outputs/mappo_step_profile")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    trainer = build(args)
    clock = PhaseClock()
    for agent in trainer.agents:       # one policy object per shared base: wrap each distinct one once
        policy = trainer.team.policy(agent)
        if not getattr(policy, "_profiled", False):
            clock.wrap(policy, "token_logprobs",
                       lambda *a, reference=False, **k: "ref logp" if reference else "actor logp")
            policy._profiled = True
    clock.wrap(trainer.critic, "values", lambda *a, **k: "critic values")
    clock.wrap(trainer.accelerator, "backward", lambda *a, **k: "backward")
    clock.wrap(trainer.distributed, "optimizer_step", lambda *a, **k: "optimizer")
    captured: list = []
    compute_rewards = trainer.compute_rewards

    def keep_responses(episodes):
        captured[:] = compute_rewards(episodes)
        return captured

    trainer.compute_rewards = keep_responses
    phases = PhaseClock()              # the step's phases, timed here too (wall and CPU seconds)
    for method in ("collect", "compute_rewards", "compute_advantages", "update"):
        phases.wrap(trainer, method, lambda *a, _name=method, **k: _name)
    print(f"threads {torch.get_num_threads()}  OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}  "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    for _ in range(args.steps):
        clock.reset()
        phases.reset()
        metrics = trainer.train_step()
        mean = lambda values: sum(values) / max(len(values), 1)    # noqa: E731
        print(
            f"step {int(metrics['step'])}: {len(captured)} responses; tokens per response: prompt "
            f"{mean([len(r.prompt_ids) for r in captured]):.0f}, "
            f"completion {mean([len(r.completion_ids) for r in captured]):.0f}, "
            f"critic context {mean([len(r.critic_ids) for r in captured]):.0f}; load {os.getloadavg()[0]:.2f}"
        )
        print(f"  {'phase':<22} {'wall s':>8} {'CPU s':>8}")
        for name in phases.seconds:
            print(f"  {name:<22} {phases.seconds[name]:8.2f} {phases.cpu[name]:8.2f}")
        print(f"  {'step':<22} {sum(phases.seconds.values()):8.2f} {sum(phases.cpu.values()):8.2f}")
        for name in sorted(clock.seconds, key=clock.seconds.get, reverse=True):
            print(f"    {name:<20} {clock.seconds[name]:8.2f} {clock.cpu[name]:8.2f}  ({clock.calls[name]} calls)")
        logged = {k: round(v, 2) for k, v in metrics.items() if k.startswith("time/")}
        print(f"  logged: {logged}" if logged else "  logged: no time/* metrics", flush=True)
        print(flush=True)


if __name__ == "__main__":
    main()
