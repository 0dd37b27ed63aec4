#!/usr/bin/env bash
# The GPU machine check: `pytest -m gpu` and `prl bench gpu` on a CUDA machine with no network,
# in under 8 minutes, results written to one folder.
#
# That machine has Python 3.12 with torch (CUDA), transformers, safetensors, peft, pyarrow,
# fsspec, numpy, matplotlib, tqdm, pytest, hypothesis and setuptools, and lacks the rest of
# prl's dependencies. Fill the ignored folder .whl/ with them once, on a machine with pip and a
# package registry, from the repository root:
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
#     structlog==26.1.0 kafka-python==3.0.12 zstandard==0.25.0 crc32c==2.9.post0 tomli-w==1.2.0
#
# (8.8 MB; versions as the test command installs them). Then carry .whl/ with the working tree
# and run, from the repository root:   bash tools/gpu_check.sh [RESULTS_DIR [BENCH_ARGS...]]
# RESULTS_DIR defaults to $OUT, else runs/gpu-check. It receives gpu-tests.xml (junit, with the
# tests' figures as properties), bench-gpu.json, and the log of each step. BENCH_ARGS replace
# `prl bench gpu`'s defaults (0.5B and 1.5B, sequences of 2,048 tokens).
set -uo pipefail  # a step that fails, or its timeout, fails the pipeline through tee
cd "$(dirname "$0")/.."
out=${1:-${OUT:-runs/gpu-check}}
shift $(( $# > 0 ? 1 : 0 ))
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
python=${PYTHON:-python3}

step() { echo "== $(date -u +%H:%M:%S) $*"; }

step "install: the wheels prl lacks, then prl itself (no dependencies, no network)"
ls .whl/*.whl >/dev/null 2>&1 || { echo "no wheels in .whl/: fill it as this script's header says"; exit 2; }
$python -m pip install -q --no-index --no-deps --no-compile .whl/*.whl || exit 2
$python -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 2
$python - <<'EOF' | tee "$out/machine.txt"
import torch, transformers
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), transformers {transformers.__version__}")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"cuda:{i} {p.name}, {p.total_memory / 2**30:.0f} GiB")
EOF

status=0
step "pytest -m gpu"
timeout 300 $python -m pytest -m gpu tests/gpu -rA -o junit_family=legacy --junitxml="$out/gpu-tests.xml" \
  2>&1 | tee "$out/gpu-tests.log" || status=1

step "prl bench gpu $*"
timeout 240 $python -m prl.cli bench gpu --json "$out/bench-gpu.json" "$@" 2>&1 | tee "$out/bench-gpu.log" || status=1

step "done (exit $status); results in $out"
exit $status
