"""bench_live's floors: the ECE that finite samples alone give a perfectly calibrated model, and the
cost error that timing jitter alone gives a perfect cost model."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from experiments.bench_live import ece_floor, timing_noise


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
