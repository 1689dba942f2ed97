"""The information-split study's communication ablation with and without the team's kept turn-0 answers.

    PYTHONPATH=. python benchmarks/greedy_cache.py --env split_arithmetic-v0 --tasks 64

Builds the study's evaluator (:class:`studies.information_split.study.Evaluator`: SmolLM2-135M-Instruct fp32, one
LoRA adapter per role, untrained, 2 roles x 2 turns, 40 new tokens, greedy) and plays the same tasks three times,
one torch thread:

1. the team without a cache: every request generated;
2. the team, keeping its greedy answers in a :class:`llm_marl.rollout.GreedyCache`: a request the same as an
   earlier one (an agent whose view another task shares) takes that answer;
3. the masked team with that cache: its turn-0 prompts are the team's, so only turn 1 is generated;
4. the masked team with an empty cache: as without the team's answers.

Prints the seconds of each play, whether plays 1 and 2 and plays 3 and 4 gave the same answers,
``team_ratio=<play 1 / play 2>`` and, as the last line, ``ratio=<play 4 / play 3>`` (what the ablation costs
without the team's answers over with them). The figures, with command, date, commit and machine, are on the
documentation's Performance page.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from llm_marl.hardware import short_openmp_spin

short_openmp_spin()   # the library's OpenMP wait (a short spin), before torch starts its runtime

import torch  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="split_arithmetic-v0", help="an information-split env")
    parser.add_argument("--tasks", type=int, default=64, help="held-out tasks played (default 64)")
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    from llm_marl.rollout import GreedyCache
    from studies.information_split.study import Evaluator, StudyConfig

    evaluator = Evaluator(StudyConfig(env=args.env, model=args.model, eval_tasks=args.tasks))
    evaluator.load(evaluator.untrained)
    seconds, answers = {}, {}
    with tempfile.TemporaryDirectory() as out:
        for label, setting, cache in (("team, no cache", "team", None), ("team", "team", "new"),
                                      ("masked, team's answers kept", "masked", "kept"),
                                      ("masked, empty cache", "masked", "new")):
            if cache != "kept":
                evaluator.greedy_cache = GreedyCache() if cache == "new" else None
            started = time.perf_counter()
            _, episodes = evaluator.play(setting, Path(out) / label.replace(" ", "_").replace(",", ""), label=label)
            seconds[label] = time.perf_counter() - started
            answers[label] = [e["answers"] for e in episodes]
            hits = "no cache" if evaluator.greedy_cache is None else f"greedy cache hits {evaluator.greedy_cache.hits}"
            print(f"{label:>28}: {seconds[label]:7.1f} s, {args.tasks} tasks, {hits}", flush=True)
    print(f"team plays give the same answers: {answers['team, no cache'] == answers['team']}")
    kept_answers = answers["masked, team's answers kept"]
    print(f"masked plays give the same answers: {kept_answers == answers['masked, empty cache']}")
    print(f"team_ratio={seconds['team, no cache'] / seconds['team']:.2f}")
    kept = seconds["masked, team's answers kept"]
    print(f"ratio={seconds['masked, empty cache'] / kept:.2f}")


if __name__ == "__main__":
    main()
