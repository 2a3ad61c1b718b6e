"""hf-heuristic and hf-confidence: transformers' assisted-generation schedules, by hand."""

from __future__ import annotations

import numpy as np
import pytest

from specdepth.policies.hf import HfConfidence, HfHeuristic, fit_confidence_threshold
from specdepth.policies.testing import make_draft_ctx, make_outcome, make_plan_ctx

# ---- hf-heuristic ------------------------------------------------------------------------------


def test_heuristic_up_two_after_full_match_down_one_after_miss() -> None:
    p = HfHeuristic()
    assert p.plan(make_plan_ctx(1, max_depth=16)).tolist() == [5]
    p.observe(make_outcome(accepted=[5], verified=[5]))  # every drafted token matched
    assert p.plan(make_plan_ctx(1, max_depth=16)).tolist() == [7]
    p.observe(make_outcome(accepted=[6], verified=[7]))  # one miss
    assert p.plan(make_plan_ctx(1, max_depth=16)).tolist() == [6]


def test_heuristic_floor_one_and_zero_verified_is_a_miss() -> None:
    p = HfHeuristic()
    for _ in range(10):
        p.observe(make_outcome(accepted=[0], verified=[1]))
    assert p.current(0) == 1
    p.observe(make_outcome(accepted=[0], verified=[0]))  # nothing verified: not a full match
    assert p.current(0) == 1


def test_heuristic_is_per_sequence_capped_and_forgets_finished() -> None:
    p = HfHeuristic()
    ids = [10, 20]
    p.observe(make_outcome(accepted=[3, 1], verified=[3, 3], seq_ids=ids))
    assert p.plan(make_plan_ctx(2, seq_ids=ids, max_depth=16)).tolist() == [7, 4]
    assert p.plan(make_plan_ctx(2, seq_ids=ids, max_depth=6)).tolist() == [6, 4]  # budget capped ...
    assert p.current(10) == 7  # ... counter kept
    p.observe(make_outcome(accepted=[7, 0], verified=[7, 1], seq_ids=ids, finished=[10]))
    assert p.current(10) == 5 and p.current(20) == 3  # 10 finished: a new request 10 starts over


# ---- hf-confidence -----------------------------------------------------------------------------


def test_confidence_stops_after_a_low_top1() -> None:
    p = HfConfidence(threshold=0.4)
    ctx = make_draft_ctx([[0.9, 0.3], [0.9, 0.5], [0.35], [0.4]])
    assert p.keep_drafting(ctx).tolist() == [False, True, False, True]  # 0.4 is not below 0.4


def test_confidence_budget_is_k_max_capped() -> None:
    assert HfConfidence(k_max=20).plan(make_plan_ctx(2, max_depth=8)).tolist() == [8, 8]
    assert HfConfidence(k_max=3).plan(make_plan_ctx(2, max_depth=8)).tolist() == [3, 3]


def test_fit_threshold_separable_data() -> None:
    p = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.3, 0.2])
    m = np.array([1, 1, 1, 1, 0, 0, 0], bool)
    assert fit_confidence_threshold(p, m) == 0.6  # no false negatives, no false positives


def test_fit_threshold_weights_false_negatives_three_times() -> None:
    # matched at 0.9, 0.3, 0.25; not matched at 0.5.
    p = np.array([0.9, 0.3, 0.25, 0.5])
    m = np.array([1, 1, 1, 0], bool)
    # thr 0.9: fpr 0, fnr 2/3; thr 0.25: fpr 1, fnr 0. fpr + 3 fnr prefers 0.25 (1 < 2) ...
    assert fit_confidence_threshold(p, m, fn_weight=3.0) == 0.25
    # ... fpr + fnr prefers 0.9 (2/3 < 1).
    assert fit_confidence_threshold(p, m, fn_weight=1.0) == 0.9


def test_confidence_pairs_stop_at_first_mismatch() -> None:
    p = HfConfidence(min_pairs=100)  # no refit here
    p.observe(
        make_outcome(
            accepted=[2, 2, 0],
            verified=[4, 2, 0],
            top1=[[0.9, 0.8, 0.2, 0.7], [0.6, 0.65], []],
        )
    )
    probs, matched = p.pairs()
    # seq 0: positions 1-2 matched, 3 is the first mismatch, 4 unobserved; seq 1: both matched.
    assert probs.tolist() == [0.9, 0.8, 0.2, 0.6, 0.65]
    assert matched.tolist() == [True, True, False, True, True]
    assert p.threshold == 0.4


def test_confidence_refits_threshold_then_stops_on_it() -> None:
    p = HfConfidence(threshold=0.4, min_pairs=5)
    p.observe(make_outcome(accepted=[2, 2], verified=[4, 2], top1=[[0.9, 0.8, 0.2, 0.7], [0.6, 0.65]]))
    assert p.threshold == pytest.approx(0.6)  # every match is >= 0.6, the one mismatch below
    assert p.keep_drafting(make_draft_ctx([[0.9, 0.5]])).tolist() == [False]


def test_confidence_no_refit_with_one_class_or_off_period() -> None:
    p = HfConfidence(threshold=0.4, min_pairs=2)
    p.observe(make_outcome(accepted=[3], verified=[3], top1=[[0.9, 0.8, 0.7]]))  # only matches
    assert p.threshold == 0.4
    q = HfConfidence(threshold=0.4, min_pairs=2, refit_every=2)
    q.observe(make_outcome(accepted=[1], verified=[2], top1=[[0.9, 0.1]]))  # step 1: not a refit step
    assert q.threshold == 0.4
    q.observe(make_outcome(accepted=[1], verified=[2], top1=[[0.8, 0.2]]))  # step 2: refit
    assert q.threshold == pytest.approx(0.8)


def test_confidence_window_keeps_newest_pairs() -> None:
    p = HfConfidence(window=4, min_pairs=100)
    p.observe(make_outcome(accepted=[3], verified=[3], top1=[[0.1, 0.2, 0.3]]))
    p.observe(make_outcome(accepted=[2], verified=[3], top1=[[0.4, 0.5, 0.6]]))
    probs, matched = p.pairs()
    assert probs.tolist() == [0.3, 0.4, 0.5, 0.6]
    assert matched.tolist() == [True, True, True, False]
