"""Judge the recorded responses of benchmark runs again with the verifiers as they are now.

    PYTHONPATH=. python docs/_scripts/rescore_episodes.py RUN_DIR [RUN_DIR ...]

Each ``RUN_DIR`` is the ``--out`` folder of an ``llm-marl bench`` run. Every response in its
``episodes.jsonl`` is judged by its env's ``verify_turn`` on the same task, and the verdicts are
compared with the recorded ones (those of the verifier the run used): how many changed each way,
the accuracy per turn before and after, and the correct/incorrect transitions between turns. Use
it when a verifier changes, to state what the change does to recorded results; with the previous
verifier first on ``PYTHONPATH`` it gives that verifier's verdicts instead.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from llm_marl.benchmark import EPISODES_FILE, RUN_FILE, BenchConfig, make_env, read_episodes
from llm_marl_envs import metrics


def rescore(run_dir: Path) -> dict:
    """Recorded and current verdicts of every response of one run, and their summary."""
    run = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    env = make_env(BenchConfig(**run["config"]))
    records = sorted(read_episodes(run_dir / EPISODES_FILE), key=lambda r: r["episode"])
    changes = {"wrong -> right": [], "right -> wrong": []}
    recorded, current = [], []
    for record in records:
        env.reset(seed=record["seed"], options={"task_index": record["task_index"]})
        now = []
        for turn, responses in enumerate(record["responses"]):
            verdicts = env.verify_turn(dict(zip(env.possible_agents, responses)))
            now.append([verdicts[agent].correct for agent in env.possible_agents])
            for agent, before, after, text in zip(env.possible_agents, record["correct"][turn], now[-1], responses):
                if before != after:
                    key = "wrong -> right" if after else "right -> wrong"
                    changes[key].append({"episode": record["episode"], "turn": turn, "agent": agent,
                                         "answer": verdicts[agent].details.get("answer"), "response": text})
        recorded.append(record["correct"])
        current.append(now)
    return {"run": str(run_dir), "env_id": run["env_id"], "episodes": len(records),
            "responses": sum(len(turn) for r in records for turn in r["responses"]),
            "changed": {key: len(found) for key, found in changes.items()}, "examples": changes,
            "accuracy_per_turn": {"recorded": _per_turn(recorded), "now": _per_turn(current)},
            "transitions": {"recorded": _transitions(recorded), "now": _transitions(current)}}


def _per_turn(correct: list[list[list[bool | None]]]) -> list[float]:
    """Mean correctness over agents and episodes, per turn."""
    turns = max(len(c) for c in correct)
    return [float(np.mean([bool(x) for c in correct if t < len(c) for x in c[t]])) for t in range(turns)]


def _transitions(correct: list[list[list[bool | None]]]) -> dict[str, int]:
    """C→I and I→C counts summed over episodes."""
    counts = sum(metrics.transition_counts(c) for c in correct)
    return {"C→I": int(counts[0, 1]), "I→C": int(counts[1, 0])}


def main() -> None:
    """Rescore each run and print its summary (``--examples N``: also N changed responses of each kind)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="llm-marl bench --out folders")
    parser.add_argument("--examples", type=int, default=0, help="changed responses to print per kind")
    args = parser.parse_args()
    for run_dir in args.runs:
        result = rescore(run_dir)
        accuracy = result["accuracy_per_turn"]
        print(f"{result['run']} ({result['env_id']}): {result['episodes']} episodes, {result['responses']} responses; "
              f"verdicts changed: {result['changed']}")
        print(f"  accuracy per turn: recorded {[round(a, 3) for a in accuracy['recorded']]}, "
              f"now {[round(a, 3) for a in accuracy['now']]}")
        print(f"  transitions: recorded {result['transitions']['recorded']}, now {result['transitions']['now']}")
        for key, found in result["examples"].items():
            for example in found[:args.examples]:
                print(f"  {key} (episode {example['episode']}, turn {example['turn']}, {example['agent']}, "
                      f"now {example['answer']!r}): {example['response']!r}")


if __name__ == "__main__":
    main()
