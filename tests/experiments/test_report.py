"""RESULTS.md generation: stamped result files become tables with their stamp; unstamped ones are
marked (JSON lines) or refused (JSON); a missing benchmark gets the command that produces it."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from specdepth.experiments import report
from specdepth.experiments.results_io import (RESULTS_DIR, ResultsError, load_result, sidecar, stamp, table,
                                              write_result)

META = {"command": "python -m specdepth.experiments.bench.controller --steps 10", "commit": "abc1234",
        "dirty": [], "date": "2026-12-05T01:02:03+00:00",
        "machine": {"cpu": "Test CPU 9000", "cores": 2, "torch": "2.13.0+cpu", "gpu": None, "python": "3.11.7"}}
ONLY = (report.Section("bench_controller", "Controller decision time", "A caption.", "python -m x"),
        report.Section("sweep", "Sweep", "", "specdepth replay ..."),
        report.Section("bench_live", "Live", "", "python -m specdepth.experiments.bench.live"))


def _replay_rows() -> list[dict]:
    good = {"off": (100.0, 200.0), "static:k=2": (150.0, 180.0), "dspark": (160.0, 210.0), "oracle": (200.0, 240.0)}
    return [{"policy": p, "concurrency": c, "goodput_tok_s": g[i], "approximate": False}
            for p, g in good.items() for i, c in enumerate((1, 64))]


def test_a_stamped_result_becomes_its_table_under_its_stamp(tmp_path: Path) -> None:
    rows = [["dense", 1, 23.94, 30.2, 34.1, 89.1, 87.7, 105.1, 6.0]]
    cols = ["cost", "B", "plan us", "keep us", "verify us", "total us", "quiet us", "p90 us", "depth"]
    data = {"tables": [table("dspark's time per step, K = 8", cols, rows, ["s", "d"] + [".1f"] * 6 + [".0f"])],
            "notes": ["numpy per-call overhead on this machine: 0.69 us"]}
    write_result(tmp_path / "bench_controller.json", "bench_controller", data, META)
    text = report.generate(tmp_path, tmp_path / "RESULTS.md", ONLY)
    expected = ("dspark's time per step, K = 8\n\n"
                "| cost | B | plan us | keep us | verify us | total us | quiet us | p90 us | depth |\n"
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
                "| dense | 1 | 23.9 | 30.2 | 34.1 | 89.1 | 87.7 | 105.1 | 6 |")
    assert expected in text
    assert ("Command: `python -m specdepth.experiments.bench.controller --steps 10`  \n"
            "Commit `abc1234` (clean tree) · 2026-12-05 01:02:03 UTC · Test CPU 9000, 2 cores, "
            "torch 2.13.0+cpu, no GPU") in text
    assert "## Controller decision time\n\nA caption.\n" in text
    assert "- numpy per-call overhead on this machine: 0.69 us" in text


def test_a_missing_benchmark_is_one_line_with_its_command(tmp_path: Path) -> None:
    text = report.generate(tmp_path, tmp_path / "RESULTS.md", ONLY)
    assert ("## Live\n\nNot run since the results format was introduced. To produce it: "
            "`python -m specdepth.experiments.bench.live`\n") in text


def test_replay_lines_with_a_sidecar_are_stamped_and_ratios_are_computed(tmp_path: Path) -> None:
    path = tmp_path / "sweep.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _replay_rows()))
    dirty = dict(META, command="specdepth replay --cost h200", dirty=["adaptive/controller.py"])
    sidecar(path).write_text(json.dumps({"kind": "replay", "meta": dirty}))
    text = report.generate(tmp_path, tmp_path / "RESULTS.md", ONLY)
    assert "| dspark | 160.0 | 210.0 |" in text
    assert "| **dspark / oracle** | 0.800 | 0.875 |" in text
    assert "| **dspark / best peer** | 1.067 | 1.050 |" in text  # static:k=2 at 1, off at 64
    assert "| **dspark / off** | 1.600 | 1.050 |" in text
    assert "Commit `abc1234` (uncommitted changes in 1 file(s): `adaptive/controller.py`)" in text
    assert "sweep.meta" not in text  # the sidecar is not a result of its own


def test_replay_lines_without_a_stamp_are_marked_legacy(tmp_path: Path) -> None:
    (tmp_path / "sweep.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _replay_rows()))
    assert load_result(tmp_path / "sweep.jsonl").meta is None
    text = report.generate(tmp_path, tmp_path / "RESULTS.md", ONLY)
    assert "## Sweep\n\n**Unstamped (legacy)**" in text


@pytest.mark.parametrize("doc", [{"kind": "bench_live", "data": {}},
                                 {"kind": "bench_live", "meta": {"commit": "abc1234"}, "data": {}}])
def test_a_json_result_without_a_full_stamp_is_refused(tmp_path: Path, doc: dict) -> None:
    (tmp_path / "bench_live.json").write_text(json.dumps(doc))
    with pytest.raises(ResultsError, match="bench_live.json"):
        report.generate(tmp_path, tmp_path / "RESULTS.md", ONLY)
    with pytest.raises(ResultsError):
        write_result(tmp_path / "x.json", "bench_live", {}, doc.get("meta", {}))
    assert report.main(["--results", str(tmp_path), "--out", str(tmp_path / "R.md")]) == 2


def test_stamp_names_the_commit_date_and_machine() -> None:
    meta = stamp(["specdepth", "replay", "--cost", "h200"])
    assert meta["command"] == "specdepth replay --cost h200"
    assert set(meta) >= {"command", "commit", "dirty", "date", "machine"}
    assert meta["machine"]["cores"] >= 1 and meta["machine"]["cpu"]


def test_the_stamping_wrapper_writes_a_sidecar_after_the_command_succeeds(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    write = f"open({str(out)!r}, 'w').write('{{\"policy\": \"off\", \"concurrency\": 1, \"goodput_tok_s\": 1.0}}\\n')"
    cmd = [sys.executable, "-m", "specdepth.experiments.results_io", str(out), "--", sys.executable, "-c", write]
    subprocess.run(cmd, check=True, capture_output=True)
    res = load_result(out)
    assert res.meta is not None and res.meta["command"] == shlex.join(cmd[5:])
    failing = [sys.executable, "-m", "specdepth.experiments.results_io", str(tmp_path / "f.jsonl"), "--",
               sys.executable, "-c", "raise SystemExit(3)"]
    assert subprocess.run(failing, capture_output=True).returncode == 3
    assert not sidecar(tmp_path / "f.jsonl").exists()


def test_the_committed_results_md_is_what_the_committed_results_give() -> None:
    committed = RESULTS_DIR.parent.parent / "RESULTS.md"
    if not committed.exists():
        pytest.skip("no RESULTS.md beside this install (not a checkout)")
    assert committed.read_text() == report.generate(), "rerun: python -m specdepth.experiments.report"
