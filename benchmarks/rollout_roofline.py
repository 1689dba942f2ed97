"""Decode FLOP/s of a real multi-agent rollout through HF + LoRA adapters, as a fraction of this machine's peak.

The rollout is the training and evaluation path: a shared-LoRA team (one adapter per agent on the
embedded SmolLM2-135M in fp32) plays ``--episodes`` debates through :class:`~llm_marl.rollout.RolloutEngine`,
all episodes advanced together (``agents x episodes`` rows per generate call, as in a whole
held-out evaluation). Useful decode FLOPs are counted per generated token: ``2 x`` (non-embedding
weights + LM head + one LoRA adapter) plus attention ``4 x layers x attention width x context``, its
context being its prompt plus the tokens before it. Rows kept running after their EOS, padding,
prefill, env steps and verification all count as time, not FLOPs (``with_prefill`` adds the FLOPs of
the prompt tokens each turn adds to the agent's previous turn). Peak is the best of several
2048 and 4096 square fp32 products on the same threads, measured before and after the rollout
(the CPU is shared: the best reading is the machine's). Model loading and a warm-up are untimed.

    nice -n 19 env PYTHONPATH=. python benchmarks/rollout_roofline.py [--compare-before] [--llamacpp-episodes 8]

``--compare-before`` first runs the same rollout with ``HFPolicy.grouped_lora`` and ``drop_finished_rows``
off (PEFT's own ``adapter_names`` mixed-batch forward, finished rows decoded to the end) and reports
both episodes/s and whether greedy episodes came out token for token the same. ``--llamacpp-episodes`` plays that many episodes with the llama.cpp
backend on the embedded model (its F16 weights, the library's default; the FLOP count is the same
model's, not fp32 work) and prints its figure as an extra line.

Goal: ratio >= 0.5. The last line is ``ratio=<decode FLOP/s of the HF rollout / peak fp32 matmul FLOP/s>``.
The line before it times each decode step (module hooks, :class:`DecodeSteps`): ``best_step_fraction`` is the
FLOP/s of the one-position steps at the most rows over peak, every row counted. Steps at fewer rows only
lower the decode phase's figure, so that is the most a rollout made of such steps can reach on the machine.

Measured on an AMD EPYC with AVX-512, 2 cores, load ~1 (the library chose 1 thread; defaults):

    peak_fp32_matmul=113.1 GFLOP/s (before the rollout)
    hf after  0.9504 episodes/s  67.3 s  generated_tokens=3409  decode_phase=15.8 s 61.02 GFLOP/s
        prefill_phase=50.2 s 14448 tokens 62.52 GFLOP/s  whole_rollout=60.93 GFLOP/s
        (decode FLOPs alone over the whole time: 14.31)
    peak_fp32_matmul=118.1 GFLOP/s (best of before and after)
    fractions of peak: decode_phase=0.517 prefill_phase=0.529 whole_rollout=0.526 (model time only)
    llamacpp ratio=0.131 (1.2049 episodes/s, 15.49 GFLOP/s, 364 tokens, 6.6 s, threads 2, Q4 weights)
    ratio=0.517

The same command on an Intel Xeon (family 6 model 207, AVX-512 with two FMA units, 2 cores; the library
chose 1 thread), three commits (0fca591; 5b4bc90: the output layer gets contiguous rows and the stacked
LoRA accumulates its ``B`` product in place; d1a0fc1: HF policies make glibc keep freed memory, and the
llama.cpp line runs on the HF line's threads, where it took the free cores before):

    commit   peak GFLOP/s  episodes/s  decode phase         prefill phase (14448 tok)  fractions decode/prefill/whole  llama.cpp
    0fca591  165.7         0.9081      19.4 s 49.56 GFLOP/s  48.8 s 64.32 GFLOP/s      0.299 / 0.388 / 0.363           0.044 (2 threads)
    5b4bc90  166.6         1.0523      17.2 s 56.12 GFLOP/s  41.3 s 75.94 GFLOP/s      0.337 / 0.456 / 0.421           0.041 (2 threads)
    d1a0fc1  166.7         1.1249      17.1 s 56.52 GFLOP/s  37.6 s 83.51 GFLOP/s      0.339 / 0.501 / 0.450           0.037 (1 thread)

(``generated_tokens=3409`` in each; the last line was ``ratio=`` the decode fraction.) What is left in the
decode phase here: fitting its time to steps and rows gives ~90 ms per step at any small batch (the
540 MB of fp32 weights streamed once per step, at ~6 GB/s on one thread of this VM) plus ~3 ms per row
and step; with answers of ~13 tokens on average and up to 40, most of the ~80 steps run few rows. At
128 rows and a 155-token context a step takes ~480 ms (``torch.profiler``): the layers' weight products
47% (at ~115 GFLOP/s), the LM head 13%, attention over the fp32 KV cache 30% (~900 MB read per step,
bandwidth-bound; transformers already packs GQA heads for one-token queries), small ops the rest.

After commit 9ce9c49 (HF policies store float32 linear weights input-major, see
``llm_marl.backends.hf.set_weight_layout``), same machine, ``--llamacpp-episodes 8`` (the library chose 1
thread): peak 170.7 GFLOP/s, 1.0872 episodes/s, decode phase 15.2 s (63.25 GFLOP/s), prefill phase 41.4 s
(75.85 GFLOP/s), fractions 0.371 / 0.444 / 0.424, llama.cpp 0.037, ``ratio=0.371``. An A/B of that change
alone (``--threads 1 --llamacpp-episodes 0``, back to back): decode phase 16.8 → 15.1 s (0.325 → 0.368),
prefill phase 40.0 → 41.5 s (the tied embedding's row lookups become strided gathers), 1.085 and 1.089
episodes/s.

After commits 7f7eeb6 (env clones share one task list: each episode's clone regenerated the 500
problems, ~30 ms) and 4cdffaf (the reserved KV cache gathers kept rows into buffers with room in one copy),
same machine and command (the library chose 1 thread, load 1.7): peak 168.5 GFLOP/s, 1.1651 episodes/s
(was 1.0872), decode phase 14.0 s (68.83 GFLOP/s), prefill phase 40.7 s (77.11 GFLOP/s), fractions
0.409 / 0.458 / 0.445, llama.cpp 0.037, ``ratio=0.409``. Where the decode phase goes (2-turn rollout, 64
episodes, one thread, instrumented in ``/work/scratch/s31``): forwards 12.4-13.1 s, storing dropped rows'
KV for the next turn ~0.8 s, row gathers 0.24-0.52 s. In the forwards: weight products ~59% (at ~120
GFLOP/s for 128 rows), attention ~23% (reading the fp32 KV cache at ~7-8 GB/s, ~half of what one thread
streams; float instead of boolean masks and packed GQA heads, faster in isolation, measured no faster in
the model), copies of new keys and values into the reserved room ~7%. Of 49 decode steps 21 run 128
rows and 28 run 36 or fewer, at ~90-180 ms each. The first full rollout of a process also pays ~7.7 s
of first-touched memory (437k page faults, against 10k in a second rollout: 57 vs 48 s), nearly all of
it in the prefill; this benchmark times that first rollout.

With prompt-lookup drafts in the HF decode (2026-11-25, ``llm_marl.backends.prompt_lookup``; same machine and
command, the library chose 1 thread, load 1.1-1.4): peak 175.3 GFLOP/s, 1.1646 episodes/s, decode phase 14.2 s
(67.79 GFLOP/s), prefill phase 40.5 s, fractions 0.387 / 0.442 / 0.428, llama.cpp 0.036, ``ratio=0.387``.
Drafts do not move this figure: the first answers of 128 rows have little to copy (drafts after a 3-token
match are kept ~70% of the time, but few rows have one), and a wider step at 128 rows is compute-bound
(one thread: 395 ms at width 1, 931 ms at width 2), so the step-width choice keeps these steps one wide.
In-process A/Bs of the rollout: decode phase 13.5-13.8 s without drafts, 13.7-14.3 s with them.

So the goal holds on the EPYC, not on this Xeon: its peak is 40% higher, while the model's small products
(576- and 1536-wide, 128 rows at most) run no faster than there.

Why no scheduling of rows reaches 0.5 on this Xeon (2026-11-25, one thread, scripts in ``/work/scratch/s33``):
the rollout's best step is already at about half of peak. A 128-row decode step of the LoRA team (150 tokens
of context, ``torch.profiler``) took 417-447 ms: ``aten::mm`` 244 ms (the 421 products at ~140 GFLOP/s; the
same shapes alone run at 160-175), the CPU flash-attention kernel 130 ms (31%: 0.9 GB of fp32 keys and
values per step, read from memory at ~7 GB/s; the same kernel on cache-resident keys and values takes 2.3-2.5
ms per layer, not 4.3), small ops the rest. Its FLOPs (128 x 0.277 GFLOP) come to 0.49-0.51 of a 162 GFLOP/s
peak; a 256-row step (782 ms) to 0.56. In the default rollout the decode phase (15.2 s) was 21 such 128-row
steps (9.4 s), 27 steps of 4-94 rows (4.1 s: the answers of 40 tokens outlive the average of 13) and 1.7 s
outside the forwards (storing finished rows' keys and values for the next turn 0.7 s, the step loop), so even
continuous batching that kept every step full would land at ~0.5. Twice the rows (``--episodes 128``, 256
per call): 1.1468 episodes/s, decode phase 28.4 s, ``ratio=0.414`` (peak 165.7). Keys and values in half
precision would shorten the attention, not change the picture: the same kernel over 30 layers of 128 rows,
caches cold, took 122.6 ms in fp32, 105.0 in fp16, 89.0 in bf16 (and would change the results). And bf16
products run at about half the fp32 speed on this CPU (``[128, 576] x [576, 1536]``: 83 against 171 GFLOP/s).

The script prints that ceiling now (``best_step_fraction``). The default command, the library choosing 2
threads (load 0.4): peak 332.5 GFLOP/s, 2.0327 episodes/s, decode phase 10.6 s (0.275), 21 steps at 128 rows
of 279 ms, ``best_step_fraction=0.390``, 27 steps at fewer rows 3.1 s, llama.cpp 0.035, ``ratio=0.275``.
``--threads 1 --llamacpp-episodes 0`` right after: peak 170.2, 1.0977 episodes/s, decode phase 15.0 s
(0.377), 128-row steps of 440 ms, ``best_step_fraction=0.483``, fewer rows 4.2 s, ``ratio=0.377``.

The last line's denominator changed with that run: decode FLOPs over the decode phase's time (the
issue's 0.11/0.22 baselines were generate-only), where the earlier figure below divided them by the
whole rollout's time.

Earlier, before stacked LoRA and shared prefixes (2 AVX2 cores shared with other jobs,
``--compare-before --threads 1 --llamacpp-episodes 4``, defaults otherwise; load ~2.0 throughout):

    peak_fp32_matmul=73.5 GFLOP/s (before the rollout)
    hf before 0.3514 episodes/s  182.1 s  generated_tokens=3409  decode=5.29 GFLOP/s  with_prefill=34.83 GFLOP/s
    hf after  0.4072 episodes/s  157.2 s  generated_tokens=3409  decode=6.13 GFLOP/s  with_prefill=40.37 GFLOP/s
    identical_episodes=True
    peak_fp32_matmul=81.0 GFLOP/s (best of before and after)
    llamacpp ratio=0.031 (0.2084 episodes/s, 2.53 GFLOP/s, 172 tokens, 19.2 s, threads 1, Q4 weights)
    ratio=0.076

The goal is not met, and decode is not where the time goes: answers average ~13 tokens, so the
prompts' prefill (every turn-0 prompt, and each turn's new user message) is most of the model's
FLOPs; the rollout as a whole runs at ~0.5 of peak. What is left in decode: a step at 64-128 rows is
~2/3 matmul (at the speed of the same product outside the model), ~15% attention, the rest small ops.
"""
from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from pathlib import Path

from llm_marl.hardware import short_openmp_spin  # noqa: E402

short_openmp_spin()   # the library's OpenMP wait (a short spin), before torch or llama.cpp start their runtime

import torch  # noqa: E402

import llm_marl_envs  # noqa: E402
from llm_marl.backends.prefix_cache import CacheStats, common_prefix_length  # noqa: E402
from llm_marl.hardware import free_cores  # noqa: E402
from llm_marl.models import load  # noqa: E402
from llm_marl.policy import SamplingParams  # noqa: E402
from llm_marl.rollout import RolloutEngine  # noqa: E402
from llm_marl.team import Team  # noqa: E402


def peak_matmul_flops(sizes=(2048, 4096), repeats: int = 3) -> float:
    """Best fp32 FLOP/s of ``repeats`` square products of each size, on the current torch threads."""
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b
        for _ in range(repeats):
            began = time.perf_counter()
            a @ b
            best = max(best, 2 * n ** 3 / (time.perf_counter() - began))
    return best


def weight_flops_per_token(policy) -> float:
    """``2 x`` (weights a token passes through): non-embedding ones, the LM head and one LoRA adapter."""
    model = policy.model
    base = model.get_base_model() if policy.is_peft else model
    config = base.config
    params = sum(p.numel() for n, p in base.named_parameters() if "lora_" not in n)
    embedding = base.get_input_embeddings().weight.numel()
    head = config.vocab_size * config.hidden_size
    tied = base.get_output_embeddings().weight is base.get_input_embeddings().weight
    weights = params - embedding + (head if tied else 0)
    adapters = policy.adapter_names
    if adapters:
        weights += sum(p.numel() for n, p in base.named_parameters() if f".{adapters[0]}." in n)
    return 2.0 * weights


def prefill_flops_per_token(policy) -> float:
    """``2 x`` (non-embedding weights + one LoRA adapter): a prompt token's weight FLOPs (no LM head: only the last
    prompt position's logits are computed; attention not counted, so prefill figures are a slight undercount)."""
    base = policy.model.get_base_model() if policy.is_peft else policy.model
    head = base.config.vocab_size * base.config.hidden_size
    return weight_flops_per_token(policy) - 2.0 * head


def attention_flops(config, context: int) -> float:
    """FLOPs of one token's attention over ``context`` positions (scores and weighted values, every layer)."""
    width = config.num_attention_heads * getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)
    return 4.0 * config.num_hidden_layers * width * context


def decode_flops(episodes, per_token: float, config) -> tuple[float, float, int]:
    """``(decode FLOPs, prefill FLOPs, generated tokens)`` of the episodes' agent turns.

    Prefill counts only the prompt tokens past what the agent's previous turn (prompt + answer) already
    covered: the positions a policy keeping KV between turns runs.
    """
    decode = prefill = 0.0
    tokens = 0
    for episode in episodes:
        before: dict[str, list[int]] = {}
        for turn in episode.turns:
            for agent, step in turn.items():
                prompt, generated = len(step.prompt_ids), len(step.completion_ids)
                tokens += generated
                decode += sum(per_token + attention_flops(config, prompt + k) for k in range(generated))
                kept = min(common_prefix_length(before.get(agent, []), step.prompt_ids), prompt - 1)
                prefill += sum(per_token + attention_flops(config, k + 1) for k in range(kept, prompt - 1))
                before[agent] = list(step.prompt_ids) + list(step.completion_ids)
    return decode, prefill, tokens


class DecodeSteps:
    """Times each decode step of a policy's model through module hooks: ``(rows, positions per row, mean context,
    seconds)``. A decode step is a forward that asks for logits at every position it is fed (``logits_to_keep``
    equal to its width); a prefill asks for the last position's only."""

    def __init__(self, model) -> None:
        self.steps: list[tuple[int, int, float, float]] = []
        self._current: tuple[int, int, float, float] | None = None
        self._handles = [model.register_forward_pre_hook(self._before, with_kwargs=True),
                         model.register_forward_hook(self._after, with_kwargs=True)]

    def _before(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids")
        self._current = None
        if ids is not None and kwargs.get("logits_to_keep") == ids.shape[1]:
            context = float(kwargs["attention_mask"].sum(-1).float().mean())   # real tokens, padding left out
            self._current = (ids.shape[0], ids.shape[1], context, time.perf_counter())

    def _after(self, module, args, kwargs, output) -> None:
        if self._current is not None:
            rows, width, context, began = self._current
            self.steps.append((rows, width, context, time.perf_counter() - began))
            self._current = None

    def close(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()

    def best_step_summary(self, per_token: float, config, peak: float) -> str:
        """The one-position steps at the most rows: their FLOP/s over ``peak`` (every row counted, finished ones
        too), the most a decode phase made of such steps could reach; and the time of the steps at fewer rows."""
        single = [step for step in self.steps if step[1] == 1]
        if not single:
            return "decode steps: none one position wide"
        rows = max(step[0] for step in single)
        full = [step for step in single if step[0] == rows]
        flops = sum(r * (per_token + attention_flops(config, round(context))) for r, _, context, _ in full)
        seconds = sum(step[3] for step in full)
        fewer = [step for step in self.steps if step[0] < rows]
        return (f"decode steps: {len(self.steps)}; {len(full)} at {rows} rows x 1 position, "
                f"{1000 * seconds / len(full):.0f} ms each, {flops / seconds / 1e9:.2f} GFLOP/s = "
                f"best_step_fraction={flops / seconds / peak:.3f} (the most a decode phase of such steps reaches); "
                f"{len(fewer)} steps at fewer rows took {sum(step[3] for step in fewer):.1f} s of the phase")


def trajectory(episodes) -> list:
    """Every agent turn's prompt and completion ids (greedy runs must agree token for token)."""
    return [(t.prompt_ids, t.completion_ids) for e in episodes for turn in e.turns for t in turn.values()]


def timed_collect(engine: RolloutEngine, tasks: list[int]):
    """``(episodes, seconds)`` of one collect over ``tasks``."""
    began = time.perf_counter()
    episodes = engine.collect(task_indices=tasks)
    return episodes, time.perf_counter() - began


def main() -> None:
    """Measure peak, run the rollout(s), print FLOP/s ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="arithmetic_debate-v0")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--num-agents", type=int, default=2)
    parser.add_argument("--num-turns", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the free cores at start)")
    parser.add_argument("--compare-before", action="store_true",
                        help="first time the rollout as HFPolicy ran it before: PEFT's adapter_names path, finished "
                             "rows kept in the batch (grouped_lora and drop_finished_rows off)")
    parser.add_argument("--llamacpp-episodes", type=int, default=8, help="episodes for the llama.cpp line (0: skip)")
    args = parser.parse_args()
    threads = args.threads or free_cores()
    torch.set_num_threads(threads)
    model, tokenizer = load("smollm2-135m", dtype=torch.float32)
    team = Team.shared_lora(model, tokenizer, args.num_agents)
    policy = next(iter(team.policies()))
    policy.threads = threads
    env = llm_marl_envs.make(args.env, num_agents=args.num_agents, num_turns=args.num_turns, split="test")
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0)
    engine = RolloutEngine(env, team, params, progress=False)
    tasks = list(range(args.episodes))
    print(f"env={args.env} episodes={args.episodes} agents={args.num_agents} turns={args.num_turns} "
          f"max_new_tokens={args.max_new_tokens} rows_per_call={args.episodes * args.num_agents} threads={threads} "
          f"cores={os.cpu_count()} load={os.getloadavg()[0]:.1f}", flush=True)
    peak = peak_matmul_flops()
    print(f"peak_fp32_matmul={peak / 1e9:.1f} GFLOP/s (before the rollout) load={os.getloadavg()[0]:.1f}", flush=True)
    engine.collect(task_indices=[0], params=replace(params, max_new_tokens=2))   # warm-up, untimed
    per_token, config = weight_flops_per_token(policy), policy.model.config

    runs, clocks = {}, {}
    for grouped in ([False, True] if args.compare_before else [True]):
        policy.grouped_lora = policy.drop_finished_rows = grouped
        policy.prefill_seconds = policy.decode_seconds = 0.0
        policy.cache_stats = CacheStats()
        clock = DecodeSteps(policy.model)
        episodes, seconds = timed_collect(engine, tasks)
        clock.close()
        clocks[grouped] = clock
        decode, _, tokens = decode_flops(episodes, per_token, config)
        prefill = policy.cache_stats.prefill_tokens * prefill_flops_per_token(policy)
        runs[grouped] = episodes, decode / policy.decode_seconds
        print(f"hf {'after ' if grouped else 'before'} {args.episodes / seconds:.4f} episodes/s  {seconds:.1f} s  "
              f"generated_tokens={tokens}  decode_phase={policy.decode_seconds:.1f} s "
              f"{decode / policy.decode_seconds / 1e9:.2f} GFLOP/s  prefill_phase={policy.prefill_seconds:.1f} s "
              f"{policy.cache_stats.prefill_tokens} tokens {prefill / policy.prefill_seconds / 1e9:.2f} GFLOP/s  "
              f"whole_rollout={(decode + prefill) / seconds / 1e9:.2f} GFLOP/s "
              f"(decode FLOPs alone over the whole time: {decode / seconds / 1e9:.2f})  load={os.getloadavg()[0]:.1f}",
              flush=True)
    if args.compare_before:
        print(f"identical_episodes={trajectory(runs[True][0]) == trajectory(runs[False][0])}")
    peak = max(peak, peak_matmul_flops())
    print(f"peak_fp32_matmul={peak / 1e9:.1f} GFLOP/s (best of before and after) load={os.getloadavg()[0]:.1f}")
    episodes, _ = runs[True]
    decode, _, _ = decode_flops(episodes, per_token, config)
    prefill = policy.cache_stats.prefill_tokens * prefill_flops_per_token(policy)
    print(f"fractions of peak: decode_phase={runs[True][1] / peak:.3f} "
          f"prefill_phase={prefill / policy.prefill_seconds / peak:.3f} "
          f"whole_rollout={(decode + prefill) / (policy.prefill_seconds + policy.decode_seconds) / peak:.3f} "
          f"(model time only)")
    print(clocks[True].best_step_summary(per_token, config, peak))

    if args.llamacpp_episodes:
        from llm_marl.backends import load_policy

        llama = load_policy("llamacpp", "smollm2-135m", seed=0, n_threads=threads)   # the HF line's threads
        llama_team = Team.from_policies({agent: llama for agent in env.possible_agents})
        llama_engine = RolloutEngine(env, llama_team, params, progress=False)
        llama_engine.collect(task_indices=[0], params=replace(params, max_new_tokens=2))
        episodes, seconds = timed_collect(llama_engine, tasks[:args.llamacpp_episodes])
        decode, _, tokens = decode_flops(episodes, per_token, config)
        print(f"llamacpp ratio={decode / seconds / peak:.3f} ({args.llamacpp_episodes / seconds:.4f} episodes/s, "
              f"{decode / seconds / 1e9:.2f} GFLOP/s, {tokens} tokens, {seconds:.1f} s, threads "
              f"{getattr(llama, 'n_threads', '?')}, weights {Path(llama.model_path).name}) "
              f"load={os.getloadavg()[0]:.1f}")

    print(f"ratio={runs[True][1] / peak:.3f}")


if __name__ == "__main__":
    main()
