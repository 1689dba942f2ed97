"""MAGRPO training speed against comlrl's MAGRPOTrainer in one run, and the memory of a shared-base LoRA team.

    PYTHONPATH=. python benchmarks/magrpo_vs_comlrl.py --prompts 4
    PYTHONPATH=. python benchmarks/magrpo_vs_comlrl.py --skip-memory       # timing only
    PYTHONPATH=. python benchmarks/magrpo_vs_comlrl.py --skip-comlrl       # ours and memory only
    PYTHONPATH=. python benchmarks/magrpo_vs_comlrl.py --turns 1,2 --skip-memory   # 1 and 2 turns
    PYTHONPATH=. python benchmarks/magrpo_vs_comlrl.py --turns 1 --skip-memory --repeats 3   # ratio of medians

**Speed.** Both trainers do the same work as the peer script ``comlrl_magrpo_cpu.py`` of the shared
peers folder beside the checkout: 2 agents, G=4, 64 new tokens, 1 turn, full fine-tune of two fp32
copies of SmolLM2-135M-Instruct, AdamW at 5e-6 without clipping, group-mean advantages normalised by
the group's std, temperature 0.7, top_p 0.9, the same text and per-agent prompts, and the joint
reward ``min(len(agent_1) / len(agent_0), 3)`` in characters. Ours runs :class:`LengthRatioEnv` (a
real :class:`~llm_marl_envs.core.TextEnv`) through :class:`~trainers.magrpo.MAGRPOTrainer`; comlrl
runs the peer script in its own virtualenv: ``--comlrl-python PATH``, else ``$COMLRL_PYTHON``, else
``comlrl-venv/bin/python`` under the cache directory (``$LLM_MARL_CACHE``, default
``~/.cache/llm_marl_envs``), made with::

    python -m venv ~/.cache/llm_marl_envs/comlrl-venv &&
        ~/.cache/llm_marl_envs/comlrl-venv/bin/pip install torch==2.13.0 comlrl accelerate gguf

``--turns 1,2`` also times 2 turns, every branch expanded (4 + 16 samples per agent per prompt), with
the peer's multi-turn script in ``benchmarks/peers/``.

comlrl updates each agent once per ``rollout_buffer_size=2`` prompts (its default); ours uses
``prompts_per_step=2``, so both make the same number of optimiser steps. Timed: the ``train()`` call
of each, model loading excluded; ours also excludes writing its final checkpoint (two full models and
AdamW states; comlrl writes none), which is printed separately. Every timing of either trainer runs in
a fresh subprocess (a process that trained before has its heap grown already); ``--repeats N``
alternates N timings of each and divides the medians. The peer gets the environment the user started
the script in: the OpenMP wait policy is passed on only if the user set it (:func:`peer_environment`),
while ours runs with the library's short spin (:func:`llm_marl.hardware.short_openmp_spin`). The
``ours`` line shows each step's update time and the page faults of ``train()``: a run's first step
pays for first-touched memory (the AdamW states and gradients of two 540 MB models).

Differences that remain: our prompts go through the chat template (comlrl tokenizes the raw text),
comlrl also applies top_k=50, and comlrl's std is the biased one. Completion lengths come out alike
(agent 0 ~15-25 tokens, agent 1 mostly the full 64, in both).

**Memory.** Peak RSS (``VmHWM``) of fresh subprocesses, each doing: imports, load the model, one
batched generate of G=4 samples per agent (64 new tokens), then one REINFORCE step per agent (forward
and backward over its 4 samples and an AdamW step). ``team``: one fp32 base with 4 LoRA adapters (rank
8, all linear layers), 4 agents (16 rows in one mixed-adapter generate call), 4 adapter updates.
``plain``: one fp32 model as 1 agent, full fine-tune (AdamW keeps two moments per weight). Also
printed: the plain model doing only load and generate, and a 1-agent LoRA team (what agents 2-4 add).

Goals: ours <= 1/3 of comlrl's time (ratio >= 3); team peak <= 1.3x one plain model.
The last line is ``ratio=<comlrl seconds per prompt / ours>``, the smallest over ``--turns``.

The current figures, with the command, date, commit and machine of each, and what bounds them, are
on the documentation's Performance page (``docs/performance.md``).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Ours runs as the `llm-marl` CLI runs it: the library's OpenMP wait (a short spin, set before torch loads).
# The peer runs in the environment the user started this script in: a wait policy costs comlrl ~20-35% on
# an idle machine (see the docstring), and its users do not set one.
from llm_marl.hardware import OPENMP_WAIT_ENV, short_openmp_spin  # noqa: E402

PEER_OPENMP = {name: os.environ[name] for name in OPENMP_WAIT_ENV if name in os.environ}
OURS_OPENMP = short_openmp_spin()

from llm_marl.models import cache_root  # noqa: E402
from llm_marl_envs.core import TextEnv  # noqa: E402
from verifiers import Verdict  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PEER_SCRIPT = ROOT.parent / "shared" / "peers" / "comlrl_magrpo_cpu.py"
MULTI_TURN_PEER_SCRIPT = ROOT / "benchmarks" / "peers" / "comlrl_magrpo_turns.py"

# The peer script's text and per-agent prompt prefixes (its `formatters`).
PEER_TEXT = ("The city council met on Tuesday to discuss the new park. "
             "Residents asked for more trees and benches.")
PEER_PREFIXES = ("Summarize in one sentence:\n", "Write a detailed summary:\n")
MAX_RATIO = 3.0


def length_ratio_reward(first: str, second: str, cap: float = MAX_RATIO) -> float:
    """The peer's joint reward: ``min(len(second) / max(1, len(first)), cap)`` in characters."""
    return min(len(second) / max(1, len(first)), cap)


class LengthRatioEnv(TextEnv):
    """Two agents summarise the same text, briefly and in detail; joint reward ``min(len(a1)/len(a0), 3)``.

    =====================  =============================================================
    Agents                 exactly 2: ``agent_0`` "Summarize in one sentence:",
                           ``agent_1`` "Write a detailed summary:" (the comlrl peer's prompts)
    Turns                  1 by default; later turns ask each agent to write its part again
    Data                   ``num_tasks`` copies of ``text`` (default: the peer's news snippet)
    Reward                 :func:`length_ratio_reward` of the two answers, shared by both
    =====================  =============================================================
    """

    metadata = {"name": "length_ratio_v0", "render_modes": ["human", "ansi"], "is_parallelizable": True}
    data_source = "a fixed text, repeated (comlrl peer benchmark)"
    verifier_name = "min(len(agent_1) / len(agent_0), 3), joint"
    min_agents = 2

    def __init__(self, num_agents: int = 2, num_turns: int = 1, num_tasks: int = 4, text: str = PEER_TEXT,
                 **kwargs: Any) -> None:
        if num_agents != 2:
            raise ValueError(f"LengthRatioEnv needs exactly 2 agents (brief, detailed), got num_agents={num_agents}")
        if num_tasks < 1:
            raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
        super().__init__(num_agents=num_agents, num_turns=num_turns, **kwargs)
        self.num_tasks, self.text = num_tasks, text

    def load_tasks(self) -> list[dict[str, str]]:
        """``num_tasks`` records holding the same text."""
        return [{"task_id": f"text-{i}", "text": self.text} for i in range(self.num_tasks)]

    def first_prompt(self, agent_index: int, task: dict[str, str]) -> list[dict[str, str]]:
        """The peer's formatter output as the only user message."""
        return [{"role": "user", "content": PEER_PREFIXES[agent_index] + task["text"]}]

    def verify_turn(self, answers: dict[str, str]) -> dict[str, Verdict]:
        """One joint verdict: the length ratio of agent 1's answer to agent 0's."""
        first, second = (answers[a] for a in self.possible_agents)
        score = length_ratio_reward(first, second)
        verdict = Verdict(score=score, correct=None, details={"chars": [len(first), len(second)]})
        return {agent: verdict for agent in answers}

    def next_prompt(self, agent_index: int) -> str:
        """Ask for the part again (the benchmark runs 1 turn)."""
        return "Write your part again."


# ----------------------------------------------------------------------------------- speed: ours
def time_ours(prompts: int, new_tokens: int, generations: int, turns: int = 1, seed: int = 0) -> dict[str, Any]:
    """Train MAGRPO with the peer's settings on ``turns`` turns; seconds of ``train()`` without the final checkpoint."""
    import numpy as np
    import torch

    from llm_marl.models import load
    from llm_marl.team import Team
    from trainers.magrpo import MAGRPOConfig, MAGRPOTrainer

    torch.manual_seed(seed)
    models = [load("smollm2-135m") for _ in range(2)]            # two fp32 copies: full fine-tune, like the peer
    team = Team.separate(models)
    env = LengthRatioEnv(num_tasks=prompts, num_turns=turns)
    per_step = 2                                                   # comlrl's rollout_buffer_size
    with tempfile.TemporaryDirectory() as out:
        config = MAGRPOConfig(num_generations=generations, max_new_tokens=new_tokens, temperature=0.7, top_p=0.9,
                              learning_rate=5e-6, max_grad_norm=None, normalize_advantages=True,
                              prompts_per_step=per_step, max_steps=-(-prompts // per_step), eval_tasks=0,
                              report_to=(), progress=False, output_dir=out, seed=seed)
        trainer = MAGRPOTrainer(env, team, config)
        saving = []
        save = trainer.save

        def timed_save() -> None:
            began = time.perf_counter()
            save()
            saving.append(time.perf_counter() - began)

        trainer.save = timed_save
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        began = time.perf_counter()
        history = trainer.train()
        elapsed = time.perf_counter() - began
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    updates = [h["step_s"] - h["rollout_s"] for h in history]
    trained = config.max_steps * per_step
    seconds = elapsed - sum(saving)
    return {"prompts": trained, "seconds": seconds, "s_per_prompt": seconds / trained, "checkpoint_s": sum(saving),
            "rollout_s": float(sum(h["rollout_s"] for h in history)),
            "update_s": float(sum(updates)), "updates_s": [round(float(u), 1) for u in updates],
            "page_faults": faults,
            "tokens_per_s": float(np.mean([h["tokens_per_s"] for h in history])),
            "joint_reward": float(np.mean([h["joint_reward_mean"] for h in history]))}


# ----------------------------------------------------------------------------------- speed: comlrl
def comlrl_python(flag: str | None) -> str:
    """The comlrl virtualenv's interpreter (flag, else ``$COMLRL_PYTHON``, else the cache's venv), or a clear error."""
    venv = cache_root() / "comlrl-venv"
    sources = [("--comlrl-python", flag), ("$COMLRL_PYTHON", os.environ.get("COMLRL_PYTHON")),
               ("the default", str(venv / "bin" / "python"))]
    source, python = next((name, value) for name, value in sources if value)
    if not Path(python).is_file():
        raise SystemExit(f"comlrl interpreter {python!r} (from {source}) not found. Create the peer's virtualenv with\n"
                         f"    python -m venv {venv} && {venv}/bin/pip install torch==2.13.0 comlrl accelerate gguf\n"
                         f"or pass --comlrl-python PATH (or set COMLRL_PYTHON) to an existing one, or run with "
                         f"--skip-comlrl.")
    return python


def parse_peer_line(output: str) -> dict[str, float]:
    """Parse the peer's ``comlrl_magrpo prompts=N seconds=S s_per_prompt=X`` line."""
    for line in reversed(output.splitlines()):
        if line.startswith("comlrl_magrpo "):
            fields = dict(part.split("=", 1) for part in line.split()[1:])
            return {"prompts": int(fields["prompts"]), "seconds": float(fields["seconds"]),
                    "s_per_prompt": float(fields["s_per_prompt"])}
    raise ValueError(f"the peer script printed no 'comlrl_magrpo ...' line; its output ended with:\n{output[-2000:]}")


def peer_environment(environ: dict[str, str], user_openmp: dict[str, str]) -> dict[str, str]:
    """The peer's environment: ours without the OpenMP wait this script set, with the user's own where they set one."""
    env = {key: value for key, value in environ.items() if key not in OPENMP_WAIT_ENV}
    return {**env, **user_openmp, "WANDB_MODE": "disabled"}


def time_comlrl(python: str, prompts: int, new_tokens: int, generations: int, turns: int = 1) -> dict[str, float]:
    """Run the peer script in comlrl's virtualenv and parse its timing line (1 turn: the shared peer script;
    more: ``benchmarks/peers/comlrl_magrpo_turns.py``, the same settings with every branch expanded)."""
    from llm_marl.models import gguf_path

    script = PEER_SCRIPT if turns == 1 else MULTI_TURN_PEER_SCRIPT
    if not script.is_file():
        raise SystemExit(f"peer script {script} is missing (the 1-turn one lives in shared/peers beside the checkout)")
    command = [python, str(script), "--gguf", str(gguf_path("smollm2-135m")), "--prompts", str(prompts),
               "--new-tokens", str(new_tokens), "--generations", str(generations)]
    if turns > 1:
        command += ["--turns", str(turns)]
    done = subprocess.run(command, capture_output=True, text=True, env=peer_environment(os.environ, PEER_OPENMP))
    if done.returncode != 0:
        raise SystemExit(f"the comlrl peer failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return parse_peer_line(done.stdout)


# ----------------------------------------------------------------------------------- memory
def peak_mib() -> float:
    """Peak resident memory of this process in MiB (``VmHWM``; ``ru_maxrss`` would carry the parent's peak
    across fork + exec on Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # KiB on Linux, bytes on macOS


def memory_worker(kind: str, agents: int, new_tokens: int, generations: int) -> dict[str, float]:
    """In this (fresh) process: load, one generate, one REINFORCE step per agent; peak RSS in MiB."""
    import torch

    from llm_marl.models import load
    from llm_marl.team import Team

    torch.manual_seed(0)
    after_imports = peak_mib()
    model, tokenizer = load("smollm2-135m")
    team = Team.adapter_per_agent(model, tokenizer, agents) if kind == "team" else Team.separate([(model, tokenizer)])
    if kind == "team" and agents == 1:
        kind = "lora1"
    policy = team.policy(team.agents[0])
    requests = [[{"role": "user", "content": PEER_PREFIXES[min(i, 1)] + PEER_TEXT}] for i in range(len(team.agents))]
    from llm_marl.policy import SamplingParams

    samples = policy.generate(requests, SamplingParams(max_new_tokens=new_tokens, temperature=0.7, top_p=0.9),
                              adapters=[team.adapter(a) for a in team.agents], num_samples=generations)
    after_generate = peak_mib()
    if kind != "generate":
        for agent, group in zip(team.agents, samples):
            adapter = team.adapter(agent)
            optimizer = torch.optim.AdamW(policy.trainable_parameters(adapter), lr=1e-5)
            logp, mask = policy.token_logprobs([g.prompt_ids for g in group], [g.completion_ids for g in group],
                                               adapter=adapter, temperature=0.7)
            advantages = torch.linspace(-1, 1, len(group))
            (-(advantages * (logp * mask).sum(-1)).mean()).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return {"kind": kind, "agents": len(team.agents), "after_imports_mib": after_imports,
            "after_generate_mib": after_generate, "peak_mib": peak_mib()}


def run_worker(what: str, *args: str) -> dict[str, float]:
    """Run this script with the hidden worker ``args`` in a fresh subprocess; its last stdout line, parsed as JSON."""
    command = [sys.executable, str(Path(__file__).resolve()), *args]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
    )
    if done.returncode != 0:
        raise SystemExit(f"{what} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_memory(kind: str, agents: int, new_tokens: int, generations: int) -> dict[str, float]:
    """Run :func:`memory_worker` in a fresh subprocess (so peaks do not mix) and return its report."""
    return run_worker(f"memory worker {kind!r}", "--memory-worker", kind, "--agents", str(agents),
                      "--new-tokens", str(new_tokens), "--generations", str(generations))


def time_ours_fresh(prompts: int, new_tokens: int, generations: int, turns: int) -> dict[str, Any]:
    """:func:`time_ours` in a fresh subprocess, as the peer runs: a process that trained before has its heap
    grown already, which makes a second timing in the same process faster than a user's first."""
    return run_worker("our training worker", "--ours-worker", "--prompts", str(prompts), "--new-tokens",
                      str(new_tokens), "--generations", str(generations), "--turns", str(turns))


# ----------------------------------------------------------------------------------- main
def main(argv: Sequence[str] | None = None) -> None:
    """Time both trainers, measure memory, print the ratio last."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=4, help="training prompts (both trainers)")
    parser.add_argument("--new-tokens", type=int, default=64, help="max new tokens per completion")
    parser.add_argument("--generations", type=int, default=4, help="G: samples per agent per prompt")
    parser.add_argument("--turns", default="1",
                        help="turns of each episode, or a comma list (e.g. 1,2): each is timed for both trainers; "
                             "the last line is the smallest ratio")
    parser.add_argument("--comlrl-python", default=None,
                        help="python of comlrl's virtualenv (default: $COMLRL_PYTHON, else comlrl-venv/bin/python "
                             "under $LLM_MARL_CACHE or ~/.cache/llm_marl_envs)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="timings of each trainer per turn count, alternating ours and comlrl; the ratio is of "
                             "the medians (timings on a shared VM vary from run to run)")
    parser.add_argument("--skip-comlrl", action="store_true", help="time only ours (no ratio)")
    parser.add_argument("--skip-memory", action="store_true", help="skip the memory comparison")
    parser.add_argument("--memory-agents", type=int, default=4, help="agents of the LoRA team in the memory test")
    parser.add_argument("--memory-worker", choices=("team", "plain", "generate"), help=argparse.SUPPRESS)
    parser.add_argument("--ours-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--agents", type=int, default=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.prompts < 1:
        parser.error(f"--prompts must be >= 1, got {args.prompts}")
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.memory_worker:
        print(json.dumps(memory_worker(args.memory_worker, args.agents, args.new_tokens, args.generations)))
        return
    if args.ours_worker:
        print(json.dumps(time_ours(args.prompts, args.new_tokens, args.generations, int(args.turns))))
        return
    python = None if args.skip_comlrl else comlrl_python(args.comlrl_python)

    import torch

    try:
        turn_counts = [int(t) for t in args.turns.split(",")]
    except ValueError:
        parser.error(f"--turns must be a positive integer or a comma list of them, got {args.turns!r}")
    if not turn_counts or min(turn_counts) < 1:
        parser.error(f"--turns must be a positive integer or a comma list of them, got {args.turns!r}")
    ratios = {}
    for turns in turn_counts:
        print(
            f"prompts={args.prompts} agents=2 G={args.generations} new_tokens={args.new_tokens} turns={turns} "
            f"full fine-tune fp32 torch_threads={torch.get_num_threads()} load={os.getloadavg()[0]:.1f} "
            f"OpenMP wait: ours {OURS_OPENMP}, "
            f"comlrl {' '.join(f'{k}={v}' for k, v in PEER_OPENMP.items()) or 'unset'}",
            flush=True,
        )
        ours_runs, peer_runs = [], []
        for _ in range(args.repeats):
            ours = time_ours_fresh(args.prompts, args.new_tokens, args.generations, turns)
            ours_runs.append(ours["s_per_prompt"])
            print(
                f"ours    s_per_prompt={ours['s_per_prompt']:.2f} (train {ours['seconds']:.1f} s for {ours['prompts']} "
                f"prompts: rollout {ours['rollout_s']:.1f} s at {ours['tokens_per_s']:.0f} tok/s, update "
                f"{ours['update_s']:.1f} s (by step {ours['updates_s']}; the first pays for fresh memory: "
                f"{ours['page_faults']} page faults in train()); final checkpoint {ours['checkpoint_s']:.1f} s "
                f"not counted) "
                f"joint_reward={ours['joint_reward']:.2f}",
                flush=True,
            )
            if python is not None:
                peer = time_comlrl(python, args.prompts, args.new_tokens, args.generations, turns)
                peer_runs.append(peer["s_per_prompt"])
                print(f"comlrl  s_per_prompt={peer['s_per_prompt']:.2f} (train {peer['seconds']:.1f} s for "
                      f"{peer['prompts']} prompts)", flush=True)
        if args.repeats > 1:
            print(f"medians of {args.repeats}: ours {statistics.median(ours_runs):.2f}"
                  + (f", comlrl {statistics.median(peer_runs):.2f}" if peer_runs else "")
                  + f" s_per_prompt (ours {min(ours_runs):.2f}-{max(ours_runs):.2f}"
                  + (f", comlrl {min(peer_runs):.2f}-{max(peer_runs):.2f})" if peer_runs else ")"), flush=True)
        if peer_runs:
            ratios[turns] = statistics.median(peer_runs) / statistics.median(ours_runs)
            print(f"ratio_turns{turns}={ratios[turns]:.2f}", flush=True)
    if not args.skip_memory:
        team = measure_memory("team", args.memory_agents, args.new_tokens, args.generations)
        plain = measure_memory("plain", 1, args.new_tokens, args.generations)
        generate_only = measure_memory("generate", 1, args.new_tokens, args.generations)
        lora1 = measure_memory("team", 1, args.new_tokens, args.generations)
        print(
            f"memory  peak RSS: {args.memory_agents}-agent shared-base LoRA team {team['peak_mib']:.0f} MiB; one plain "
            f"model {plain['peak_mib']:.0f} MiB (full fine-tune step), {generate_only['peak_mib']:.0f} MiB (load + "
            f"generate only); 1-agent LoRA team {lora1['peak_mib']:.0f} MiB; imports alone "
            f"{plain['after_imports_mib']:.0f} MiB"
        )
        print(f"memory_ratio={team['peak_mib'] / plain['peak_mib']:.2f} (team / plain model, same work per agent); "
              f"team / plain generate-only {team['peak_mib'] / generate_only['peak_mib']:.2f}; "
              f"team / 1-agent LoRA {team['peak_mib'] / lora1['peak_mib']:.2f}")
    print(f"load at end={os.getloadavg()[0]:.1f}")
    if ratios:
        print(f"ratio={min(ratios.values()):.2f}")


if __name__ == "__main__":
    main()
