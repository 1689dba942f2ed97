"""Subprocess entry of the resume test: train MAGRPO on the toy env with a tiny model.

    python tests/magrpo_worker.py OUTPUT_DIR MAX_STEPS [--resume]
"""
import sys

import torch

from llm_marl.models import tiny_model
from llm_marl.team import Team
from tests.toy_env import SayNumberEnv
from trainers.magrpo import MAGRPOConfig, MAGRPOTrainer


def main() -> None:
    output_dir, max_steps, resume = sys.argv[1], int(sys.argv[2]), "--resume" in sys.argv
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, tokenizer = tiny_model(seed=0)
    team = Team.adapter_per_agent(model, tokenizer, 2)
    config = MAGRPOConfig(num_generations=3, max_new_tokens=6, max_steps=max_steps, save_every=1, eval_tasks=2,
                          learning_rate=5e-3, kl_coef=0.05, output_dir=output_dir, report_to=("jsonl",),
                          resume_from_checkpoint="latest" if resume else None, progress=False, seed=1)
    MAGRPOTrainer(SayNumberEnv(num_turns=2), team, config).train()


if __name__ == "__main__":
    main()
