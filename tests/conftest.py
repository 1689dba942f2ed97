"""Test set-up: point the data loader at the offline copies beside the checkout (../shared/data)."""
import os
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
