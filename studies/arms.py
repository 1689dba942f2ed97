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
    """
    pending = [arm for arm in config.arms if finished_arm(config, out, arm) is None]
    parallel = in_workers(pending) if jobs > 1 and len(pending) > 1 else []
    if parallel:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        log(f"running {len(parallel)} arms, {jobs} at a time with {threads_per_job} thread(s) each: "
            f"{', '.join(parallel)}")
        # one process per arm: a worker's memory (its model, its caches) goes back when its arm is done
        # a worker stops when this process dies (killed, or stopped with ^C), instead of training on as an orphan
        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                 max_tasks_per_child=1, initializer=stop_with_parent,
                                 initargs=(os.getpid(),)) as pool:
            futures = [pool.submit(run_arm_in_worker, run_arm, make_evaluator, arm, config, out, threads_per_job)
                       for arm in parallel]
            for future in as_completed(futures):
                log(future.result())
    evaluator, records = None, {}
    for arm in config.arms:
        record = finished_arm(config, out, arm)
        if record is not None:
            log(f"{arm}: already done ({out / 'arms' / arm / 'arm.json'}), reused")
        else:
            evaluator = evaluator or make_evaluator(config)
            record = run_arm(arm, config, out, evaluator, log=log)
        records[arm] = record
    return records


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
