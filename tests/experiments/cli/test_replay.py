"""`specdepth synth | replay | tune | record` end to end through their argparse entry points."""

from __future__ import annotations

import argparse
import json
import sys
import types

import pytest

from specdepth.experiments.cli import record as cmd_record, replay as cmd_replay, synth as cmd_synth, tune as cmd_tune
from specdepth.experiments.cli.tune import bands
from specdepth.experiments.replay.traces import load_traces
from tests.pairs import tiny_pair


def cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    for mod in (cmd_record, cmd_replay, cmd_synth, cmd_tune):
        mod.register(sub)
    args = parser.parse_args(list(argv))
    return args.func(args)


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("tr") / "syn.jsonl.gz"
    assert cli("synth", "--out", str(path), "--requests", "8", "--tokens", "48", "--seed", "1",
               "--curve", "0.9,0.8,0.7", "--k-max", "6") == 0
    return path


def test_replay_table_json_and_plot(trace, tmp_path, capsys):
    out, png = tmp_path / "r.jsonl", tmp_path / "r.png"
    assert cli("replay", "--trace", str(trace), "--policy", "off", "--policy", "static:k=3", "--policy", "oracle",
               "--concurrency", "1,4", "--cost", "h200", "--json", str(out), "--plot", str(png),
               "--no-progress") == 0
    text = capsys.readouterr().out
    assert text.count("static:k=3") == 2 and "goodput" in text
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["policy"], r["concurrency"]) for r in rows] == [
        (p, c) for p in ("off", "static:k=3", "oracle") for c in (1, 4)]
    for key in ("goodput_tok_s", "acceptance_length", "mean_step_s", "tpot_p50_s", "tpot_p99_s", "ttft_p50_s",
                "wasted_verify_frac", "flops_per_token_vs_off", "steps", "seq_steps", "fallbacks"):
        assert all(key in r for r in rows), key
    assert png.stat().st_size > 10_000


def test_replay_arrivals(trace, tmp_path, capsys):
    csv = tmp_path / "a.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:17:0{i // 4}.{25 * (i % 4):02d}00000,{500 + i},{10 + 9 * i}\n" for i in range(12)))
    out = tmp_path / "a.jsonl"
    assert cli("replay", "--trace", str(trace), "--policy", "dspark", "--arrivals", str(csv),
               "--rate-scale", "1,2", "--json", str(out), "--no-progress") == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["rate_scale"] for r in rows] == [1.0, 2.0] and all(r["requests_done"] == 12 for r in rows)


def test_replay_reports_a_bad_trace_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "specdepth-trace", "schema": 9}\n')
    assert cli("replay", "--trace", str(bad), "--policy", "off", "--concurrency", "1", "--no-progress") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"specdepth replay: error: {bad}:1: trace schema 9") and "\n" not in err


def test_tune_prints_a_vllm_table(trace, capsys):
    assert cli("tune", "--trace", str(trace), "--cost", "h200", "--concurrency", "1,16,256", "--k-max", "4",
               "--requests", "16", "--no-progress") == 0
    table = json.loads(capsys.readouterr().out)
    assert table[0][0] == 1 and table[-1][1] == 256
    assert all(lo <= hi for lo, hi, _ in table) and all(b[0] == a[1] + 1 for a, b in zip(table, table[1:]))
    assert all(0 <= k <= 4 for _, _, k in table)


def test_bands():
    assert bands({1: 5, 2: 5, 4: 3, 64: 0}, 256) == [[1, 2, 5], [3, 16, 3], [17, 256, 0]]
    assert bands({8: 2}, 256) == [[1, 256, 2]]


def test_record_command(tmp_path, monkeypatch, capsys):
    target, draft = tiny_pair(seed=1)
    pair = types.SimpleNamespace(target=target, draft=draft, tokenizer=None, name="t|d", eos_ids=())
    fake = types.SimpleNamespace(load_pair=lambda *a, **k: pair, heldout_prompts=lambda: [[1, 2, 3], [4, 5]])
    monkeypatch.setitem(sys.modules, "specdepth.workers.bundled", fake)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": [7, 8, 9]}\n')
    out = tmp_path / "rec.jsonl.gz"
    assert cli("record", "--out", str(out), "--n", "2", "--max-new-tokens", "6", "--k-max", "3",
               "--no-progress") == 0
    ts = load_traces(out)
    assert len(ts) == 2 and ts.k_max == 3 and ts.header.target == "t" and ts.header.draft == "d"
    assert [r.prompt_len for r in ts.requests] == [3, 2] and ts.lengths.tolist() == [6, 6]
    assert cli("record", "--out", str(out), "--prompts", str(prompts), "--no-progress", "--max-new-tokens", "4") == 0
    assert load_traces(out).prompt_lens.tolist() == [3] and "wrote" in capsys.readouterr().out
    prompts.write_text('{"prompt": 7}\n')
    assert cli("record", "--out", str(out), "--prompts", str(prompts), "--no-progress") == 2
    assert f"{prompts}:1:" in capsys.readouterr().err


def test_replay_of_the_hybrid_drafter_from_two_recorded_traces(tmp_path, monkeypatch, capsys):
    """`record` a draft-model trace and a suffix one of the same prompts, `replay --hybrid-trace`
    them; a trace of other requests is refused in one line."""
    from specdepth.workers import bundled
    target, draft = tiny_pair(noise=0.35, seed=6)
    pair = types.SimpleNamespace(target=target, draft=draft, name="tiny", tokenizer=None, eos_ids=())
    monkeypatch.setattr(bundled, "load_pair", lambda *a, **k: pair)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": [1 + i % 5, 2, 3, 1 + i % 5, 2]}) + "\n" for i in range(6)))
    paths = {}
    for drafter, n in (("model", "6"), ("suffix", "6"), ("suffix", "3")):
        paths[drafter, n] = tmp_path / f"{drafter}{n}.jsonl.gz"
        assert cli("record", "--out", str(paths[drafter, n]), "--prompts", str(prompts), "--n", n, "--drafter",
                   drafter, "--max-new-tokens", "16", "--k-max", "4", "--batch", "3", "--no-progress") == 0
    capsys.readouterr()
    assert cli("replay", "--trace", str(paths["model", "6"]), "--hybrid-trace", str(paths["suffix", "6"]),
               "--policy", "arctic-hybrid:k=2", "--policy", "dspark", "--concurrency", "1,4",
               "--cost", "fixed:target_ms=10,draft_ms=2", "--no-progress") == 0
    assert capsys.readouterr().out.count("arctic-hybrid:k=2") == 2
    assert cli("replay", "--trace", str(paths["model", "6"]), "--hybrid-trace", str(paths["suffix", "3"]),
               "--policy", "dspark", "--concurrency", "1", "--no-progress") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specdepth replay: error: the model-free trace is not of the same requests") and "\n" not in err
