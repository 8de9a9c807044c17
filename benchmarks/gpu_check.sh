#!/usr/bin/env bash
# Attention kernel checks on a lent one-GPU CUDA machine: correctness against the math kernel, a one-process
# ring simulation against SDPA autograd, and throughput against SDPA (see benchmarks/gpu_check.py).
#   bash benchmarks/gpu_check.sh [--quick] [--device cpu] [--seq 8192 32768] [--iters 5]
# Exit code: 0 all passed, 1 a check failed, 2 no CUDA, 124 over the 290 s limit. PYTHON overrides the interpreter.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
timeout 290 "${PYTHON:-python}" benchmarks/gpu_check.py "$@"
