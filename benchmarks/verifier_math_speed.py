"""Speed of ``verifiers.math.verify_answer`` against math-verify (the peer) on GSM8K-style answers.

Workload: the first N GSM8K test solutions (offline copy in ``$LLM_MARL_DATA_DIR/gsm8k``),
each turned into a chain-of-thought response ending "The answer is X." once with the right X
and once with X+1. Both verifiers judge all responses against the gold answer string:
ours with ``verify_answer(response, gold)``, the peer with
``math_verify.verify(parse(gold), parse(response))`` (what TRL's accuracy reward does).
Prints per-call times, each verifier's accuracy on the known verdicts, and as the last line
``ratio=<peer seconds / our seconds>`` (above 1: ours is faster).

    LLM_MARL_DATA_DIR=../shared/data PYTHONPATH=. python benchmarks/verifier_math_speed.py --rows 300
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from math_verify import parse, verify

from verifiers.math import verify_answer


def gsm8k_cases(rows: int) -> list[tuple[str, str, bool]]:
    """``(response, gold, expected_correct)`` triples built from GSM8K test solutions."""
    path = Path(os.environ.get("LLM_MARL_DATA_DIR", "../shared/data")) / "gsm8k" / "test.jsonl"
    if not path.exists():
        raise SystemExit(f"GSM8K test split not found at {path}: set LLM_MARL_DATA_DIR to the offline data dir")
    cases = []
    for line in path.read_text().splitlines()[:rows]:
        solution = json.loads(line)["answer"]
        reasoning, gold = solution.rsplit("####", 1)
        gold = gold.strip().replace(",", "")
        for answer, expected in ((gold, True), (str(int(gold) + 1), False)):
            cases.append((f"{reasoning.strip()}\nThe answer is {answer}.", gold, expected))
    return cases


def timed(judge, cases: list[tuple[str, str, bool]]) -> tuple[float, int]:
    """Seconds to judge all cases and how many verdicts match the expected ones."""
    started = time.perf_counter()
    verdicts = [judge(response, gold) for response, gold, _ in cases]
    seconds = time.perf_counter() - started
    return seconds, sum(verdict == expected for verdict, (_, _, expected) in zip(verdicts, cases))


def main() -> None:
    """Run both verifiers on the same cases and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300, help="GSM8K test rows to use (2 responses each)")
    args = parser.parse_args()
    cases = gsm8k_cases(args.rows)
    verify_answer(*cases[0][:2])
    verify(parse(cases[0][1]), parse(cases[0][0]))  # warm both up (imports, caches)
    ours, ours_right = timed(lambda response, gold: verify_answer(response, gold).correct, cases)
    peer, peer_right = timed(lambda response, gold: verify(parse(gold), parse(response)), cases)
    print(f"cases={len(cases)}")
    print(f"ours: {ours / len(cases) * 1e6:.1f} us/call, {ours_right}/{len(cases)} verdicts right")
    print(f"math-verify: {peer / len(cases) * 1e6:.1f} us/call, {peer_right}/{len(cases)} verdicts right")
    print(f"ratio={peer / ours:.1f}")


if __name__ == "__main__":
    main()
