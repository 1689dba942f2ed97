"""MAPPO's phase timings: every step logs its phase wall times."""
import pytest

from tests.test_mappo_trainer import build_trainer
from trainers.common.logging import read_metrics

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_a_step_logs_its_phase_wall_times(tmp_path):
    trainer = build_trainer(tmp_path)
    trainer.train()
    logged = read_metrics(tmp_path)[0]
    phases = ("collect", "rewards", "advantages", "update")
    assert all(logged[f"time/{p}"] > 0 for p in phases)
    assert logged["time/step"] == pytest.approx(sum(logged[f"time/{p}"] for p in phases))
    assert logged["responses"] == 8                                     # 2 debates x 2 agents x 2 turns
