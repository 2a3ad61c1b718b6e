"""Online refinement of the profiled cost model: bounded corrections, the shared speed, the draft
ratio, the overhead lines, and the renamed `cell_share`."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from specdepth.adaptive.cost.model import CostModel, load_cost
from tests.adaptive.cost.test_model import make_profiled


def test_one_slow_step_moves_prediction_at_most_a_few_percent():
    c = make_profiled()
    bound = (1 + c.max_step * c.cell_share) * (1 + c.speed_max_step)  # the cells', then the speed's
    before = c.target_time(np.arange(1, 129), 1000)
    c.observe(16, 1000, 100 * c.target_time(16, 1000), 8, 2, 100 * 2 * c.draft_time(8, 1000))
    after = c.target_time(np.arange(1, 129), 1000)
    assert np.all(after / before <= bound + 1e-9) and np.all(after >= before)
    assert after[15] / before[15] > 1.05  # the speed follows the machine fast
    for _ in range(6):  # ... and back: steps at the table's own time undo the outlier
        c.observe(16, 1000, before[15], 8, 2, 2 * c.draft_time(8, 1000) / np.exp(c.speed_logcorr))
    assert c.target_time(16, 1000) / before[15] < 1.02
    after = c.target_time(np.arange(1, 129), 1000)
    c.observe(16, 1000, 1e-3 * c.target_time(16, 1000), 8, 2, 0.0)  # absurdly fast: bounded too
    assert np.all(c.target_time(np.arange(1, 129), 1000) / after >= 1 / bound - 1e-9)


def test_a_profile_saved_with_the_old_speed_share_reads_as_cell_share():
    """`cell_share` was saved as `speed_share`, the share the cells left: 1 - it, the same float."""
    c = make_profiled()
    assert c.cell_share == 1.0 - 0.67 and "speed_share" not in c.to_dict()
    old = {k: v for k, v in c.to_dict().items() if k != "cell_share"}
    back = CostModel.from_dict({**old, "speed_share": 0.5})
    assert back.cell_share == 0.5
    assert CostModel.from_dict({**old, "speed_share": 0.67}).to_dict() == c.to_dict()
    assert load_cost("experiments/profiles/cpu-bundled.json").cell_share == c.cell_share


def test_consistent_observations_converge():
    c = make_profiled()
    truth, draft_truth = 1.3 * c.target_time(24, 2000), 1.25 * c.draft_time(8, 2000)
    for _ in range(200):
        c.observe(24, 2000, truth, 8, 2, 2 * draft_truth)  # two draft passes
    assert c.target_time(24, 2000) == pytest.approx(truth, rel=0.01)
    assert c.draft_time(8, 2000) == pytest.approx(draft_truth, rel=0.01)


def test_frozen_does_not_learn():
    c = make_profiled(frozen=True)
    before = c.target_time(16, 1000)
    c.observe(16, 1000, 10 * before, 8, 1, 1.0)
    assert c.target_time(16, 1000) == before


def test_a_slower_machine_moves_every_prediction_together():
    """Evidence at one (N, batch) that both models run 1.3x slower lifts predictions everywhere
    through the shared speed, so the draft/target ratio and the knee's place stay as profiled."""
    c = make_profiled()
    n = np.array([1, 8, 64, 128])
    before_t, before_d = c.target_time(n, 500), np.array([c.draft_time(b, 500) for b in (1, 8, 32)])
    for _ in range(300):
        c.observe(8, 500, 1.3 * before_t[1], 8, 1, 1.3 * before_d[1])
    ratio_t = c.target_time(n, 500) / before_t
    ratio_d = np.array([c.draft_time(b, 500) for b in (1, 8, 32)]) / before_d
    assert c.target_time(8, 500) == pytest.approx(1.3 * before_t[1], rel=0.01)
    assert np.all(ratio_t > 1.15) and np.all(ratio_d > 1.15)  # unobserved cells follow the speed
    assert c.speed_logcorr > 0.6 * math.log(1.3)


def test_profiled_learns_the_step_overhead_apart_from_the_pass():
    c = make_profiled()
    pass_s = 1.3 * (c.target_time(24, 2000) - c.step_overhead_s)
    for _ in range(300):  # every step also spends 2 ms outside the passes
        c.observe(24, 2000, pass_s, 8, 2, 2 * c.draft_time(8, 2000), overhead_s=2e-3)
    assert c.step_overhead_s == pytest.approx(2e-3, rel=0.01)
    assert c.target_time(24, 2000) == pytest.approx(pass_s + 2e-3, rel=0.01)  # the pass learned apart
    c.observe(24, 2000, pass_s, 8, 2, 2 * c.draft_time(8, 2000), overhead_s=5.0)  # a 5 s pause
    assert c.step_overhead_s < 2e-3 * 1.2  # counted as at most 2x + 1 ms, at a tenth of the way
    assert make_profiled().to_dict()["step_overhead_s"] == 0.0
    assert CostModel.from_dict(c.to_dict()).step_overhead_s == c.step_overhead_s


def test_profiled_learns_what_each_draft_pass_costs_outside_the_passes():
    c = make_profiled()
    pure = c.draft_time(8, 2000)
    rng = np.random.default_rng(0)
    for _ in range(400):  # 1 ms every step, 0.5 ms more per draft pass, +-0.2 ms of noise
        p = int(rng.integers(0, 5))
        c.observe(24, 2000, c.target_time(24, 2000) - c.step_overhead_s, 8, 0, 0.0,
                  overhead_s=1e-3 + 5e-4 * p + rng.uniform(-2e-4, 2e-4), overhead_passes=p)
    assert c.step_overhead_s == pytest.approx(1e-3, rel=0.15)
    assert c.pass_overhead_s == pytest.approx(5e-4, rel=0.15)
    assert c.draft_time(8, 2000) == pytest.approx(pure + c.pass_overhead_s)  # a pass's price includes it
    back = CostModel.from_dict(c.to_dict())
    assert (back.step_overhead_s, back.pass_overhead_s) == (c.step_overhead_s, c.pass_overhead_s)
    slope = c.pass_overhead_s
    for _ in range(400):  # a run that stops drafting: what a pass costs is not forgotten
        c.observe(24, 2000, c.target_time(24, 2000) - c.step_overhead_s, 8, 0, 0.0,
                  overhead_s=1e-3 + rng.uniform(-2e-4, 2e-4))
    assert c.pass_overhead_s == pytest.approx(slope, rel=0.2) and c.step_overhead_s == pytest.approx(1e-3, rel=0.15)


def test_a_first_step_s_one_off_overhead_does_not_price_every_step():
    """An engine's first step pays one-off allocations and first calls: counted as at most twice
    the prediction plus 1 ms, it does not make every step after it look dearer."""
    c = make_profiled()
    c.observe(24, 2000, c.target_time(24, 2000), 8, 0, 0.0, overhead_s=0.53, overhead_passes=0)
    assert c.step_overhead_s <= 1e-3 + 1e-12
    for _ in range(8):  # the real overhead, 3 ms, is reached within a few steps
        c.observe(24, 2000, c.target_time(24, 2000) - c.step_overhead_s, 8, 0, 0.0, overhead_s=3e-3)
    assert c.step_overhead_s == pytest.approx(3e-3, rel=0.1)


def test_profiled_learns_the_engine_s_draft_pass_quickly():
    """The engine's draft pass (catch-up tokens, features) can take a few times the profiled
    forward; a policy that drafts now and then gives few observations, so the draft's price must
    converge within tens of drafting steps, not hundreds."""
    c = make_profiled()
    pure, target = c.draft_time(8, 2000), c.target_time(24, 2000)  # the target runs as profiled
    rng = np.random.default_rng(0)
    for _ in range(30):
        c.observe(24, 2000, target, 8, 2, 2 * 3 * pure * rng.uniform(0.9, 1.1))
    assert c.draft_time(8, 2000) == pytest.approx(3 * pure, rel=0.1)
    assert c.target_time(24, 2000) == pytest.approx(make_profiled().target_time(24, 2000), rel=0.1)  # the target's stays
    back = CostModel.from_dict(c.to_dict())
    assert back.draft_time(8, 2000) == pytest.approx(c.draft_time(8, 2000))


def test_the_draft_ratio_s_evidence_ages_with_the_steps_not_the_drafting_steps():
    """A drafting step after many that drafted nothing weighs ~as much as the ratio's memory has
    forgotten: a policy that stopped drafting on a pass priced too dear corrects the price from
    the odd pass it drafts to check (dspark_gates.SelfMeasure.try_rows), instead of lr / 2 of the error at a time."""
    c = make_profiled()
    pure = c.draft_time(8, 2000)
    for _ in range(100):  # the engine's pass took 1.5x the profile's
        c.observe(24, 2000, c.target_time(24, 2000), 8, 2, 2 * 1.5 * pure)
    assert c.draft_time(8, 2000) == pytest.approx(1.5 * pure, rel=0.01)

    def weight(gap: int) -> float:
        """The share of its error a drafting step at the profile's time corrects, after `gap` steps without drafting."""
        m = copy.deepcopy(c)
        for _ in range(gap):
            m.observe(9, 2000, m.target_time(9, 2000), 8, 0, 0.0)
        r0, err = m.draft_ratio_logcorr, math.log(pure / m._pass_time(8, 2000))
        m.observe(24, 2000, m.target_time(24, 2000), 8, 2, 2 * pure)
        return (m.draft_ratio_logcorr - r0) / err

    assert weight(0) == pytest.approx(0.05, abs=0.002)  # steady drafting: lr / 2 (memory 2 / lr steps)
    assert weight(16) == pytest.approx(0.107, abs=0.005)
    assert weight(64) > 0.55  # counted in drafting steps alone: 0.05 again
    assert weight(1000) > 0.999


def test_an_engine_s_first_drafting_step_does_not_price_every_draft_pass():
    """The first drafting step pays one-off first calls: it moves the draft ratio at most 2x, and
    is not evidence for the draft's cells or the shared speed; the passes after it bring the ratio
    to the engine's true one."""
    c = make_profiled()
    pure, target, speed = c.draft_time(1, 200), c.target_time(2, 200), c.speed_logcorr
    c.observe(2, 200, target, 1, 1, 3.6 * pure)
    assert c.draft_time(1, 200) == pytest.approx(2.0 * pure)
    assert c.speed_logcorr == speed and not c.draft_logcorr.any()
    for _ in range(20):  # then the engine's pass, 1.4x the profile's
        c.observe(2, 200, target, 1, 1, 1.4 * pure)
    assert c.draft_time(1, 200) == pytest.approx(1.4 * pure, rel=0.03)


def test_the_step_overhead_line_is_kept_per_batch_size_bucket():
    """Time outside the passes grows with the batch. Steps of 8 passes at batch 32 (no spread in
    the passes) then steps of 0 or 1 pass at batch 64 fitted, in one line, a slope near 0; each
    bucket of batch sizes now has its own line, which starts from the one in use."""
    c = make_profiled()
    args = (24, 2000, c.target_time(24, 2000), 8, 0, 0.0)
    for _ in range(60):  # batch 32: 8 passes every step, 3 ms outside them
        c.observe(*args, overhead_s=3e-3, overhead_passes=8, batch_size=32)
    line32 = (c.step_overhead_s, c.pass_overhead_s)
    assert c.step_overhead_s + 8 * c.pass_overhead_s == pytest.approx(3e-3, rel=0.01)
    rng = np.random.default_rng(1)
    for i in range(200):  # batch 64: 2 ms, plus 1.2 ms when it drafts (one pass), one step in 16 without
        p = int(i % 16 != 0)
        c.observe(*args, overhead_s=2e-3 + 1.2e-3 * p + rng.uniform(-1e-4, 1e-4), overhead_passes=p, batch_size=64)
    assert c.pass_overhead_s == pytest.approx(1.2e-3, rel=0.15) and c.step_overhead_s == pytest.approx(2e-3, rel=0.1)
    line64 = (c.step_overhead_s, c.pass_overhead_s)
    c.observe(*args, overhead_s=3e-3, overhead_passes=8, batch_size=33)  # same bucket as 32: its line comes back
    assert c.step_overhead_s + 8 * c.pass_overhead_s == pytest.approx(3e-3, rel=0.01)
    assert c.pass_overhead_s == pytest.approx(line32[1], abs=1e-12)
    back = CostModel.from_dict(c.to_dict())
    back.observe(*args, overhead_s=line64[0] + line64[1], overhead_passes=1, batch_size=100)
    c.observe(*args, overhead_s=line64[0] + line64[1], overhead_passes=1, batch_size=100)
    assert (back.step_overhead_s, back.pass_overhead_s) == (c.step_overhead_s, c.pass_overhead_s)
    assert c.pass_overhead_s == pytest.approx(line64[1], rel=0.05)
