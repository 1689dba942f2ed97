#!/usr/bin/env bash
# The GPU check: the `gpu` tests (tests/runtime/test_gpu.py) and the bf16-vs-float32 MAGRPO step time
# (benchmarks/gpu_precision.py) on a CUDA machine that has PyTorch, transformers, PEFT and accelerate but
# no network and not the rest of the project's dependencies. Run from the repository root, in two places:
#
#   benchmarks/gpu_check.sh prepare   # where the project is installed and the package index is reachable:
#                                     # wheels of the missing packages into .whl/, the embedded model's
#                                     # tokenizer and configuration (no weights) into .gpu_check/cache/
#   benchmarks/gpu_check.sh           # on the GPU machine, with .whl/ and .gpu_check/ copied beside the code:
#                                     # installs the wheels into a temporary folder, writes to $OUT
#                                     # (default .gpu_check/out): versions.txt, gpu.log, gpu.xml, precision.log
#
# A dry run on a machine without a GPU (the tests skip): GPU_CHECK_PRECISION_ARGS="--device cpu --models tiny".
# Needs no data folder (the tests use the tiny random Llama and the say-a-number env). Exits with pytest's status.
set -uo pipefail
cd "$(dirname "$0")/.."

# what the gpu tests import that such a machine lacks (pure-Python wheels), at the versions installed here
PACKAGES=(pettingzoo gymnasium farama-notifications)
CACHE=.gpu_check/cache

if [ "${1:-}" = "prepare" ]; then
    set -e
    mkdir -p .whl
    for name in "${PACKAGES[@]}"; do
        version=$(python3 -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            --platform any -d .whl "$name==$version"
    done
    # the tiny test model's tokenizer is SmolLM2's; its GGUF package is too large to copy, the converted
    # configuration and tokenizer are not (llm_marl.models.resolve reads a cached conversion first)
    python3 - "$CACHE" <<'PY'
import shutil
import sys
from pathlib import Path

from llm_marl.models import DEFAULT_MODEL, resolve

source, target = Path(resolve(DEFAULT_MODEL)), Path(sys.argv[1]) / "models" / DEFAULT_MODEL
target.mkdir(parents=True, exist_ok=True)
for path in source.iterdir():
    if path.is_file() and path.suffix != ".safetensors":
        shutil.copy2(path, target / path.name)
print(f"prepared {target}: {sorted(p.name for p in target.iterdir())}")
PY
    ls -l .whl && du -sh .whl .gpu_check
    exit 0
fi

OUT=${OUT:-.gpu_check/out}
mkdir -p "$OUT"
SITE=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" LLM_MARL_CACHE="$PWD/$CACHE" OMP_NUM_THREADS=4 PYTHONUNBUFFERED=1
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 - <<'PY'
import importlib.metadata as m
import platform

import torch

print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "nccl", ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None)
print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
      "bf16", torch.cuda.is_available() and torch.cuda.is_bf16_supported())
for name in ("transformers", "peft", "accelerate", "tokenizers", "numpy", "pytest", "pettingzoo", "gymnasium"):
    print(name, m.version(name))
PY
} 2>&1 | tee "$OUT/versions.txt"

timeout 270 python3 -m pytest -m gpu tests/runtime/test_gpu.py -v -rA -p no:cacheprovider --junitxml="$OUT/gpu.xml" 2>&1 \
    | tee "$OUT/gpu.log"
status=${PIPESTATUS[0]}
# shellcheck disable=SC2086  # word splitting intended: extra arguments (a dry run: --device cpu --models tiny)
timeout 100 python3 benchmarks/gpu_precision.py ${GPU_CHECK_PRECISION_ARGS:---steps 2} 2>&1 | tee "$OUT/precision.log"
echo "gpu_check: pytest exit status $status; outputs in $OUT"
exit "$status"
