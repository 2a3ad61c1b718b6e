#!/usr/bin/env bash
# GPU readiness check (see experiments/bench/gpu_check.py): profile an 8B Llama-shaped random target in
# bf16 eagerly and with CUDA graphs (compiled path), run the losslessness tests on the GPU on both
# paths, run bench_live --device cuda --compile on (off, static depths, dspark), write results to
# $OUT (or the folder given). Sized for about 8 minutes of an H200; tiny mode on a CPU.
#   bash experiments/gpu_check.sh [OUT_DIR] [extra gpu_check.py flags, e.g. --tiny]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu_check_out}}"
[ $# -gt 0 ] && shift
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi: CPU, tiny mode"
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec python -m specdepth.experiments.bench.gpu_check --out "$out" "$@"
