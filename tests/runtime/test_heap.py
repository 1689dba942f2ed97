"""An HF policy makes glibc keep freed memory, so large activations stop page-faulting in afresh."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from llm_marl.hardware import HEAP_ENV, keep_freed_memory

GLIBC = platform.libc_ver()[0] == "glibc"

# Builds an HF policy on the tiny test model, then allocates and frees a 40 MB tensor (over glibc's
# largest mmap threshold, as a batched prefill's MLP activations are) 30 times, counting each one's page faults.
FAULT_PROBE = r"""
import json, resource, torch
from llm_marl.backends.hf import HFPolicy
from llm_marl.models import tiny_model
model, tokenizer = tiny_model(seed=0)
policy = HFPolicy(model, tokenizer)
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
counts = []
for _ in range(30):
    before = faults()
    x = torch.empty(10 * 2**20).fill_(1.0)              # 40 MB, touched
    del x
    counts.append(faults() - before)
# The first several grow the heap: torch asks for 64-byte aligned blocks, which need a little more than
# the block just freed, until freed neighbours merge. The last 10 show the steady state.
print(json.dumps({"kept": policy.heap.kept, "reason": policy.heap.reason, "counts": counts}))
"""


def probe(heap_setting: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != HEAP_ENV}
    if heap_setting is not None:
        env[HEAP_ENV] = heap_setting
    done = subprocess.run([sys.executable, "-c", FAULT_PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="the setting is glibc's; elsewhere nothing is changed")
def test_policy_keeps_freed_memory_so_a_large_tensor_does_not_fault_again():
    kept, system = probe(None), probe("system")
    assert kept["kept"] and "mallopt" in kept["reason"]
    assert not system["kept"] and "system" in system["reason"]
    pages = 40 * 2**20 / 4096                             # 10,240 pages of 4 KiB
    assert all(n > 0.5 * pages for n in system["counts"][-10:]), system   # glibc's default: mmap per tensor
    assert all(n < 0.02 * pages for n in kept["counts"][-10:]), kept      # freed blocks are reused


def test_bad_heap_setting_is_named():
    with pytest.raises(ValueError, match=f"{HEAP_ENV} must be keep or system; got 'always'"):
        keep_freed_memory({HEAP_ENV: "always"})


def test_first_choice_stands_for_the_process():
    first = keep_freed_memory()
    assert keep_freed_memory({HEAP_ENV: "system"}) is first
