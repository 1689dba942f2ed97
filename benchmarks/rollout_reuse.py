"""Episodes per second of multi-turn debates with each agent's KV cache kept between turns, vs without.

    PYTHONPATH=. python benchmarks/rollout_reuse.py [--backend hf] [--threads 1] [--repeats 2]

Same backend, policy, tasks and run for both modes; the only difference is the policy's
``reuse_cache`` (the prompt of turn t+1 prefills only what it adds to turn t's prompt and answer).
Model loading and a short warm-up call are excluded from the timing; the episodes themselves go
through the shared rollout engine (:meth:`llm_marl.rollout.RolloutEngine.collect`), verification
included. ``--backend hf|llamacpp|both`` (default both, one after the other in one run).

Defaults: ``arithmetic_debate-v0`` test tasks 0..15, 16 episodes of 2 agents x 3 turns advanced
together (32 prompts per generate call), greedy, 48 new tokens, the embedded SmolLM2-135M: through HF
in fp32 with one LoRA adapter per agent (a mixed-adapter batch, as in training), and through
llama.cpp on its F16 weights (the library's default for the embedded model; one policy for both
seats, ``max_batch=32``, ``n_ctx=1024``); threads = cores. The script compares the greedy episodes
of both modes token for token: on HF they must be the same; on llama.cpp they can differ at
near-ties (float rounding, see ``llm_marl.backends.llamacpp``).

Each mode runs ``--repeats`` times (default 2), alternating which goes first, and its fastest run
counts: the first full rollout of a process pays for first-touched memory.

Printed per run: episodes/s, time, prompt tokens prefilled (and saved by reuse), cache hits, partial
hits, misses and shared prefixes, generated tokens, and on HF the decode steps and the prefill and
decode phases. Before the HF ratio, a line says what the decode phase (the same tokens in both modes)
would have to take for ratio 2 with the rest of each run as it was (:func:`decode_needed_line`):
reuse saves prefill, never decode steps, so a faster prefill lowers the ratio and only a faster decode
raises it.

Goal: ratio >= 2. Each backend prints ``<backend> ratio=<episodes/s with reuse / without>``; the last
line is ``ratio=<the smaller of them>``. The current figures, with their command, date, commit and
machine, are on the documentation's Performance page (``docs/performance.md``).
"""
from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace

from llm_marl.hardware import short_openmp_spin  # noqa: E402

short_openmp_spin()   # the library's OpenMP wait (a short spin), before torch or llama.cpp start their runtime

import torch  # noqa: E402

import llm_marl_envs  # noqa: E402
from llm_marl.backends import llamacpp_weights  # noqa: E402
from llm_marl.backends.hf import HFPolicy  # noqa: E402
from llm_marl.backends.llamacpp import LlamaCppPolicy  # noqa: E402
from llm_marl.backends.prefix_cache import CacheStats  # noqa: E402
from llm_marl.models import load, tiny_model  # noqa: E402
from llm_marl.policy import SamplingParams  # noqa: E402
from llm_marl.rollout import RolloutEngine  # noqa: E402
from llm_marl.team import Team  # noqa: E402


def hf_team(model_name: str, num_agents: int, lora: bool, threads: int) -> Team:
    """The agents on one HF base (``"tiny"``: the random test model), one LoRA adapter each unless ``lora`` is off."""
    model, tokenizer = tiny_model(seed=0) if model_name == "tiny" else load(model_name, dtype=torch.float32)
    if lora:
        return Team.adapter_per_agent(model, tokenizer, num_agents)
    policy = HFPolicy(model, tokenizer)                  # one policy for every seat: one batched call per turn
    return Team.from_policies({f"agent_{i}": policy for i in range(num_agents)})


def llamacpp_team(model_name: str, num_agents: int, lora: bool, threads: int) -> Team:
    """The agents on one llama.cpp policy over ``model_name`` (embedded name: F16 weights, as the library runs it;
    or a .gguf path); no LoRA."""
    policy = LlamaCppPolicy(llamacpp_weights(model_name), n_ctx=1024, max_batch=32, n_threads=threads)
    return Team.from_policies({f"agent_{i}": policy for i in range(num_agents)})


BACKENDS = {"hf": hf_team, "llamacpp": llamacpp_team}


DRAFT_COUNTERS = ("decode_steps", "draft_tokens_fed", "draft_tokens_accepted")   # HFPolicy's
PHASE_SECONDS = ("prefill_seconds", "decode_seconds")                              # HFPolicy's too


def set_reuse(team: Team, on: bool) -> None:
    """Switch KV reuse on or off for every policy of the team, and zero its counters."""
    for policy in team.policies():
        policy.reuse_cache = on
        policy.cache_stats = CacheStats()
        for name in DRAFT_COUNTERS + PHASE_SECONDS:
            if hasattr(policy, name):
                setattr(policy, name, 0)


def stats(team: Team) -> CacheStats:
    """The team's reuse counters, summed over its policies."""
    total = CacheStats()
    for policy in team.policies():
        for name, value in policy.cache_stats.as_dict().items():
            setattr(total, name, getattr(total, name) + value)
    return total


def measure(backend: str, args: argparse.Namespace) -> float:
    """Time the episodes with reuse off and on, alternating, on ``backend``; print each run and return the ratio."""
    team = BACKENDS[backend](args.model, args.num_agents, not args.no_lora, args.threads)
    env = llm_marl_envs.make(args.env, num_agents=args.num_agents, num_turns=args.num_turns, split="test")
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0)
    engine = RolloutEngine(env, team, params, progress=False)
    lora = not args.no_lora and backend == "hf"
    print(f"env={args.env} backend={backend} model={args.model} lora={lora} "
          f"episodes={args.episodes} parallel={args.parallel or args.episodes} agents={args.num_agents} "
          f"turns={args.num_turns} max_new_tokens={args.max_new_tokens} threads={args.threads} "
          f"cores={os.cpu_count()} load={os.getloadavg()[0]:.1f}")
    engine.collect(task_indices=[0], params=replace(params, max_new_tokens=2))   # warm-up, untimed
    results, trajectories, phases = {}, {}, {}
    for repeat in range(args.repeats):       # alternating order; each mode's fastest run counts (the first
        for reuse in ((False, True) if repeat % 2 == 0 else (True, False)):   # rollout of a process is slower)
            set_reuse(team, reuse)
            began = time.perf_counter()
            episodes = engine.collect(task_indices=list(range(args.episodes)), parallel=args.parallel)
            elapsed = time.perf_counter() - began
            prefill, decode = (sum(getattr(p, name, 0.0) for p in team.policies()) for name in PHASE_SECONDS)
            if args.episodes / elapsed > results.get(reuse, 0.0):
                results[reuse] = args.episodes / elapsed
                phases[reuse] = (elapsed, prefill, decode)
            trajectories[reuse] = [(t.prompt_ids, t.completion_ids) for e in episodes for turn in e.turns
                                   for t in turn.values()]
            counts = stats(team)
            generated = sum(e.num_tokens for e in episodes)
            steps, fed, kept = (sum(getattr(p, name, 0) for p in team.policies()) for name in DRAFT_COUNTERS)
            drafted = ""
            if backend == "hf":
                drafted = (f"decode_steps={steps} drafts_fed={fed} drafts_kept={kept} "
                           f"prefill_phase={prefill:.1f} s decode_phase={decode:.1f} s ")
            print(f"{backend} reuse={'on ' if reuse else 'off'} {args.episodes / elapsed:.4f} episodes/s  "
                  f"{elapsed:.1f} s  prefill_tokens={counts.prefill_tokens} saved={counts.prefill_tokens_saved} "
                  f"hits={counts.hits} partial={counts.partial} misses={counts.misses} shared={counts.shared} "
                  f"shared_prefixes={counts.shared_prefixes} generated_tokens={generated} "
                  f"{drafted}load={os.getloadavg()[0]:.1f}", flush=True)
    same = sum(a == b for a, b in zip(trajectories[True], trajectories[False]))
    print(f"{backend} identical_episodes={trajectories[True] == trajectories[False]} "
          f"identical_agent_turns={same}/{len(trajectories[False])}")
    ratio = results[True] / results[False]
    print(f"{backend} best of {args.repeats}: reuse off {results[False]:.4f}, on {results[True]:.4f} episodes/s")
    if backend == "hf":
        print(decode_needed_line(phases[False], phases[True]))
    print(f"{backend} ratio={ratio:.2f}")
    for policy in team.policies():
        getattr(policy, "close", lambda: None)()
    return ratio


def decode_needed_line(off: tuple[float, float, float], on: tuple[float, float, float], goal: float = 2.0) -> str:
    """What the decode phase, which reuse cannot shorten, would have to take for ``goal``.

    ``off``/``on``: ``(seconds, prefill seconds, decode seconds)`` of each mode's fastest run. With the rest of
    each run fixed, ``(rest_off + d) / (rest_on + d) = goal`` gives ``d = (rest_off - goal x rest_on) / (goal - 1)``.
    """
    (whole_off, _, decode_off), (whole_on, _, decode_on) = off, on
    rest_off, rest_on = whole_off - decode_off, whole_on - decode_on
    needed = (rest_off - goal * rest_on) / (goal - 1)
    verdict = (f"ratio {goal:g} needs it under {needed:.1f} s" if needed > 0
               else f"ratio {goal:g} is out of reach even with no decode time")
    return (f"hf decode phase {decode_off:.1f} s without reuse, {decode_on:.1f} s with it (the same tokens); the rest "
            f"{rest_off:.1f} and {rest_on:.1f} s; {verdict}")


def main() -> None:
    """Time both modes on each backend asked for; the last line is the smaller ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="arithmetic_debate-v0")
    parser.add_argument("--backend", default="both", choices=[*sorted(BACKENDS), "both"])
    parser.add_argument("--model", default="smollm2-135m", help='embedded name, local path, or "tiny" (HF test model)')
    parser.add_argument(
        "--no-lora", action="store_true", help="HF: one plain policy instead of one LoRA adapter per agent"
    )
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--parallel", type=int, default=None, help="episodes advanced together (default: all)")
    parser.add_argument("--num-agents", type=int, default=2)
    parser.add_argument("--num-turns", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--repeats", type=int, default=2,
                        help="timed runs of each mode, alternating which goes first; the fastest of each counts")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    backends = sorted(BACKENDS) if args.backend == "both" else [args.backend]
    ratios = [measure(backend, args) for backend in backends]
    print(f"ratio={min(ratios):.2f}")


if __name__ == "__main__":
    main()
