"""Running a study's arms: several at once in worker processes, the rest in this process, finished ones reused.

Every study keeps one record per arm in ``OUT/arms/<arm>/arm.json``; an arm whose record was written with the
same settings is done and is not run again, so an interrupted study resumes at the next arm.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def check_jobs(jobs: int, threads_per_job: int) -> None:
    """Refuse a job or thread count below 1 (``ValueError`` naming both)."""
    if jobs < 1 or threads_per_job < 1:
        raise ValueError(f"jobs and threads_per_job must be >= 1, got jobs={jobs}, threads_per_job={threads_per_job}")


def log_matching(config: Any, batches: Iterable[Any], seats: str, log: Callable[[str], Any]) -> None:
    """The study's shape and how each trained arm's batch matches the completions per step."""
    log(f"study: {config.env}, {config.num_agents} {seats} x {config.num_turns} turns, {config.steps} steps, "
        f"C = {config.completions_per_step} completions per step for every trained arm")
    for batch in batches:
        log(f"  {batch.arm:>15}: {batch.how}")


def run_arms(config: Any, out: Path, *, finished_arm: Callable[..., dict[str, Any] | None],
             run_arm: Callable[..., dict[str, Any]], make_evaluator: Callable[[Any], Any],
             in_workers: Callable[[list[str]], list[str]], jobs: int, threads_per_job: int,
             log: Callable[[str], Any] = print) -> dict[str, dict[str, Any]]:
    """The record of every arm of ``config.arms``: reused where ``finished_arm(config, out, arm)`` has one, else run.

    With ``jobs > 1``, the pending arms that ``in_workers(pending)`` picks (in the order it gives: the dearest
    first) run ``jobs`` at a time, each in a fresh process (:func:`run_arm_in_worker`: its own evaluator, its record
    left in ``out``, its log returned). What is left runs here as
    ``run_arm(arm, config, out, evaluator, log=log)``, with one evaluator made when the first arm needs it.
    A worker that fails or dies takes only its own arm: every other arm still runs, then :class:`ArmsFailed` names
    the arms that did not finish and why.
    """
    pending = [arm for arm in config.arms if finished_arm(config, out, arm) is None]
    parallel = in_workers(pending) if jobs > 1 and len(pending) > 1 else []
    failed: dict[str, str] = {}
    if parallel:
        log(f"running {len(parallel)} arms, {jobs} at a time with {threads_per_job} thread(s) each: "
            f"{', '.join(parallel)}")
        failed = run_in_workers(parallel, jobs, lambda arm: (run_arm, make_evaluator, arm, config, out,
                                                              threads_per_job), log)
    evaluator, records = None, {}
    for arm in config.arms:
        if arm in failed:
            continue
        record = finished_arm(config, out, arm)
        if record is not None:
            log(f"{arm}: already done ({out / 'arms' / arm / 'arm.json'}), reused")
        else:
            evaluator = evaluator or make_evaluator(config)
            record = run_arm(arm, config, out, evaluator, log=log)
        records[arm] = record
    if failed:
        raise ArmsFailed(failed, out)
    return records


class ArmsFailed(RuntimeError):
    """Arms whose worker process failed; the others ran to the end and kept their records."""

    def __init__(self, failed: dict[str, str], out: Path) -> None:
        self.failed = dict(failed)
        reasons = "; ".join(f"{arm}: {why}" for arm, why in failed.items())
        super().__init__(f"{len(failed)} arm(s) did not finish: {reasons}. The other arms' records are in "
                         f"{out / 'arms'}; the same command again reuses them and resumes the failed arms from "
                         f"their newest checkpoints (fewer --jobs need less memory)")


def worker_exit_reason(exitcode: int | None) -> str:
    """Why a worker ended without a result, from its exit code (a signal's name when a signal ended it)."""
    import signal

    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (the kernel's out-of-memory killer sends it)" if -exitcode == signal.SIGKILL else ""
        return f"its worker was killed by {name}{hint}"
    return f"its worker exited with code {exitcode} before reporting"


def run_in_workers(arms: list[str], jobs: int, worker_args: Callable[[str], tuple], log: Callable[[str], Any]
                   ) -> dict[str, str]:
    """Run each arm in a fresh spawned process (:func:`run_arm_in_worker` on ``worker_args(arm)``), ``jobs`` at a
    time, logging each one's lines as it finishes; ``{arm: why}`` of those that failed.

    A worker that dies (killed for memory, say) takes only its own arm: the others run on, and the next pending
    arm takes its place. One process per arm also gives a finished arm's memory back to the system.
    """
    import multiprocessing
    from multiprocessing.connection import wait

    context = multiprocessing.get_context("spawn")
    queue, running, failed = list(arms), {}, {}
    try:
        while queue or running:
            while queue and len(running) < jobs:
                arm = queue.pop(0)
                receive, send = context.Pipe(duplex=False)
                process = context.Process(target=_worker_main, name=f"arm-{arm}",
                                          args=(send, os.getpid(), worker_args(arm)))
                process.start()
                send.close()                    # the worker holds the sending end; EOF here once it is gone
                running[arm] = {"process": process, "receive": receive, "message": None}
            waitables = [job["process"].sentinel for job in running.values()]
            waitables += [job["receive"] for job in running.values() if not job["receive"].closed]
            ready = wait(waitables)
            for arm, job in list(running.items()):
                receive, process = job["receive"], job["process"]
                if not receive.closed and receive in ready:        # read as it comes: a big log must not block
                    try:
                        job["message"] = receive.recv()
                    except EOFError:
                        receive.close()
                if process.sentinel in ready:
                    process.join()
                    if job["message"] is None and not receive.closed and receive.poll():
                        try:                           # poll() also answers True at the end of the pipe
                            job["message"] = receive.recv()
                        except EOFError:
                            pass
                    if not receive.closed:
                        receive.close()
                    del running[arm]
                    status, text = job["message"] or ("died", worker_exit_reason(process.exitcode))
                    if status == "ok":
                        log(text)
                    else:
                        failed[arm] = text if status == "died" else f"it raised {text.strip().splitlines()[-1]}"
                        log(f"{arm}: failed, {failed[arm]}" + (f"\n{text}" if status == "error" else ""))
    finally:
        for job in running.values():        # this process is stopping (^C, an error): its workers stop too
            job["process"].terminate()
            job["process"].join()
    return failed


def _worker_main(send: Any, parent: int, args: tuple) -> None:
    """A worker's body: stop with the study process, run the arm, send ("ok", log) or ("error", traceback)."""
    import traceback

    stop_with_parent(parent)
    try:
        message = ("ok", run_arm_in_worker(*args))
    except BaseException:                                 # noqa: BLE001 - reported to the study, which names the arm
        message = ("error", traceback.format_exc())
    send.send(message)
    send.close()


def stop_with_parent(parent: int, every_s: float = 1.0) -> None:
    """In a worker: end this process once ``parent`` is no longer its parent (the study process died and the
    worker was handed to another), checked every ``every_s`` seconds by a daemon thread."""
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os._exit(1)               # the study is gone: nobody reads this arm's result

    threading.Thread(target=watch, name="stop-with-parent", daemon=True).start()


def run_arm_in_worker(run_arm: Callable[..., dict[str, Any]], make_evaluator: Callable[[Any], Any], arm: str,
                      config: Any, out: Path, threads: int) -> str:
    """One arm in a worker process of :func:`run_arms` with ``threads`` torch threads; returns its log."""
    import torch

    torch.set_num_threads(threads)
    lines: list[str] = []
    run_arm(arm, config, out, make_evaluator(config), log=lines.append)
    return "\n".join(lines)
