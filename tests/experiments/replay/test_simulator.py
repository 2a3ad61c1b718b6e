"""The replay simulator: Leviathan's formulas, `off` is plain decoding, determinism, the oracle is
a ceiling, and greedy replay == the live engine on a tiny random pair."""

from __future__ import annotations

import types

import numpy as np
import pytest

from specdepth.adaptive.controller import Controller
from specdepth.adaptive.cost.model import FixedCost
from specdepth.adaptive.engine import Engine, Request
from specdepth.experiments.cli.synth import synth_traces
from specdepth.experiments.replay.simulator import Arrivals, load_arrivals, replay
from specdepth.experiments.replay.traces import record_traces
from specdepth.policies.oracle import Oracle, OracleUnavailable, best_depth, water_fill
from specdepth.policies.registry import list_policies, make_policy
from specdepth.policies.testing import make_plan_ctx
from tests.pairs import tiny_pair
from specdepth.workers.runner import PairRunner


def leviathan(a: float, k: int, c: float) -> tuple[float, float]:
    """(tokens per step, walltime gain over plain decoding), Leviathan et al. 2023."""
    tokens = (1 - a ** (k + 1)) / (1 - a)
    return tokens, tokens / (k * c + 1)


def fixed(c: float, target_ms: float = 10.0) -> str:
    return f"fixed:target_ms={target_ms},draft_ms={c * target_ms}"


def check_leviathan(a: float, k: int, c: float, concurrency: int, tokens: int) -> None:
    traces = synth_traces(concurrency, tokens, seed=k, alpha=a, k_max=8)
    spec = replay(traces, f"static:k={k}", fixed(c), concurrency=concurrency, requests=concurrency)
    off = replay(synth_traces(concurrency, 20, alpha=a), "off", fixed(c), concurrency=concurrency)
    al, gain = leviathan(a, k, c)
    m = spec.metrics
    assert m["acceptance_length"] == pytest.approx(al, rel=0.01), (m["seq_steps"], m["acceptance_length"], al)
    assert m["goodput_tok_s"] / off.metrics["goodput_tok_s"] == pytest.approx(gain, rel=0.01)
    assert m["mean_step_s"] == pytest.approx((10 + 10 * c * k) * 1e-3, rel=1e-3)  # bar the last, capped steps


def test_leviathan_at_concurrency_1():
    # a = 0.9, k = 2: per-step emitted has a relative sd of 0.24, so ~6500 steps put 1% at > 3 sigma
    check_leviathan(0.9, 2, 0.1, concurrency=1, tokens=17_500)


@pytest.mark.parametrize(("a", "k", "c"), [(0.6, 1, 0.05), (0.6, 4, 0.2), (0.8, 2, 0.1), (0.8, 6, 0.02),
                                           (0.9, 3, 0.3), (0.9, 7, 0.05)])
def test_leviathan_grid(a, k, c):
    # sequences are independent and a fixed cost ignores the batch, so C = 48 is 48 single-sequence
    # runs side by side: ~15k sequence-steps per point (< 1% at > 3 sigma), in a fraction of the time
    al = leviathan(a, k, c)[0]
    check_leviathan(a, k, c, concurrency=48, tokens=int(15_000 / 48 * al))


@pytest.fixture(scope="module")
def syn():
    return synth_traces(12, 64, seed=5, curve=(0.92, 0.85, 0.78, 0.7), k_max=6, prompt_len=512)


def test_off_is_plain_decoding(syn):
    m = replay(syn, "off", "h200", concurrency=4).metrics
    assert m["acceptance_length"] == 1.0 and m["flops_per_token_vs_off"] == 1.0
    assert m["wasted_verify_frac"] == 0.0 and m["seq_steps"] == m["emitted"]


@pytest.mark.parametrize("spec", ["dspark", "hf-confidence", "bandit"])
def test_replay_is_deterministic(syn, spec):
    a = replay(syn, spec, "h200", concurrency=8).metrics
    b = replay(syn, spec, "h200", concurrency=8).metrics
    assert a == b


def test_sampling_replay_is_seeded_and_flagged():
    ts = synth_traces(6, 40, seed=1, alpha=0.8, k_max=4, temperature=1.0)
    a = replay(ts, "static:k=3", "h200", concurrency=3, seed=7)
    b = replay(ts, "static:k=3", "h200", concurrency=3, seed=7)
    assert a.metrics == b.metrics and a.metrics["approximate"]
    assert a.metrics["acceptance_length"] == pytest.approx(leviathan(0.8, 3, 0)[0], rel=0.15)
    oracle = replay(ts, "oracle", "h200", concurrency=3, seed=7).metrics
    assert oracle["goodput_tok_s"] > a.metrics["goodput_tok_s"] and oracle["wasted_verify_frac"] == 0


@pytest.mark.parametrize(("concurrency", "requests"), [(1, 5), (48, 48)])
def test_oracle_is_a_ceiling(syn, concurrency, requests):
    specs = [name for name, _, _ in list_policies()] + ["static:k=1", "static:k=6"]
    good = {spec: replay(syn, spec, "h200", concurrency=concurrency, requests=requests).metrics["goodput_tok_s"]
            for spec in specs}
    best_other = max(v for n, v in good.items() if n != "oracle")
    assert good["oracle"] >= best_other, sorted(good.items(), key=lambda kv: -kv[1])[:3]


def test_oracle_wastes_nothing_and_refuses_live_use(syn):
    m = replay(syn, "oracle", "h200", concurrency=4).metrics
    assert m["wasted_verify_frac"] == 0.0 and m["fallbacks"] == 0 and m["acceptance_length"] > 2
    with pytest.raises(OracleUnavailable, match="only the replay simulator"):
        Oracle().plan(make_plan_ctx(3, max_depth=4))
    ctl = Controller(Oracle(), max_depth=4)  # live: the controller survives it, runs `off`, counts it
    assert ctl.plan(0, np.arange(3), np.full(3, 10)).tolist() == [0, 0, 0] and ctl.fallbacks


def test_oracle_step_choice():
    match = np.array([0, 2, 5, 5])
    # flat target time: verify every matching token, draft as deep as the longest useful match
    d, s = best_depth(match, 4, 0.001, np.full(13, 0.02))
    assert (d, s) == (5, 12)
    assert water_fill(match, 5, 12).tolist() == [0, 2, 5, 5]
    assert water_fill(match, 5, 7).tolist() == [0, 2, 3, 2]
    # expensive drafting: not worth a pass
    assert best_depth(match, 4, 1.0, np.full(13, 0.02)) == (0, 0)


def test_arrival_trace(tmp_path, syn):
    csv = tmp_path / "arr.csv"
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"] + [
        f"2023-11-16 18:17:{i // 10:02d}.{i % 10}000000,{300 + 7 * i},{5 + (i * 37) % 150}" for i in range(40)]
    csv.write_text("\n".join(rows) + "\n")
    arr = load_arrivals(csv)
    assert isinstance(arr, Arrivals) and arr.times[1] == pytest.approx(0.1) and arr.generated[0] == 5
    slow = replay(syn, "dspark", "h200", arrivals=arr, rate_scale=1.0).metrics
    fast = replay(syn, "dspark", "h200", arrivals=arr, rate_scale=4.0).metrics
    for m in (slow, fast):
        assert m["requests_done"] == 40 and m["emitted"] == int(arr.generated.sum())
        assert 0 < m["ttft_p50_s"] < 1 and 0 < m["tpot_p50_s"] <= m["tpot_p99_s"]
    assert fast["goodput_tok_s"] > 2 * slow["goodput_tok_s"]  # under light load goodput follows the offered load
    bad = tmp_path / "bad.csv"
    bad.write_text(rows[0] + "\n" + rows[1] + "\nnot,a,row\n")
    with pytest.raises(ValueError, match=f"{bad}:3: bad row"):
        load_arrivals(bad)


def check_replay_equals_live(pair, prompts: list[list[int]], spec: str, tokens: int, cost: FixedCost,
                             drafter: str = "model") -> None:
    """Record the pair's trace, then run the live engine and the replay with the same policy and a
    fixed cost: every request's output, accepted count and step count must agree exactly."""
    traces = record_traces(pair, prompts, k_max=6, max_new_tokens=tokens, batch=4, progress=False, drafter=drafter)
    live = Engine(PairRunner(pair.target, pair.draft, n_slots=4, max_depth=6, drafter=drafter),
                  Controller(make_policy(spec), 6, cost=cost, learn_cost=False))
    outs = live.run([Request(str(i), p, tokens, ignore_eos=True) for i, p in enumerate(prompts)])
    rep = replay(traces, spec, cost, concurrency=4, requests=len(prompts), drain=True)
    assert [o.output_ids for o in outs] == [r.tokens.tolist() for r in traces.requests]
    assert [o.accepted for o in outs] == rep.accepted.tolist()
    assert [o.steps for o in outs] == rep.steps.tolist()
    assert sum(o.accepted for o in outs) > 0


@pytest.mark.parametrize("spec", ["static:k=3", "dspark", "hf-confidence"])
def test_greedy_replay_equals_the_live_engine(spec):
    target, draft = tiny_pair(noise=0.35, seed=6)
    rng = np.random.default_rng(8)
    prompts = [rng.integers(0, 96, int(rng.integers(1, 10))).tolist() for _ in range(10)]
    pair = types.SimpleNamespace(target=target, draft=draft, name="tiny")
    check_replay_equals_live(pair, prompts, spec, 30, FixedCost(target_ms=10.0, draft_ms=1.0))


@pytest.mark.parametrize("spec", ["static:k=3", "dspark"])
def test_greedy_replay_of_an_ngram_trace_equals_the_live_engine(spec):
    """n-gram drafts are a function of each request's own prefix, so its trace replays exactly;
    both sides price them free and verify them in one call."""
    target, draft = tiny_pair(noise=0.35, seed=6)
    rng = np.random.default_rng(8)
    prompts = [rng.integers(0, 12, int(rng.integers(4, 16))).tolist() for _ in range(10)]
    pair = types.SimpleNamespace(target=target, draft=draft, name="tiny")
    check_replay_equals_live(pair, prompts, spec, 30, FixedCost(target_ms=10.0, draft_ms=1.0), drafter="ngram")


@pytest.mark.parametrize("spec", ["static:k=3", "dspark"])
def test_greedy_replay_equals_live_on_the_bundled_pair(spec):
    """The same check on the real bundled pair and held-out prompts (a few, short)."""
    from specdepth.workers.bundled import heldout_prompts, load_pair
    pair = load_pair(device="cpu")
    prompts = [pair.tokenizer.encode(p) for p in heldout_prompts(4)]
    check_replay_equals_live(pair, prompts, spec, 24, FixedCost(target_ms=7.0, draft_ms=1.2))


@pytest.mark.parametrize("spec", ["arctic-hybrid:k=2", "dspark", "static:k=3"])
def test_greedy_hybrid_replay_of_two_traces_equals_the_live_engine(spec):
    """A draft-model trace and an n-gram trace of the same requests replay the hybrid drafter:
    each step the policy sees the n-gram chain and chooses per sequence, exactly as live."""
    target, draft = tiny_pair(noise=0.35, seed=6)
    rng = np.random.default_rng(8)
    prompts = [rng.integers(0, 12, int(rng.integers(4, 16))).tolist() for _ in range(10)]
    pair = types.SimpleNamespace(target=target, draft=draft, name="tiny")
    cost = FixedCost(target_ms=10.0, draft_ms=1.0)
    model = record_traces(pair, prompts, k_max=6, max_new_tokens=30, batch=4, progress=False)
    free = record_traces(pair, prompts, k_max=6, max_new_tokens=30, batch=4, progress=False, drafter="ngram")
    live = Engine(PairRunner(target, draft, n_slots=4, max_depth=6, drafter="hybrid",
                             drafter_options={"free": "ngram"}),
                  Controller(make_policy(spec), 6, cost=cost, learn_cost=False))
    outs = live.run([Request(str(i), p, 30, ignore_eos=True) for i, p in enumerate(prompts)])
    rep = replay(model, spec, cost, concurrency=4, requests=len(prompts), drain=True, free_traces=free)
    assert [o.output_ids for o in outs] == [r.tokens.tolist() for r in model.requests]
    assert [o.accepted for o in outs] == rep.accepted.tolist()
    assert [o.steps for o in outs] == rep.steps.tolist()
    assert sum(o.accepted for o in outs) > 0


def test_a_hybrid_replay_that_always_keeps_one_chain_is_that_chain_s_replay():
    """Keeping every free chain replays the free trace alone; keeping none, the model trace."""
    from specdepth.policies.static import Static

    class Always(Static):
        def __init__(self, k, keep):
            super().__init__(k)
            self.keep = keep

        def choose_drafter(self, ctx):
            return np.full(len(ctx.seq_ids), self.keep)

    target, draft = tiny_pair(noise=0.35, seed=6)
    rng = np.random.default_rng(9)
    prompts = [rng.integers(0, 12, int(rng.integers(4, 16))).tolist() for _ in range(8)]
    pair = types.SimpleNamespace(target=target, draft=draft, name="tiny")
    model = record_traces(pair, prompts, k_max=4, max_new_tokens=24, batch=4, progress=False)
    free = record_traces(pair, prompts, k_max=4, max_new_tokens=24, batch=4, progress=False, drafter="ngram")
    cost = FixedCost(target_ms=10.0, draft_ms=1.0)
    run = (lambda tr, pol, **kw: replay(tr, pol, cost, concurrency=4, requests=8, drain=True, **kw))
    for keep, alone in ((False, model), (True, free)):
        hy, one = run(model, Always(4, keep), free_traces=free), run(alone, Static(4))  # k = K: the free chain is cut to K either way
        assert hy.accepted.tolist() == one.accepted.tolist() and hy.steps.tolist() == one.steps.tolist()
    with pytest.raises(ValueError, match="not of the same requests"):
        run(model, Static(3), free_traces=record_traces(pair, prompts[:4], k_max=4, max_new_tokens=24, batch=4,
                                                        progress=False, drafter="ngram"))
    with pytest.raises(ValueError, match="a draft-model trace and a model-free one"):
        run(free, Static(3), free_traces=free)
