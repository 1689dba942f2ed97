"""Test set-up: offline data beside the checkout (../shared/data) and a passive OpenMP wait policy.

OpenMP threads that spin-wait collapse when the cores are oversubscribed (another job on a
2-core CI box): a small matmul then takes ~18 ms instead of ~20 us. A passive wait policy
costs little on an idle machine and keeps the suite's time stable on a busy one. It must be
set before torch is imported, hence here.
"""
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

if "LLM_MARL_DATA_DIR" not in os.environ and SHARED_DATA.is_dir():
    os.environ["LLM_MARL_DATA_DIR"] = str(SHARED_DATA)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The offline data folder; tests needing it fail (not skip) when it is missing."""
    path = Path(os.environ.get("LLM_MARL_DATA_DIR", SHARED_DATA))
    if not path.is_dir():
        raise RuntimeError(f"offline data not found at {path}; set LLM_MARL_DATA_DIR to ../shared/data")
    return path


@pytest.fixture
def one_torch_thread():
    """Run a test's torch ops on one thread (restored afterwards): tiny-model tests are per-op-overhead bound,
    and on a loaded shared CPU two spinning threads are several times slower than one."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
