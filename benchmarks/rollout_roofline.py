"""Decode FLOP/s of a real multi-agent rollout through HF + LoRA adapters, as a fraction of this machine's peak.

    PYTHONPATH=. python benchmarks/rollout_roofline.py [--threads 1] [--compare-before] [--llamacpp-episodes 8]

The rollout is the training and evaluation path: a shared-LoRA team (one adapter per agent on the
embedded SmolLM2-135M in fp32) plays ``--episodes`` debates through :class:`~llm_marl.rollout.RolloutEngine`,
all episodes advanced together (``agents x episodes`` rows per generate call, as in a whole held-out
evaluation). Useful decode FLOPs are counted per generated token: ``2 x`` (non-embedding weights + LM
head + one LoRA adapter) plus attention ``4 x layers x attention width x context``, its context being
its prompt plus the tokens before it. Rows kept running after their EOS, padding, prefill, env steps
and verification all count as time, not FLOPs (``with_prefill`` adds the FLOPs of the prompt tokens
each turn adds to the agent's previous turn). Peak is the best of several 2048 and 4096 square fp32
products on the same threads, measured before and after the rollout (the CPU is shared: the best
reading is the machine's). Model loading and a warm-up are untimed.

``--compare-before`` first runs the same rollout with ``HFPolicy.grouped_lora`` and ``drop_finished_rows``
off (PEFT's own ``adapter_names`` mixed-batch forward, finished rows decoded to the end) and reports
both episodes/s and whether greedy episodes came out token for token the same. ``--llamacpp-episodes``
plays that many episodes with the llama.cpp backend on the embedded model (its F16 weights, the
library's default; the FLOP count is the same model's, not fp32 work) and prints its figure as an
extra line.

Printed: the peak, episodes/s, the decode and prefill phases with their FLOP/s and fractions of peak,
the whole rollout's model FLOP/s. The line before the last times each decode step (module hooks,
:class:`DecodeSteps`): ``best_step_fraction`` is the FLOP/s of the one-position steps at the most rows
over peak, every row counted. Steps at fewer rows only lower the decode phase's figure, so that is the
most a rollout made of such steps can reach on the machine.

Goal: ratio >= 0.5. The last line is ``ratio=<decode FLOP/s of the HF rollout's decode phase / peak fp32
matmul FLOP/s>``. The current figures, with their command, date, commit and machine, and what bounds
them, are on the documentation's Performance page (``docs/performance.md``).
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
    team = Team.adapter_per_agent(model, tokenizer, args.num_agents)
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
