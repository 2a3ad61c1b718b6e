"""experiments/gpu_check.sh end to end on the CPU, tiny mode: it profiles, writes the cost table
and a summary, runs the losslessness test it selects on the device, and prints the table."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from specdepth.adaptive.cost.model import ProfiledCost, load_cost

REPO = Path(__file__).resolve().parents[3]


def test_gpu_check_runs_in_tiny_mode_on_cpu(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "SPECDEPTH_DEVICE")}
    env["CUDA_VISIBLE_DEVICES"] = ""  # CPU even where a GPU exists: this is the tiny-mode test
    proc = subprocess.run(["bash", str(REPO / "experiments" / "gpu_check.sh"), str(tmp_path), "--device", "cpu"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "target step ms" in proc.stdout and "losslessness tests on cpu: PASS" in proc.stdout
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    assert summary["tiny"] and summary["device"] == "cpu"
    assert summary["lossless_tests"]["passed"] >= 1 and summary["lossless_tests"]["returncode"] == 0
    cost = load_cost(summary["profile"])
    assert isinstance(cost, ProfiledCost) and cost.meta["device"] == "cpu"
    assert (tmp_path / "lossless.log").stat().st_size > 0
