"""Metric sinks of the trainers: a JSONL file, TensorBoard, and W&B or trackio when installed and asked for."""
from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llm_marl.files import write_text_atomically

TRACKIO_PROJECT = "llm-marl"


class MetricsLogger:
    """Write ``{"step": s, **metrics}`` to ``metrics.jsonl`` and scalars to TensorBoard (and W&B, trackio).

    trackio logs to project ``llm-marl``, in a run named after the output directory (resumed when that
    run exists, so a resumed training continues its curves); trackio's own settings (``TRACKIO_DIR``,
    ``TRACKIO_SPACE_ID``) say where it stores them. A trackio sink asked for but not installed is a
    ``ValueError`` naming the pip command, raised before anything is written.

    A run resumed from a checkpoint replays the steps after it: the first record this logger
    writes, at step ``s`` (or ``first_step``, when given: the first step the run will train), replaces
    every record of step ``s`` or later already in the file (logged by the killed run after its last
    checkpoint), and a last line torn by a crash is dropped, so the file reads as if the run had never
    stopped; the records before ``s`` are kept as they are. TensorBoard is told the same step
    (``purge_step``), so its readers drop the killed run's events from ``first_step`` on and no step
    shows twice.
    """

    def __init__(self, output_dir: str | os.PathLike, report_to: Sequence[str] = ("jsonl", "tensorboard"),
                 enabled: bool = True, run_config: Mapping[str, Any] | None = None,
                 first_step: int | None = None) -> None:
        self.output_dir = Path(output_dir)
        self.enabled = enabled
        self._jsonl = self._tensorboard = self._wandb = self._trackio = None
        self._resume_checked = False
        if not enabled:
            return
        trackio = _import_trackio() if "trackio" in report_to else None
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if "jsonl" in report_to:
            self._jsonl = open(self.output_dir / "metrics.jsonl", "a", encoding="utf-8")
            if first_step is not None and self.path.stat().st_size:
                self._drop_records_from(first_step)
        if "tensorboard" in report_to:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(str(self.output_dir / "tensorboard"), purge_step=first_step)
        if "wandb" in report_to:
            try:
                import wandb
            except ImportError:
                warnings.warn("report_to includes 'wandb' but wandb is not installed; `pip install wandb` to use it")
            else:
                self._wandb = wandb.init(dir=str(self.output_dir), config=dict(run_config or {}))
        if trackio is not None:
            self._trackio = trackio.init(project=TRACKIO_PROJECT, name=self.output_dir.resolve().name,
                                         config=dict(run_config or {}), resume="allow", embed=False)

    @property
    def path(self) -> Path:
        """The JSONL metrics file."""
        return self.output_dir / "metrics.jsonl"

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record ``metrics`` at ``step`` in every sink (numbers go to TensorBoard/W&B)."""
        if not self.enabled:
            return
        if self._jsonl is not None:
            if not self._resume_checked:
                self._drop_records_from(step)
            self._jsonl.write(json.dumps({"step": step, **metrics}, default=float) + "\n")
            self._jsonl.flush()
        scalars = {k: float(v) for k, v in metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))}
        if self._tensorboard is not None:
            for key, value in scalars.items():
                self._tensorboard.add_scalar(key, value, step)
            self._tensorboard.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)
        if self._trackio is not None:
            self._trackio.log(scalars, step=step)

    def _drop_records_from(self, step: int) -> None:
        """Rewrite ``metrics.jsonl`` without records of ``step`` or later and without a torn last line."""
        self._resume_checked = True
        text = self.path.read_text(encoding="utf-8")
        kept = [line for line in text.splitlines(keepends=True) if line.endswith("\n") and _step_of(line) < step]
        if "".join(kept) != text:
            self._jsonl.close()
            write_text_atomically(self.path, "".join(kept))
            self._jsonl = open(self.path, "a", encoding="utf-8")

    def close(self) -> None:
        """Flush and close every sink."""
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
        if self._trackio is not None:
            self._trackio.finish()
            self._trackio = None


def _import_trackio() -> Any:
    """The ``trackio`` module, or a ``ValueError`` saying how to install it."""
    try:
        import trackio
    except ImportError:
        raise ValueError("report_to includes 'trackio' but trackio is not installed; install it with "
                         "`pip install 'llm-marl-envs[trackio]'` (or `pip install trackio`), or drop 'trackio' "
                         "from report_to") from None
    return trackio


def _step_of(line: str) -> float:
    """The step of a ``metrics.jsonl`` line (-inf for a whole line that is not a record: it is kept as it is)."""
    try:
        return float(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return -math.inf


def read_metrics(output_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """All records of ``output_dir/metrics.jsonl``."""
    path = Path(output_dir) / "metrics.jsonl"
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
