"""A training output directory that never loses a run: resume it, refuse, or start over only when asked.

``llm-marl train`` records what it runs in ``<output_dir>/run.json`` (the command, the env, the model and
every config field). Run again on a directory that holds a run (:func:`prepare_run_dir`):

- with the same record, it resumes from the newest checkpoint (or starts again when the run stopped before
  its first one), so re-running an interrupted command continues it;
- with a record that differs in a field that changes the training, it refuses, naming the fields and the two
  ways on: the command that resumes the saved run, or a new ``--out`` / ``--overwrite`` to start over;
- with ``--overwrite``, it deletes the run's outputs (checkpoints, metrics, TensorBoard logs, evaluations,
  ``run.json``) and starts fresh;
- with an explicit ``resume_from_checkpoint``, it resumes from that checkpoint and only reports differences.

Fields that change only what is written or shown, not the weights (:data:`OUTPUT_ONLY_FIELDS`), may differ.
This module imports nothing heavy: the check runs before torch loads.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RUN_FILE = "run.json"
CHECKPOINT_PREFIX = "step-"
# config fields and command options that change what a run writes or shows, not what it trains
OUTPUT_ONLY_FIELDS = frozenset({"output_dir", "resume_from_checkpoint", "report_to", "progress", "logging_every",
                                "save_every", "save_every_minutes", "save_total_limit", "threads"})
# what a run writes under its output_dir: --overwrite deletes these and nothing else
RUN_OUTPUTS = ("checkpoints", "metrics.jsonl", "tensorboard", "eval", RUN_FILE)


class RunDirError(ValueError):
    """The output directory holds a run that this command would not continue exactly."""


@dataclass
class RunPlan:
    """What a command does with its output directory: ``resume`` (a checkpoint dir) or start fresh (``None``)."""

    resume: Path | None
    message: str


def newest_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint (``checkpoints/step-*`` with its ``trainer_state.pt``), ``None`` if none."""
    root = Path(output_dir) / "checkpoints"
    found = sorted(p for p in root.glob(f"{CHECKPOINT_PREFIX}*") if (p / "trainer_state.pt").is_file())
    return found[-1] if found else None


def resume_command(argv: Sequence[str], program: str = "llm-marl") -> str:
    """The command that resumes the run ``argv`` started: ``argv`` without ``--overwrite``, pointed at the newest
    checkpoint when it names one of its own."""
    kept = [a for a in argv if a != "--overwrite"]
    if any("resume_from_checkpoint" in a or a.startswith("--resume-from-checkpoint") for a in kept):
        kept += ["--set", "resume_from_checkpoint=latest"]
    return shlex.join([program, *kept])


def differences(saved: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[str]:
    """``"name: saved -> new"`` for every entry of the two records that differs and changes the training."""
    found = []
    for key in sorted(set(saved) | set(new)):
        if key in OUTPUT_ONLY_FIELDS or key == "command":
            continue
        old, now = saved.get(key), new.get(key)
        if isinstance(old, Mapping) and isinstance(now, Mapping):
            found += differences(old, now, f"{prefix}{key}.")
        elif _plain(old) != _plain(now):
            found.append(f"{prefix}{key}: {old!r} there, {now!r} now")
    return found


def _plain(value: Any) -> Any:
    """``value`` as JSON would give it back (tuples are lists)."""
    return json.loads(json.dumps(value, default=str))


def read_record(output_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The saved record of the run in ``output_dir``: its ``run.json``, else ``{"config": ...}`` of its newest
    checkpoint (a run started from Python), else ``None``."""
    path = Path(output_dir) / RUN_FILE
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    checkpoint = newest_checkpoint(output_dir)
    if checkpoint is not None and (checkpoint / "config.json").is_file():
        return {"config": json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))}
    return None


def write_record(output_dir: str | os.PathLike, record: Mapping[str, Any]) -> Path:
    """Write ``run.json`` atomically."""
    from llm_marl.files import write_text_atomically

    return write_text_atomically(Path(output_dir) / RUN_FILE, json.dumps(_plain(dict(record)), indent=2) + "\n")


def clear_run(output_dir: str | os.PathLike, outputs: Sequence[str] = RUN_OUTPUTS) -> list[str]:
    """Delete the outputs of the run in ``output_dir`` (``outputs``: names under it, :data:`RUN_OUTPUTS` by default;
    nothing else); the names deleted."""
    out, removed = Path(output_dir), []
    for name in outputs:
        path = out / name
        if path.is_dir():
            stale = out / f".deleted-{name}"
            shutil.rmtree(stale, ignore_errors=True)
            os.rename(path, stale)
            shutil.rmtree(stale, ignore_errors=True)
        elif path.exists():
            path.unlink()
        else:
            continue
        removed.append(name)
    return removed


def holds_run(output_dir: str | os.PathLike) -> bool:
    """Whether ``output_dir`` holds a run's outputs (a record, a checkpoint or metrics)."""
    out = Path(output_dir)
    return (out / RUN_FILE).is_file() or (out / "metrics.jsonl").is_file() or newest_checkpoint(out) is not None


def prepare_run_dir(output_dir: str | os.PathLike, record: Mapping[str, Any], *, overwrite: bool = False,
                    resume_given: bool = False, write: bool = True,
                    outputs: Sequence[str] = RUN_OUTPUTS) -> RunPlan:
    """Decide what this command does with ``output_dir`` (see the module docstring) and record it in ``run.json``.

    ``record``: this command's record (``command``: the command that resumes it, and every field that defines the
    run); ``resume_given``: the config names a checkpoint to resume from; ``write``: this process writes (the main
    one); ``outputs``: what ``--overwrite`` deletes (:func:`clear_run`). Raises :class:`RunDirError` when the
    directory holds another run.
    """
    out = Path(output_dir)
    if overwrite:
        removed = clear_run(out, outputs) if write else []
        if write:
            write_record(out, record)
        return RunPlan(None, f"--overwrite: deleted {', '.join(removed)} of the run in {out}" if removed else "")
    if not holds_run(out):
        if write:
            write_record(out, record)
        return RunPlan(None, "")
    saved = read_record(out)
    checkpoint = newest_checkpoint(out)
    changed = differences(saved, record) if saved is not None else []
    if resume_given:
        note = (f"resuming as asked although the saved run differs in: {'; '.join(changed)}" if changed else "")
        return RunPlan(None, note)
    if changed or saved is None:
        saved_command = (saved or {}).get("command") or (
            f"{record['command']} --set resume_from_checkpoint=latest" if checkpoint is not None else None)
        what = ("differs from the saved one in:\n    " + "\n    ".join(changed) if changed else
                "cannot be compared with it (it has metrics but no record or checkpoint)")
        ways = [f"  resume the saved run:   {saved_command}"] if saved_command and checkpoint is not None else []
        ways += [f"  start over here:        {record['command']} --overwrite   (deletes {out}'s checkpoints, "
                 f"metrics and logs)",
                 "  or start elsewhere:     this command with another --out"]
        raise RunDirError(f"{out} holds another run; this command's config {what}\n" + "\n".join(ways))
    if checkpoint is None:
        return RunPlan(None, f"{out} holds this run, stopped before its first checkpoint: starting it again")
    return RunPlan(checkpoint, f"{out} holds this run: resuming from {checkpoint.name} "
                               f"(the same command; --overwrite starts over)")


def interrupted_message(output_dir: str | os.PathLike, command: str) -> str:
    """What an interrupted run says: what ``output_dir`` keeps and ``command``, the command that resumes it."""
    checkpoint = newest_checkpoint(output_dir)
    if checkpoint is None:
        return (f"interrupted before the first checkpoint in {output_dir}; this command starts the run again:\n"
                f"  {command}")
    return (f"interrupted; {output_dir} keeps the run up to {checkpoint.name}; this command resumes it from there:\n"
            f"  {command}")


__all__ = ["OUTPUT_ONLY_FIELDS", "RUN_FILE", "RunDirError", "RunPlan", "clear_run", "differences", "holds_run",
           "interrupted_message", "newest_checkpoint", "prepare_run_dir", "read_record", "resume_command",
           "write_record"]
