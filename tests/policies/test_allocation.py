"""DSpark's sorted early-stop allocation (policies/allocation.py, and its numpy reference
policies/kernels_reference.py), on hand-built and random batches.

References here are written the slow, obvious way (a Python loop over slots sorted by (-s, j, r))
so the vectorised fixed-point implementation is checked against the rule as DESIGN.md states it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest

from specdepth.policies.allocation import top_k_lengths
from specdepth.policies.kernels_reference import ColumnAllocator, allocate, free_slots, plan_budgets
from specdepth.policies.testing import LinearCost


@dataclass(frozen=True)
class Knee:
    """Roofline-like cost: flat (memory-bound) up to `knee` step tokens, then `slope` s per token."""

    base: float = 0.020
    knee: float = 8.0
    slope: float = 1e-3
    draft: float = 1e-3
    per_context: float = 0.0  # s per KV token, for context-aware checks

    def target_time(self, n_tokens: np.ndarray | int, context_tokens: int = 0) -> np.ndarray | float:
        n = np.asarray(n_tokens, np.float64)
        return self.base + self.per_context * context_tokens + self.slope * np.maximum(n - self.knee, 0.0)

    def draft_time(self, batch_size: int, context_tokens: int = 0) -> float:
        return self.draft


@dataclass(frozen=True)
class Table:
    """A profiled-table-like cost with arbitrary (non-convex) steps: time[N] for N = 0, 1, ..."""

    times: tuple[float, ...]
    draft: float = 0.0

    def target_time(self, n_tokens: np.ndarray | int, context_tokens: int = 0) -> np.ndarray | float:
        return np.asarray(self.times)[np.minimum(np.asarray(n_tokens), len(self.times) - 1)]

    def draft_time(self, batch_size: int, context_tokens: int = 0) -> float:
        return self.draft


def _t(cost, n: int, context: int = 0) -> float:
    return float(np.asarray(cost.target_time(np.array([n]), context)).ravel()[0])


def theta(surv: np.ndarray, d: np.ndarray, cost, extra: float = 0.0, context: int = 0) -> float:
    """Theta of verify lengths d: expected emitted tokens per second."""
    b = surv.shape[0]
    tau = b + sum(surv[r, : d[r]].sum() for r in range(b))
    return tau / (extra + _t(cost, int(b + d.sum()), context))


def reference(surv: np.ndarray, cost, extra: float = 0.0, context: int = 0, best_prefix: bool = False):
    """(d, Theta) by the rule as written: sort by (-s, j, r), admit until Theta first stops improving.

    best_prefix=True instead takes the best prefix of the order: the leaking variant (a negative control).
    """
    b, j_max = surv.shape
    order = sorted((-surv[r, j], j, r) for r in range(b) for j in range(j_max) if surv[r, j] > 0)
    tau, best = float(b), b / (extra + _t(cost, b, context))
    thetas, taken = [best], 0
    for k, (neg, _, _) in enumerate(order, start=1):
        tau -= neg
        thetas.append(tau / (extra + _t(cost, b + k, context)))
    if best_prefix:
        taken = int(np.argmax(thetas))
    else:
        while taken < len(order) and thetas[taken + 1] > thetas[taken]:
            taken += 1
    d = np.zeros(b, np.int64)
    for _, _, r in order[:taken]:
        d[r] += 1
    return d, thetas[taken]


def random_survival(rng: np.random.Generator, b: int, j: int, lo: float = 0.2) -> np.ndarray:
    """(b, j) running products of random confidences, zero past a random drafted length."""
    conf = rng.uniform(lo, 1.0, (b, j))
    conf[np.arange(j)[None, :] >= rng.integers(0, j + 1, b)[:, None]] = 0.0
    return np.cumprod(conf, axis=1)


# --- hand-built cases ---------------------------------------------------------------------------


def test_flat_cost_admits_every_positive_slot() -> None:
    surv = np.cumprod([[0.9, 0.5, 0.1, 0.0], [0.2, 0.1, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], axis=1)
    assert allocate(surv, LinearCost().target_time).tolist() == [3, 2, 0]


def test_steep_cost_admits_nothing() -> None:
    steep = LinearCost(target_s=0.0, target_per_token_s=1e-3)  # compute-bound: time ~ N
    surv = np.full((4, 3), 0.99)
    assert allocate(surv, steep.target_time).tolist() == [0, 0, 0, 0]


def test_knee_cost_by_hand() -> None:
    # B = 2, base time 1, flat to N = 3, then +0.5 per token. Order: 0.9 (r0), 0.8 (r1), 0.72 (r0 j2)...
    cost = Knee(base=1.0, knee=3, slope=0.5)
    surv = np.array([[0.9, 0.72, 0.36], [0.8, 0.4, 0.2]])
    # k=0: 2/1; k=1: 2.9/1 (N=3); k=2: 3.7/1.5 = 2.47 < 2.9 -> stop after one slot.
    assert allocate(surv, cost.target_time).tolist() == [1, 0]
    # a fixed extra (drafting) makes the marginal slot relatively cheaper: 3.7/2.5 > 2.9/2.0
    assert allocate(surv, cost.target_time, extra_time=1.0).tolist() == [1, 1]


def test_ties_go_to_the_smaller_position_then_the_smaller_sequence() -> None:
    surv = np.ones((3, 2))  # every slot worth 1: the order is (j=1: r0, r1, r2), (j=2: r0, r1, r2)
    four = Table(times=(1.0,) * 8 + (10.0,) * 10)  # free up to N = 7: B = 3 plus 4 slots
    assert allocate(surv, four.target_time).tolist() == [2, 1, 1]
    two = Table(times=(1.0,) * 6 + (10.0,) * 10)  # free up to N = 5: 2 slots
    assert allocate(surv, two.target_time).tolist() == [1, 1, 0]
    assert top_k_lengths(surv, 4).tolist() == [2, 1, 1]
    assert top_k_lengths(surv, 2).tolist() == [1, 1, 0]


def test_top_k_lengths_takes_the_highest_survivals_in_order() -> None:
    surv = np.array([[0.9, 0.85, 0.1], [0.5, 0.2, 0.0]])
    assert top_k_lengths(surv, 0).tolist() == [0, 0]
    assert top_k_lengths(surv, 2).tolist() == [2, 0]  # position 2 of r0 outranks position 1 of r1
    assert top_k_lengths(surv, 3).tolist() == [2, 1]
    assert top_k_lengths(surv, 99).tolist() == [3, 2]  # capped by the positive slots


def test_empty_and_degenerate_inputs() -> None:
    assert allocate(np.zeros((0, 3)), LinearCost().target_time).tolist() == []
    assert allocate(np.zeros((2, 0)), LinearCost().target_time).tolist() == [0, 0]
    assert plan_budgets(np.zeros((0, 4)), LinearCost()).tolist() == []
    assert plan_budgets(np.zeros((3, 0)), LinearCost()).tolist() == [0, 0, 0]
    # NaN is read as 0 and out-of-range survivals are clipped to [0, 1]
    assert allocate(np.array([[0.5, np.nan], [1.5, 2.0]]), LinearCost().target_time).tolist() == [1, 2]


def test_free_slots() -> None:
    assert free_slots(np.array([1.0, 1.0, 1.0, 2.0, 2.0])) == 2
    assert free_slots(np.array([1.0, 1.5])) == 0
    assert free_slots(np.array([1.0, 1.0])) == 1
    assert free_slots(np.array([1.0])) == 0


def test_margin_needs_a_relative_gain() -> None:
    cost = LinearCost(target_s=1.0, target_per_token_s=0.01)
    surv = np.array([[0.9, 0.05]])  # slot 1: +90% tokens for +1% time; slot 2: +2.6% for +1%
    assert allocate(surv, cost.target_time).tolist() == [2]
    assert allocate(surv, cost.target_time, margin=0.05).tolist() == [1]


# --- the rule, checked against the slow reference and by brute force ---------------------------

COSTS = [
    Knee(knee=6, slope=2e-3),
    Knee(knee=3, slope=2e-2),
    LinearCost(target_s=0.02, target_per_token_s=1e-3),
    LinearCost(target_s=0.0, target_per_token_s=1e-3),
    Table(times=(1.0, 1.0, 1.0, 1.0, 1.6, 1.6, 1.6, 1.6, 2.5, 2.5, 2.5, 4.0)),  # non-convex steps
]


@pytest.mark.parametrize("cost", COSTS, ids=lambda c: type(c).__name__)
def test_matches_the_reference_rule(cost) -> None:
    rng = np.random.default_rng(0)
    for _ in range(60):
        surv = random_survival(rng, int(rng.integers(1, 7)), int(rng.integers(1, 6)))
        extra = float(rng.choice([0.0, 0.005]))
        want = reference(surv, cost, extra)[0]
        assert allocate(surv, cost.target_time, extra_time=extra).tolist() == want.tolist()


@pytest.mark.parametrize("cost", COSTS[:4], ids=lambda c: type(c).__name__)
def test_greedy_beats_every_verify_vector_on_convex_costs(cost) -> None:
    # With a convex step time and sorted gains, Theta over prefixes is unimodal, so stopping at the
    # first non-improvement finds the best of all d vectors. Brute force over every d in small cases.
    rng = np.random.default_rng(1)
    for _ in range(25):
        b, j = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        surv = random_survival(rng, b, j)
        got = theta(surv, allocate(surv, cost.target_time), cost)
        for d in itertools.product(range(j + 1), repeat=b):
            assert got >= theta(surv, np.array(d), cost) * (1 - 1e-9)
        for k in range(j + 1):  # static d = k (capped by what was drafted) and d = 0
            assert got >= theta(surv, np.minimum(k, (surv > 0).sum(1)), cost) * (1 - 1e-9)


@pytest.mark.parametrize("cost", COSTS, ids=lambda c: type(c).__name__)
def test_never_worse_than_verifying_nothing(cost) -> None:
    rng = np.random.default_rng(2)
    for _ in range(40):
        surv = random_survival(rng, int(rng.integers(1, 9)), int(rng.integers(1, 6)))
        d = allocate(surv, cost.target_time)
        assert theta(surv, d, cost) >= theta(surv, np.zeros_like(d), cost)
        assert np.all(d <= (surv > 0).sum(1))


def _leaks(alloc, seed: int, trials: int = 150) -> tuple[bool, int, int]:
    """Does perturbing s[r, j+1:] ever change whether (r, j) is admitted (0-based j)?

    Returns:
        (leaked, admitted, refused): and how many admitted / refused slots the sweep probed.
    """
    rng = np.random.default_rng(seed)
    seen = [0, 0]
    for _ in range(trials):
        b, jm = int(rng.integers(1, 5)), int(rng.integers(2, 6))
        surv = random_survival(rng, b, jm, lo=0.3)
        base = alloc(surv)
        for r, j in itertools.product(range(b), range(jm - 1)):
            if surv[r, j] == 0:
                continue
            seen[int(base[r] > j)] += 1
            moved = surv.copy()  # any non-increasing tail below s[r, j]: here a fresh random one
            moved[r, j + 1 :] = surv[r, j] * np.cumprod(rng.uniform(0.0, 1.0, jm - j - 1))
            if (alloc(moved)[r] > j) != (base[r] > j):
                return True, seen[1], seen[0]
    return False, seen[1], seen[0]


@pytest.mark.parametrize("cost", COSTS[:3] + COSTS[4:], ids=lambda c: type(c).__name__)  # not: admits nothing
def test_admission_of_a_slot_never_depends_on_later_positions(cost) -> None:
    leaked, admitted, refused = _leaks(lambda s: allocate(s, cost.target_time), seed=3)
    assert not leaked
    assert admitted > 50 and refused > 50  # the sweep probed both kinds of slot


def test_top_k_admission_never_depends_on_later_positions() -> None:
    probed = np.zeros(2, np.int64)
    for k in (1, 3, 7):
        leaked, admitted, refused = _leaks(lambda s, k=k: top_k_lengths(s, k), seed=5, trials=60)
        assert not leaked
        probed += (admitted, refused)
    assert probed.min() > 50


def test_negative_control_best_prefix_leaks() -> None:
    # Taking the best prefix instead of stopping at the first non-improvement looks ahead: a dip
    # then a rise in Theta (a non-convex cost) lets later slots pull earlier ones in.
    cost = Table(times=(1.0, 1.0, 1.0, 1.5, 1.5, 1.5, 1.5, 3.0))
    assert _leaks(lambda s: reference(s, cost, best_prefix=True)[0], seed=4, trials=400)[0]
    # the same sweep passes for the real rule on that cost
    assert not _leaks(lambda s: allocate(s, cost.target_time), seed=4, trials=400)[0]


def test_column_allocator_equals_allocate_on_every_prefix() -> None:
    rng = np.random.default_rng(5)
    for i in range(120):
        cost = COSTS[i % len(COSTS)]
        b, jm = int(rng.integers(1, 9)), int(rng.integers(1, 7))
        conf = rng.uniform(0.1, 1.0, (b, jm))
        conf[np.arange(jm)[None, :] >= rng.integers(0, jm + 1, b)[:, None]] = 0.0
        surv = np.cumprod(conf, axis=1)
        margin = 0.02 if i % 5 == 0 else 0.0
        col = ColumnAllocator(b, lambda k, b=b, cost=cost: cost.target_time(b + k, 0), margin, i % 3)
        for j in range(jm):
            col.push(conf[:, j])
            want = allocate(surv[:, : j + 1], cost.target_time, margin=margin)
            assert col.lengths().tolist() == want.tolist(), (i, j, col.frozen)


# --- plan_budgets -------------------------------------------------------------------------------


def reference_plan(prior: np.ndarray, cost, context: int = 0) -> np.ndarray:
    b, k_max = prior.shape
    best, out = b / _t(cost, b, context), np.zeros(b, np.int64)
    for depth in range(1, k_max + 1):
        d, th = reference(prior[:, :depth], cost, depth * cost.draft_time(b, context), context)
        if th > best * (1 + 1e-12):
            best, out = th, d
    return out


def test_plan_goes_deep_when_flat_and_switches_off_when_compute_bound() -> None:
    prior = np.cumprod(np.full((16, 8), 0.8), axis=1)
    deep = plan_budgets(prior, LinearCost(target_s=0.02, draft_s=1e-5))
    assert deep.tolist() == [8] * 16
    off = plan_budgets(prior, LinearCost(target_s=0.0, target_per_token_s=1e-4, draft_s=1e-5))
    assert off.tolist() == [0] * 16


def test_plan_prices_the_draft() -> None:
    prior = np.cumprod(np.full((4, 8), 0.7), axis=1)
    cheap = plan_budgets(prior, LinearCost(target_s=0.02, draft_s=1e-5))
    dear = plan_budgets(prior, LinearCost(target_s=0.02, draft_s=0.004))
    unpriced = plan_budgets(prior, LinearCost(target_s=0.02, draft_s=0.004), price_draft=False)
    assert cheap.max() == 8 and 0 < dear.max() < 8 and unpriced.max() == 8


def test_plan_gives_confident_sequences_more() -> None:
    prior = np.cumprod(np.array([[0.95] * 6, [0.6] * 6, [0.3] * 6]), axis=1)
    budgets = plan_budgets(prior, Knee(knee=9, slope=2e-3, draft=5e-4))
    assert budgets[0] > budgets[1] > budgets[2] >= 0


def test_plan_uses_the_context() -> None:
    # KV reads lengthen the memory-bound step, which makes extra step tokens relatively cheaper.
    prior = np.cumprod(np.full((8, 6), 0.75), axis=1)
    cost = Knee(base=0.005, knee=10, slope=1e-3, draft=2e-4, per_context=1e-7)
    assert plan_budgets(prior, cost, context_tokens=500_000).sum() > plan_budgets(prior, cost).sum()


@pytest.mark.parametrize("cost", [Knee(knee=10, slope=2e-3, draft=4e-4), Knee(knee=4, slope=5e-3, draft=1e-3),
                                  LinearCost(target_s=0.02, draft_s=2e-3, target_per_token_s=2e-4),
                                  Table(times=(1.0,) * 12 + (1.3,) * 8 + (2.0,) * 30, draft=0.05)],
                         ids=lambda c: type(c).__name__)
def test_plan_matches_the_reference(cost) -> None:
    rng = np.random.default_rng(6)
    for _ in range(40):
        b, k = int(rng.integers(1, 7)), int(rng.integers(1, 7))
        prior = np.cumprod(rng.uniform(0.2, 1.0, (b, k)), axis=1)
        assert plan_budgets(prior, cost).tolist() == reference_plan(prior, cost).tolist()


def test_tau_upper_is_exact_on_its_head_and_a_bound_beyond() -> None:
    from specdepth.policies.kernels_reference import ONE, _tau_upper
    rng = np.random.default_rng(5)
    for b, k, head in ((3, 4, 128), (256, 8, 128), (64, 8, 16)):
        q_t = (np.cumprod(rng.uniform(0.3, 1.0, (b, k)), axis=1).T * ONE).astype(np.int64)  # (K, B)
        q_t[:, : b // 4] = 0  # some sequences drafted nothing
        exact = np.concatenate(([b * ONE], b * ONE + np.cumsum(np.sort(q_t[q_t > 0])[::-1])))
        got = _tau_upper(q_t, head)
        assert got.shape == exact.shape
        n_exact = min(exact.size, head + 2)
        np.testing.assert_array_equal(got[:n_exact], exact[:n_exact])
        assert np.all(got >= exact)
