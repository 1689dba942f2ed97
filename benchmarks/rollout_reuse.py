"""Episodes per second of multi-turn debates with each agent's KV cache kept between turns, vs without.

Same backend, policy, tasks and run for both modes; the only difference is ``HFPolicy.reuse_cache``
(the prompt of turn t+1 prefills only what it adds to turn t's prompt and answer). Model loading
and a short warm-up call are excluded from the timing; the episodes themselves go through the
shared rollout engine (:meth:`llm_marl.rollout.RolloutEngine.collect`), verification included.

    nice -n 19 env PYTHONPATH=. python benchmarks/rollout_reuse.py

Defaults: ``arithmetic_debate-v0`` test tasks 0..15, 16 episodes of 2 agents x 3 turns advanced
together (32 prompts per generate call), greedy, 48 new tokens, the embedded SmolLM2-135M in fp32
through HF with one LoRA adapter per agent (a mixed-adapter batch, as in training), torch threads =
cores. Greedy episodes must come out token for token the same in both modes: the script checks it.

Goal: ratio >= 2. The last line is ``ratio=<episodes/s with reuse / episodes/s without>``.

Measured (2 cores, one of them busy with a training run, so ``--threads 1``; defaults otherwise):

    mode       episodes/s  time    prefill tokens (saved)  hits/partial/misses  generated tokens
    reuse off  0.113       141.5 s 15904                   0/0/96               1390
    reuse on   0.204        78.4 s  7598 (8306)            64/0/32              1390
    identical_episodes=True, ratio=1.81

The goal is not met. Reuse halves the prompt tokens run (every turn-1 and turn-2 prompt extends its
agent's stored sequence whole: answers are spliced in as sampled); what is left is turn 0 (32 rows of
~69 tokens, no store yet), each new user message (the other agent's answer and the instructions, which
follow a different prefix in every row), and the decode steps, which cost the same in both modes.
"""
from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # no spinning OpenMP workers on a shared CPU

import torch  # noqa: E402

import llm_marl_envs  # noqa: E402
from llm_marl.backends.hf import HFPolicy  # noqa: E402
from llm_marl.backends.prefix_cache import CacheStats  # noqa: E402
from llm_marl.models import load, tiny_model  # noqa: E402
from llm_marl.policy import SamplingParams  # noqa: E402
from llm_marl.rollout import RolloutEngine  # noqa: E402
from llm_marl.team import Team  # noqa: E402


def hf_team(model_name: str, num_agents: int, lora: bool) -> Team:
    """The agents on one HF base (``"tiny"``: the random test model), one LoRA adapter each unless ``lora`` is off."""
    model, tokenizer = tiny_model(seed=0) if model_name == "tiny" else load(model_name, dtype=torch.float32)
    if lora:
        return Team.shared_lora(model, tokenizer, num_agents)
    policy = HFPolicy(model, tokenizer)                  # one policy for every seat: one batched call per turn
    return Team.from_policies({f"agent_{i}": policy for i in range(num_agents)})


# TODO(llama.cpp): add a "llamacpp" entry once LlamaCppPolicy keeps per-sequence state between calls
# (llama_state_seq_get_data / set_data, or one context sequence per agent kept alive and extended), with
# a `reuse_cache` switch like HFPolicy's; the timing loop below only needs `set_reuse` and `stats` from it.
BACKENDS = {"hf": hf_team}


def set_reuse(team: Team, on: bool) -> None:
    """Switch KV reuse on or off for every policy of the team, and zero its counters."""
    for policy in team.policies():
        policy.reuse_cache = on
        policy.cache_stats = CacheStats()


def stats(team: Team) -> CacheStats:
    """The team's reuse counters, summed over its policies."""
    total = CacheStats()
    for policy in team.policies():
        for name, value in policy.cache_stats.as_dict().items():
            setattr(total, name, getattr(total, name) + value)
    return total


def main() -> None:
    """Time both modes and print the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="arithmetic_debate-v0")
    parser.add_argument("--backend", default="hf", choices=sorted(BACKENDS))
    parser.add_argument("--model", default="smollm2-135m", help='embedded name, local path, or "tiny" (test model)')
    parser.add_argument("--no-lora", action="store_true", help="one plain policy instead of one LoRA adapter per agent")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--parallel", type=int, default=None, help="episodes advanced together (default: all)")
    parser.add_argument("--num-agents", type=int, default=2)
    parser.add_argument("--num-turns", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    team = BACKENDS[args.backend](args.model, args.num_agents, not args.no_lora)
    env = llm_marl_envs.make(args.env, num_agents=args.num_agents, num_turns=args.num_turns, split="test")
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0)
    engine = RolloutEngine(env, team, params, progress=False)
    print(f"env={args.env} backend={args.backend} model={args.model} lora={not args.no_lora} "
          f"episodes={args.episodes} parallel={args.parallel or args.episodes} agents={args.num_agents} "
          f"turns={args.num_turns} max_new_tokens={args.max_new_tokens} threads={args.threads} "
          f"cores={os.cpu_count()} load={os.getloadavg()[0]:.1f}")
    engine.collect(task_indices=[0], params=replace(params, max_new_tokens=2))   # warm-up, untimed
    results, trajectories = {}, {}
    for reuse in (False, True):
        set_reuse(team, reuse)
        began = time.perf_counter()
        episodes = engine.collect(task_indices=list(range(args.episodes)), parallel=args.parallel)
        elapsed = time.perf_counter() - began
        results[reuse] = args.episodes / elapsed
        trajectories[reuse] = [[(t.prompt_ids, t.completion_ids) for t in turn.values()]
                               for e in episodes for turn in e.turns]
        counts = stats(team)
        generated = sum(e.num_tokens for e in episodes)
        print(f"reuse={'on ' if reuse else 'off'} {results[reuse]:.4f} episodes/s  {elapsed:.1f} s  "
              f"prefill_tokens={counts.prefill_tokens} saved={counts.prefill_tokens_saved} "
              f"hits={counts.hits} partial={counts.partial} misses={counts.misses} "
              f"generated_tokens={generated} load={os.getloadavg()[0]:.1f}")
    print(f"identical_episodes={trajectories[True] == trajectories[False]}")
    print(f"ratio={results[True] / results[False]:.2f}")


if __name__ == "__main__":
    main()
