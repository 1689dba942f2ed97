"""Peer timing: comlrl's MAGRPOTrainer on CPU with ``--turns`` turns (the shared peer script runs 1).

Run in comlrl's own virtualenv (see ``benchmarks/magrpo_vs_comlrl.py``); prints one line
``comlrl_magrpo prompts=N seconds=S s_per_prompt=X``. Settings as ``../shared/peers/comlrl_magrpo_cpu.py``
(2 agents, G, 64 new tokens, full fine-tune of two fp32 SmolLM2-135M copies, T 0.7, top_p 0.9, joint
reward ``min(len(agent 1) / len(agent 0), 3)`` in characters), plus: every branch is expanded to the last
turn (``early_termination_threshold=None``; comlrl's default -0.2 would stop every branch of this
non-negative reward after turn 0), and the external transition gives each agent its turn-t prompt, its
own answer and "Write your part again." — the conversation our ``LengthRatioEnv`` shows at turn t+1.
"""
import argparse
import os
import pathlib
import time

import torch
from comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

TEXT = ("The city council met on Tuesday to discuss the new park. "
        "Residents asked for more trees and benches.")
PREFIXES = ("Summarize in one sentence:\n", "Write a detailed summary:\n")
AGAIN = "Write your part again."


def reward(first, second):
    return [min(len(second[0]) / max(1, len(first[0])), 3.0)]


def transition(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
    """Each agent's next prompt: its previous prompt, its own answer, then the request to write again."""
    prompts = []
    for agent in range(num_agents):
        previous = prompt_history_per_agent[agent][-1] if prompt_history_per_agent[agent] else PREFIXES[agent] + prompt
        prompts.append(f"{previous}\n{response_history_per_agent[agent][-1]}\n{AGAIN}")
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gguf", required=True)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("WANDB_MODE", "disabled")
    torch.manual_seed(0)
    path = pathlib.Path(args.gguf)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    agents = [AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
              for _ in range(2)]
    formatters = [lambda x: PREFIXES[0] + x["prompt"], lambda x: PREFIXES[1] + x["prompt"]]
    config = MAGRPOConfig(num_train_epochs=1, num_agents=2, num_generations=args.generations,
                          max_new_tokens=args.new_tokens, num_turns=args.turns, logging_steps=1,
                          eval_interval=10**9, temperature=0.7, top_p=0.9, early_termination_threshold=None)
    trainer = MAGRPOTrainer(agents=agents, tokenizer=tokenizer, num_agents=2, reward_func=reward,
                            formatters=formatters, train_dataset=Dataset.from_dict({"prompt": [TEXT] * args.prompts}),
                            args=config, external_transition=transition if args.turns > 1 else None)
    began = time.time()
    trainer.train()
    seconds = time.time() - began
    print(f"comlrl_magrpo prompts={args.prompts} seconds={seconds:.1f} s_per_prompt={seconds / args.prompts:.2f}")


if __name__ == "__main__":
    main()
