"""Entry point of the launched GPU test (tests/runtime/test_gpu.py), run under ``accelerate launch``:

    accelerate launch --multi_gpu --num_processes 1 tests/gpu_worker.py OUT plain fsdp

Each job trains the tiny MAGRPO team of :func:`tests.ddp_worker.build_trainer` for 2 steps in bf16 into
``OUT/<job>`` (``fsdp``: with ``fsdp=True``) and writes ``OUT/<job>/report.json``: the process group's
backend and size, where the weights live, whether they moved, the logged losses and the checkpoints written.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

from tests.ddp_worker import build_trainer, trainable


def run(out: Path, job: str) -> None:
    """Train 2 bf16 steps (``job`` ``fsdp``: sharding asked for) and write the report."""
    trainer = build_trainer(out / job, max_steps=2, init_seed=0, mixed_precision="bf16", fsdp=job == "fsdp")
    before = {name: tensor.detach().clone() for name, tensor in trainable(trainer).items()}
    history = trainer.train()
    after = trainable(trainer)
    losses = [value for record in history for key, value in record.items() if key.endswith("/loss")]
    model = trainer.team.policy("agent_0").model
    report = {
        "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
        "world_size": torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "accelerator_device": str(trainer.accelerator.device),
        "parameter_devices": sorted({str(p.device) for p in model.parameters()}),
        "trainable_dtypes": sorted({str(t.dtype) for t in after.values()}),
        "sharded": trainer.distributed.sharded,
        "steps": [record["step"] for record in history],
        "losses_finite": bool(losses) and all(math.isfinite(v) for v in losses),
        "moved": sorted({name.split("/")[0] for name, tensor in after.items()          # agents whose weights moved
                         if not torch.equal(tensor.detach().cpu(), before[name].cpu())}),
        "checkpoints": sorted(p.name for p in (out / job / "checkpoints").iterdir()),
    }
    (out / job / "report.json").write_text(json.dumps(report))


def main() -> None:
    out, jobs = Path(sys.argv[1]), sys.argv[2:]
    for job in jobs:
        run(out, job)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
