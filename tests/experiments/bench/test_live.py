"""bench_live's floors: the ECE that finite samples alone give a perfectly calibrated model, and the
cost error that timing jitter alone gives a perfect cost model."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from specdepth.experiments.bench.live import ece_floor, timing_noise


def tally(n: int, seed: int, bias: float = 0.0) -> np.ndarray:
    """(15, 3) n, sum predicted, sum realised, of n predictions whose outcomes come from p + bias."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(size=n)
    y = rng.uniform(size=n) < np.clip(p + bias, 0, 1)
    m = np.zeros((15, 3))
    np.add.at(m, np.minimum((p * 15).astype(int), 14), np.stack([np.ones(n), p, y], 1))
    return m


def ece(m: np.ndarray) -> float:
    return float(np.abs(m[:, 1] - m[:, 2]).sum() / m[:, 0].sum())


def test_the_floor_is_what_a_calibrated_model_scores_and_shrinks_with_the_sample():
    small = [ece(tally(2000, s)) for s in range(40)]
    assert abs(ece_floor(tally(2000, 0)) - np.mean(small)) < 0.004  # ~0.027 at 2000 predictions
    assert ece_floor(tally(50_000, 0)) < ece_floor(tally(2000, 0)) / 4  # ~1 / sqrt(n)
    assert ece(tally(2000, 0, bias=0.08)) > 2 * ece_floor(tally(2000, 0))  # a miscalibration stands out


def test_timing_noise_is_the_jitter_around_a_drifting_step_time():
    rng = np.random.default_rng(0)
    t = np.linspace(0.020, 0.030, 400) * (1 + rng.uniform(-0.1, 0.1, 400))  # drift, +-10% jitter
    eng = SimpleNamespace(stats=SimpleNamespace(step_log=[(64, 0, 0.0, x, 0, 0, 0.0) for x in t]))
    assert 0.035 < timing_noise(eng) < 0.055  # median |uniform(-0.1, 0.1)| = 0.05 (a step is in its own window: a little less); the drift is not counted
    quiet = SimpleNamespace(stats=SimpleNamespace(step_log=[(64, 0, 0.0, x, 0, 0, 0.0) for x in np.linspace(0.02, 0.03, 50)]))
    assert timing_noise(quiet) < 1e-3
    assert np.isnan(timing_noise(SimpleNamespace(stats=SimpleNamespace(step_log=[]))))


def test_rounds_start_from_each_policys_warmed_controller() -> None:
    """`warm_at`: every policy serves untimed steps at the batch size first; each round then starts
    from copies of that controller (its policy's state, cost and acceptance models), its step and
    sequence numbers continued, and the rounds stay independent of each other."""
    import random

    from specdepth.adaptive.acceptance.model import AcceptanceModel
    from specdepth.adaptive.cost.model import FixedCost
    from specdepth.experiments.bench.live import run_round, warm_at
    from specdepth.workers.bundled import heldout_prompts, load_pair

    pair = load_pair(device="cpu")
    prompts = [pair.tokenizer.encode(p) for p in heldout_prompts()[:6]]
    cost, acc = FixedCost(target_ms=10.0, draft_ms=1.0), AcceptanceModel()
    warm = warm_at(pair, ["dspark", "off"], prompts[:3], 2, 6, 4, cost, acc, random.Random(0))
    assert warm["dspark"].step_no == 6 and warm["dspark"].seq_no >= 2
    warmed = warm["dspark"].ctl
    assert warmed.acceptance.metrics.sum() == 0 and warmed.policy._measure.buckets  # tallies reset; the gate kept
    seen = warmed.acceptance.cells.sum()
    assert seen > acc.cells.sum()  # it learned from the warm-up's steps
    for _ in range(2):
        res = run_round(pair, ["dspark", "off"], prompts[3:], 2, 3, 4, cost, acc, random.Random(1), warm)
        _, eng, ctl = res["dspark"]
        assert eng.step_no == 9 and ctl.policy is not warmed.policy and ctl.policy._measure.buckets.keys() == warmed.policy._measure.buckets.keys()
        assert ctl.acceptance.cells.sum() > seen  # from the warmed model, then this round's steps
    assert warmed.acceptance.cells.sum() == seen and warm["dspark"].step_no == 6  # left as it was


def test_a_bare_static_engine_runs_with_no_controller() -> None:
    """`bare:k=N`: the engine takes its budgets from a plain function, with no controller (nothing
    calibrated, learned or asked), and emits what the same static depth under the controller does."""
    import random

    from specdepth.adaptive.acceptance.model import AcceptanceModel
    from specdepth.adaptive.cost.model import FixedCost
    from specdepth.experiments.bench.live import run_round, warm_at
    from specdepth.workers.bundled import heldout_prompts, load_pair

    pair = load_pair(device="cpu")
    prompts = [pair.tokenizer.encode(p) for p in heldout_prompts()[:5]]
    cost, acc = FixedCost(target_ms=10.0, draft_ms=1.0), AcceptanceModel()
    specs = ["bare:k=2", "static:k=2"]
    warm = warm_at(pair, specs, prompts[:2], 2, 3, 4, cost, acc, random.Random(0))
    assert warm["bare:k=2"].ctl is None and warm["bare:k=2"].step_no == 3
    res = run_round(pair, specs, prompts[2:], 2, 4, 6, cost, acc, random.Random(1), warm)
    (_, bare, none), (_, ruled, ctl) = res["bare:k=2"], res["static:k=2"]
    assert none is None and ctl is not None
    assert bare.stats.pos_verified[:2].min() > 0 and bare.stats.pos_verified[2:].sum() == 0  # 2 deep
    assert bare.stats.emitted == ruled.stats.emitted and bare.stats.seq_steps == ruled.stats.seq_steps
