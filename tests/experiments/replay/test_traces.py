"""Trace files: round trips, every kind of malformed file named by file and line, recording on a
tiny random pair checked against an independent greedy reference, synthetic traces' process."""

from __future__ import annotations

import gzip
import json
import types

import numpy as np
import pytest

from specdepth.adaptive.acceptance.model import calibration_error
from specdepth.experiments.cli.synth import synth_traces
from specdepth.experiments.replay.traces import TraceError, load_traces, match_lengths, record_traces
from tests.pairs import tiny_pair
from tests.workers.test_lossless_greedy import reference_greedy

K = 5


@pytest.fixture(scope="module")
def tiny():
    target, draft = tiny_pair(noise=0.35, seed=2)
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, 96, int(rng.integers(1, 10))).tolist() for _ in range(6)]
    pair = types.SimpleNamespace(target=target, draft=draft, name="tiny-target|tiny-draft")
    return pair, prompts, record_traces(pair, prompts, k_max=K, max_new_tokens=24, batch=4, progress=False)


@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz"])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_round_trip(tmp_path, name, temperature):
    ts = synth_traces(3, 17, seed=1, alpha=0.7, k_max=4, temperature=temperature)
    ts.save(tmp_path / name)
    back = load_traces(tmp_path / name)
    assert back.header.k_max == 4 and back.header.temperature == temperature
    assert back.header.meta["alpha"] == 0.7
    for field in ("match", "top1", "entropy", "offsets", "prompt_lens"):
        assert np.array_equal(getattr(back, field), getattr(ts, field)), field
    assert (back.accept_prob is None) == (temperature == 0)
    if temperature:
        assert np.array_equal(back.accept_prob, ts.accept_prob)


def _write(path, lines, gz=False):
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n"
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)


def _good_lines():
    ts = synth_traces(3, 6, seed=0, alpha=0.8, k_max=3)
    return [json.dumps(ts.header.to_json())] + [r.to_json() for r in ts.requests]


def _mutate(i: int, **changes):
    def f(lines):
        obj = json.loads(lines[i])
        obj.update(changes)
        return lines[:i] + [json.dumps({k: v for k, v in obj.items() if v is not None})] + lines[i + 1:]
    return f


BAD = {
    "bad json": (lambda ls: ls[:2] + ['{"id": "x", "prompt_len": 3, "tokens": [1, 2'] + ls[3:], 3, "not valid JSON"),
    "schema": (_mutate(0, schema=2), 1, "schema 2 is not supported"),
    "no header": (lambda ls: ls[1:], 1, "missing header"),
    "header lacks": (_mutate(0, k_max=None), 1, "header lacks k_max"),
    "match range": (_mutate(2, match=[4, 0, 0, 0, 0, 0]), 3, r"match\[0\] = 4 outside \[0, 3\]"),
    "match past end": (_mutate(1, match=[0, 0, 0, 0, 0, 2]), 2, r"match\[5\] = 2 outside \[0, 1\]"),
    "top1 shape": (_mutate(3, top1=[[0.5, 0.5]] * 6), 4, r"top1: expected numbers of shape \[6, 3\]"),
    "top1 range": (_mutate(1, top1=[[1.5, 0.5, 0.5]] * 6), 2, r"top1: values must be finite and \[0, 1\]"),
    "tokens type": (_mutate(2, tokens=["a"] * 6), 3, "tokens: expected integers"),
    "duplicate id": (_mutate(3, id="syn0"), 4, "duplicate request id 'syn0'"),
    "accept_prob in greedy": (_mutate(1, accept_prob=[[0.5] * 3] * 6), 2, "accept_prob in a greedy trace"),
}


@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize("gz", [False, True])
def test_malformed_trace_names_file_and_line(tmp_path, case, gz):
    mutate, line, message = BAD[case]
    path = tmp_path / ("bad.jsonl.gz" if gz else "bad.jsonl")
    _write(path, mutate(_good_lines()), gz)
    with pytest.raises(TraceError, match=f"^{path}:{line}: .*{message}") as err:
        load_traces(path)
    assert "\n" not in str(err.value)


def test_truncated_gzip_names_file_and_line(tmp_path):
    path = tmp_path / "cut.jsonl.gz"
    _write(path, _good_lines() * 1, gz=True)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 12])  # lose the end of the stream
    with pytest.raises(TraceError, match=rf"^{path}:\d+: corrupt or truncated gzip") as err:
        load_traces(path)
    assert "\n" not in str(err.value)


def test_empty_and_header_only(tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_text("")
    with pytest.raises(TraceError, match=f"^{path}:1: empty file"):
        load_traces(path)
    _write(path, _good_lines()[:1])
    with pytest.raises(TraceError, match=f"^{path}: no requests"):
        load_traces(path)


def draft_chain(draft, prefix: list[int], k: int) -> list[int]:
    """The draft's greedy chain from a prefix, by full causal forwards (no cache)."""
    return reference_greedy(draft, prefix, k)


def test_record_matches_a_direct_check(tiny):
    pair, prompts, ts = tiny
    assert ts.header.target == "tiny-target" and ts.header.k_max == K and len(ts) == len(prompts)
    for prompt, req in zip(prompts, ts.requests):
        ref = reference_greedy(pair.target, prompt, 24)
        assert req.tokens.tolist() == ref and req.prompt_len == len(prompt)
        T = len(ref)
        for t in range(T):
            chain = draft_chain(pair.draft, prompt + ref[:t], K)
            want = 0
            while want < min(K, T - t) and chain[want] == ref[t + want]:
                want += 1
            assert req.match[t] == want, (req.id, t)
        assert ((req.top1 > 0) & (req.top1 <= 1)).all() and (req.entropy >= 0).all()
    m = ts.match
    assert 0 < (m > 0).mean() < 1 and m.max() >= 2, "the tiny pair should accept some, not all"


def test_record_round_trips_bit_exactly(tiny, tmp_path):
    _, _, ts = tiny
    ts.save(tmp_path / "r.jsonl.gz")
    back = load_traces(tmp_path / "r.jsonl.gz")
    assert np.array_equal(back.top1, ts.top1) and np.array_equal(back.entropy, ts.entropy)
    assert np.array_equal(back.match, ts.match)


def test_record_sampling_trace(tiny):
    pair, prompts, _ = tiny
    ts = record_traces(pair, prompts[:2], k_max=3, max_new_tokens=6, batch=2, progress=False, temperature=0.8)
    assert ts.header.sampling and ts.accept_prob.shape == (len(ts.match), 3)
    assert ((ts.accept_prob >= 0) & (ts.accept_prob <= 1)).all() and ts.accept_prob.std() > 0


def test_match_lengths_stop_at_the_end_of_the_output():
    tokens = np.array([5, 6, 7, 8])
    chains = np.array([[5, 6, 9], [6, 7, 8], [7, 8, 1], [8, 8, 8]])
    assert match_lengths(chains, tokens).tolist() == [2, 3, 2, 1]


def test_synthetic_process_has_the_requested_acceptance():
    curve = (0.9, 0.7, 0.5)
    ts = synth_traces(20, 500, seed=3, curve=curve, k_max=4)
    t = np.arange(len(ts.match)) - np.repeat(ts.offsets[:-1], ts.lengths)  # output position
    m = ts.match[t < 500 - 4]  # away from the end, where the output cuts chains short
    for j, a in enumerate((0.9, 0.7, 0.5, 0.5)):  # P(match >= j+1 | match >= j) = alpha_j
        n = (m >= j).sum()
        cond = (m[m >= j] > j).mean()
        assert abs(cond - a) < 4 * np.sqrt(a * (1 - a) / n), (j, cond, n)
    # confidence: informative (monotone) but miscalibrated
    ts = synth_traces(20, 500, seed=3, alpha=0.7, k_max=4)
    t1, ok = ts.top1[:, 0], ts.match > 0
    lo, hi = ok[t1 < np.quantile(t1, 0.3)].mean(), ok[t1 > np.quantile(t1, 0.7)].mean()
    assert hi > lo + 0.1
    assert calibration_error(t1, ok) > 0.02  # raw top1 is not the acceptance probability
