"""Episodes per second of multi-turn debates with each agent's KV cache kept between turns, vs without.

Same backend, policy, tasks and run for both modes; the only difference is the policy's
``reuse_cache`` (the prompt of turn t+1 prefills only what it adds to turn t's prompt and answer).
Model loading and a short warm-up call are excluded from the timing; the episodes themselves go
through the shared rollout engine (:meth:`llm_marl.rollout.RolloutEngine.collect`), verification
included. ``--backend hf|llamacpp|both`` (default both, one after the other in one run).

    PYTHONPATH=. python benchmarks/rollout_reuse.py [--backend hf] [--threads 1] [--repeats 2]

Defaults: ``arithmetic_debate-v0`` test tasks 0..15, 16 episodes of 2 agents x 3 turns advanced
together (32 prompts per generate call), greedy, 48 new tokens, the embedded SmolLM2-135M: through HF
in fp32 with one LoRA adapter per agent (a mixed-adapter batch, as in training), and through
llama.cpp on its F16 weights (the library's default for the embedded model; one policy for both
seats, ``max_batch=32``, ``n_ctx=1024``); threads = cores. The script compares the greedy episodes
of both modes token for token: on HF they must be the same; on llama.cpp they can differ at
near-ties (float rounding, see ``llm_marl.backends.llamacpp``).

Each mode runs ``--repeats`` times (default 2), alternating which goes first, and its fastest run counts:
the first full rollout of a process pays for first-touched memory (see below), and until 2026-11-25 it
was always the one without reuse, which inflated every HF ratio below.

Goal: ratio >= 2. Each backend prints ``<backend> ratio=<episodes/s with reuse / without>``; the last
line is ``ratio=<the smaller of them>``.

Measured (2 cores, ``--threads 1``, the other core running a sampled evaluation; defaults otherwise;
``--backend hf`` and ``--backend llamacpp`` one after the other):

    backend   mode       episodes/s  time    prefill tokens (saved)  hits/partial/misses/shared  generated
    hf        reuse off  0.1918      83.4 s  15904                   0/0/96/0                    1390
    hf        reuse on   0.3916      40.9 s   6420 (9566)            64/0/0/32                   1390
    llamacpp  reuse off  0.2416      66.2 s  15904                   0/0/96/0                    1294
    llamacpp  reuse on   0.4570      35.0 s   6448 (9578)            64/0/0/32                   1388
    hf identical 96/96 agent turns, ratio=2.04; llamacpp identical 92/96, ratio=1.89

Re-measured on an Intel Xeon (family 6 model 207, AVX-512 with BF16/VNNI, AMX not exposed by the VM), 2
cores, ``--threads 1``, the other core idle (load ~1), after the llama.cpp prefill went to equal chunks:

    backend   mode       episodes/s  time    prefill tokens (saved)  hits/partial/misses/shared  generated
    hf        reuse off  0.2622      61.0 s  15904                   0/0/96/0                    1390
    hf        reuse on   0.5071      31.6 s   6420 (9566)            64/0/0/32                   1390
    llamacpp  reuse off  0.2337      68.5 s  15944                   0/0/96/0                    1388
    llamacpp  reuse on   0.4416      36.2 s   6448 (9578)            64/0/0/32                   1388
    hf identical 96/96 agent turns, ratio=1.93; llamacpp identical 96/96, ratio=1.89; ratio=1.89

After the HF prefill fixes of commit 5b4bc90 (contiguous rows into the output layer, LoRA ``B`` product
accumulated in place), same machine and command:

    hf        reuse off  0.2877      55.6 s  15904                   0/0/96/0                    1390
    hf        reuse on   0.5142      31.1 s   6420 (9566)            64/0/0/32                   1390
    llamacpp  reuse off  0.2325      68.8 s  15944                   0/0/96/0                    1388
    llamacpp  reuse on   0.4389      36.5 s   6448 (9578)            64/0/0/32                   1388
    hf identical 96/96 agent turns, ratio=1.79; llamacpp identical 96/96, ratio=1.89; ratio=1.79

After commit d1a0fc1 (HF policies make glibc keep freed memory: no page faults for reused activations),
same machine and command:

    hf        reuse off  0.3067      52.2 s  15904                   0/0/96/0                    1390
    hf        reuse on   0.5256      30.4 s   6420 (9566)            64/0/0/32                   1390
    llamacpp  reuse off  0.2174      73.6 s  15944                   0/0/96/0                    1388
    llamacpp  reuse on   0.4045      39.6 s   6448 (9578)            64/0/0/32                   1388
    hf identical 96/96 agent turns, ratio=1.71; llamacpp identical 96/96, ratio=1.86; ratio=1.71

After commit 9ce9c49 (HF policies store float32 linear weights input-major: decode steps at few rows
got 10-20% faster, prefill did not), same machine and command, load ~1:

    hf        reuse off  0.3034      52.7 s  15904                   0/0/96/0                    1390
    hf        reuse on   0.6111      26.2 s   6420 (9566)            64/0/0/32                   1390
    llamacpp  reuse off  0.2442      65.5 s  15944                   0/0/96/0                    1388
    llamacpp  reuse on   0.4474      35.8 s   6448 (9578)            64/0/0/32                   1388
    hf identical 96/96 agent turns, ratio=2.01; llamacpp identical 96/96, ratio=1.83; ratio=1.83

(An HF-only A/B of that change just before: 1.91 → 2.00.) HF meets the goal in this run; llama.cpp does
not: its decode steps (~200 ms for 32 sequences on F16 weights, one thread; BF16 and Q8_0 weights measured
no faster, 219 and 199 ms) and the rest of the rollout take ~16 s, which reuse cannot shorten, and ratio 2
needs them under ~9.5 s.

After commit 39f1328 (OpenMP workers spin briefly instead of sleeping at every barrier, see
``llm_marl.hardware.short_openmp_spin``; with commits 7f7eeb6 and 4cdffaf: env clones share one task list,
the reserved KV cache gathers rows in one copy), same machine, the default threads (2; the other core idle,
load 1.6-1.8), ``PYTHONPATH=. python benchmarks/rollout_reuse.py``:

    hf        reuse off  0.5529      28.9 s  15904                   0/0/96/0                    1390
    hf        reuse on   0.9902      16.2 s   6420 (9566)            64/0/0/32                   1390
    llamacpp  reuse off  0.4188      38.2 s  15944                   0/0/96/0                    1388
    llamacpp  reuse on   0.7853      20.4 s   6448 (9578)            64/0/0/32                   1388
    hf identical 96/96 agent turns, ratio=1.79; llamacpp identical 96/96, ratio=1.88; ratio=1.79

Both backends run 1.6-1.8x the episodes/s of the one-thread run above (llama.cpp on two threads with
passive waiting, measured the same morning: 0.2079 and 0.3993 episodes/s, 1.92, slower than one thread).
The ratios stay under the goal: two threads shorten the prefill more than the decode steps, which reuse
cannot save.

Prompt-lookup drafts (HF, greedy; ``llm_marl.backends.prompt_lookup``): each decode step also feeds the
tokens that followed the latest earlier occurrence of a row's last three tokens, and keeps those the model
agrees with. A debate's later answers mostly repeat the agent's earlier answer or the other agent's, so
the 84 decode steps of a rollout became 49 (952 drafts fed, 696 kept) with the same tokens; in-process
A/Bs put the reused rollout's decode phase at 8.1-9.2 s without drafts and 6.1-6.8 s with them. The same
day the timing order was made fair (``--repeats 2``, alternating), which showed that the earlier HF
ratios had been flattered by the first-rollout cost of the mode without reuse (28.4 s in a process's
first rollout, 24.0 s in its second). ``PYTHONPATH=. python benchmarks/rollout_reuse.py``, same Xeon,
2 threads, load 1.0-1.9:

    hf        reuse off  0.5641 / 0.6657  28.4 / 24.0 s   15904                   0/0/96/0   1390  49 decode steps
    hf        reuse on   1.1360 / 1.1334  14.1 / 14.1 s    6424 (9562)            64/0/0/32  1390  49 decode steps
    llamacpp  reuse off  0.4515 / 0.4441  35.4 / 36.0 s   15944                   0/0/96/0   1388
    llamacpp  reuse on   0.8538 / 0.8012  18.7 / 20.0 s    6448 (9578)            64/0/0/32  1388
    hf identical 96/96 agent turns, ratio=1.71; llamacpp identical 96/96, ratio=1.89; ratio=1.71

So the goal is met on neither backend: with the fair order HF is at 1.71. What reuse cannot save is now
mostly the prefill of each turn's new user message (~85 tokens per row, after a different prefix in
every row, at ~1.2 ms per token on 2 threads) and the decode steps at 32 rows, which are compute-bound.

Where the HF ratio stops (2026-11-25, same Xeon, 2 threads; ``/work/scratch/s33/store_prof.py``, the
rollout timed in one process, the modes alternated): reuse off 32.1 s (the process's first rollout) and
26.0 s, on 14.9 and 15.5 s, so 1.75; storing rows' keys and values for the next turn took 0.17-0.19 s of it.
Each turn's new message is 81-94 tokens in every row (the debate's instructions and the other agent's
answer: ~70 of them the same text in every row, after a different history, so no row can share another's
states), and every row and mode decodes the same 1390 tokens in the same 49 steps (~7 s). With prefill
time in proportion to its tokens (15904 against 6424), ratio 2 needs the decode phase under ~3.5 s: the
width-1 steps at 4-32 rows cost 68-120 ms (mostly streaming the fp32 weights once), the drafted steps
at 32 rows x 3-5 positions 0.24-0.53 s (compute). A faster prefill lowers the ratio (it helps the mode
without reuse more); only a faster decode raises it, and the decode is at those two limits.

HF lines now print each run's prefill and decode phases, and a line before the HF ratio says what the
decode phase would have to take for ratio 2 with the rest of each run as it was (:func:`decode_needed_line`).
``PYTHONPATH=. python benchmarks/rollout_reuse.py --backend hf`` right after (2 threads, load 1.2-1.5):

    hf        reuse off  0.5607 / 0.6143  28.5 / 26.0 s   prefill phase 21.7 / 18.8 s  decode phase 6.7 / 7.1 s
    hf        reuse on   1.1013 / 1.0892  14.5 / 14.7 s   prefill phase  7.7 /  7.6 s  decode phase 6.7 / 6.9 s
    hf decode phase 7.1 s without reuse, 6.7 s with it (the same tokens); the rest 19.0 and 7.8 s; ratio 2 needs
    it under 3.3 s
    hf identical 96/96 agent turns, ratio=1.79

Earlier: both HF modes got faster, the one without reuse more (it prefills 2.5x the tokens), so HF's ratio fell.
The goal is not met on this machine either. Fitting time = prefill tokens x p + the rest to the two HF runs
gives p ~3.1 ms and ~11.7 s for everything else (decode steps, ~60 ms each at any small batch for the fp32
weights, plus the env and the verifier), which reuse cannot shorten: ratio 2 needs that rest under ~9.5 s.

Reuse runs 60% fewer prompt tokens: every turn-1 and turn-2 prompt extends its agent's stored
sequence whole (answers are spliced in as sampled), and the turn-0 prompts of each agent share their
system message and instructions (41 of 69 tokens), prefilled once per agent (``shared``). What is
left: the rest of turn 0, each new user message (the other agent's answer and the instructions,
after a different prefix in every row), and the decode steps, which cost the same in both modes.
On llama.cpp the decode steps are ~35% of the reused rollout (fitting time = prefill tokens x p +
generated tokens x d to the two runs gives p ~3.4 ms, d ~9.5 ms), so its ratio is near the ceiling
of what reuse can save; 4 of 96 agent turns differ between the modes there (a greedy near-tie
flipped by rounding changes that answer and the turns after it). Earlier runs, before the shared
prefixes and the stacked LoRA product: HF 1.59-1.66, llama.cpp 1.70 (Q4_1, idle, 2 threads) and
2.28 (Q4_1, one thread under a load of 5-7).
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
from llm_marl.backends.hf import HFPolicy  # noqa: E402
from llm_marl.backends.llamacpp import LlamaCppPolicy  # noqa: E402
from llm_marl.backends.prefix_cache import CacheStats  # noqa: E402
from llm_marl.backends import llamacpp_weights  # noqa: E402
from llm_marl.models import load, tiny_model  # noqa: E402
from llm_marl.policy import SamplingParams  # noqa: E402
from llm_marl.rollout import RolloutEngine  # noqa: E402
from llm_marl.team import Team  # noqa: E402


def hf_team(model_name: str, num_agents: int, lora: bool, threads: int) -> Team:
    """The agents on one HF base (``"tiny"``: the random test model), one LoRA adapter each unless ``lora`` is off."""
    model, tokenizer = tiny_model(seed=0) if model_name == "tiny" else load(model_name, dtype=torch.float32)
    if lora:
        return Team.shared_lora(model, tokenizer, num_agents)
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
    parser.add_argument("--no-lora", action="store_true", help="HF: one plain policy instead of one LoRA adapter per agent")
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
