"""The vLLM peer harness's own parts, without vLLM (the benchmark runs in its venv, not in CI)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from specdepth.experiments.peers.vllm.bench import CONFIGS, first_difference, served_ratios, vllm_config


def test_every_named_configuration_maps_to_a_speculative_config() -> None:
    assert vllm_config("none", "D") is None
    assert vllm_config("draft:3", "D") == {"method": "draft_model", "model": "D", "num_speculative_tokens": 3}
    for name in CONFIGS:
        cfg = vllm_config(name, "D")
        assert cfg is None or cfg["num_speculative_tokens"] >= 1
    with pytest.raises(ValueError, match="unknown vLLM configuration 'eagle'"):
        vllm_config("eagle", "D")


def test_bad_flags_and_a_missing_venv_are_one_line_errors(tmp_path) -> None:
    run = [sys.executable, "-m", "specdepth.experiments.peers.vllm.bench"]
    bad = subprocess.run(run + ["--configs", "none,eagle"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown vLLM configuration 'eagle'" in bad.stderr
    none = subprocess.run(run + ["--venv", str(tmp_path / "nowhere")], capture_output=True, text=True)
    assert none.returncode == 2 and "no vLLM venv at" in none.stderr and "setup.sh" in none.stderr
    assert "Traceback" not in bad.stderr + none.stderr


def test_a_difference_is_located_with_the_targets_two_top_logits() -> None:
    from specdepth.workers.bundled import load_pair
    pair = load_pair(device="cpu")
    prompt = pair.tokenizer.encode("def parse_args(argv):")
    ref = [5, 6, 7]
    assert first_difference(pair, prompt, ref, list(ref)) is None
    diff = first_difference(pair, prompt, ref, [5, 9, 7])
    assert diff["position"] == 1 and diff["ours"] == 6 and diff["theirs"] == 9
    assert len(diff["top2"]) == 2 and diff["gap"] >= 0.0
    assert first_difference(pair, prompt, ref, [5, 6])["length"] == [3, 2]


def test_served_ratios_pair_each_server_with_its_own_engine() -> None:
    row = dict(goodput=100.0, ttft_p50=0.010, ttft_p99=0.0, tpot_p50=0.0, tpot_p99=0.0)
    serving = [{"engine": "vllm", "config": "none", "path": "offline", "concurrency": 8, **row},
               {"engine": "vllm", "config": "none", "path": "served", "concurrency": 8,
                **{**row, "goodput": 80.0, "ttft_p50": 0.025}},
               {"engine": "specdepth", "config": "off", "path": "served", "concurrency": 8, **row}]  # no offline: skipped
    (e, c, C, ratio, added), = served_ratios(serving)
    assert (e, c, C) == ("vllm", "none", 8) and ratio == pytest.approx(0.8) and added == pytest.approx(15.0)
