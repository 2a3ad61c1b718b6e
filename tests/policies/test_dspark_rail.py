"""dspark's rail by hand: it overrules speculation only on measured evidence that plain steps are
faster, keeps checking the other side, and counts a step only after two of its own kind."""

from __future__ import annotations

import math

from specdepth.policies.dspark_rail import (CHECK_BLOCK, CHECK_EVERY, DENSE_EVERY, QUICK_EVIDENCE, QUICK_ROWS,
                                           RAIL_EVIDENCE, RAIL_MAX, Rail, rail_key)


def drive(rail: Rail, steps: int, B: int, spec_goodput: float, plain_goodput: float,
          predicted: float, quick: bool = False) -> list[bool]:
    """Run `steps` steps: each asks the rail, then reports its outcome with the step's time."""
    kinds, step_s = [], 0.0
    for step in range(steps):
        spec = rail.speculates(B, lambda: predicted, quick)
        kinds.append(spec)
        emitted = 3 * B if spec else B
        rail.observe(step, B, spec, emitted, step_s)
        step_s = emitted / (spec_goodput if spec else plain_goodput)  # this step's time, reported next
    return kinds


def test_speculation_that_measures_slower_is_turned_off_and_still_checked():
    rail = Rail()
    kinds = drive(rail, 600, 16, spec_goodput=1000.0, plain_goodput=1500.0, predicted=1400.0)
    b = rail.bucket(16)
    assert b.plain.n >= RAIL_EVIDENCE and b.spec.n >= RAIL_EVIDENCE
    assert abs(b.spec.goodput - 1000) < 1 and abs(b.plain.goodput - 1500) < 1
    assert sum(kinds[-300:]) < 0.1 * 300  # off, but for the spaced checks
    assert any(kinds[-300:]) and rail.overruled > 0  # the checks go on


def test_speculation_that_measures_faster_is_never_overruled():
    rail = Rail()
    kinds = drive(rail, 600, 1, spec_goodput=900.0, plain_goodput=300.0, predicted=300.0)
    assert all(kinds) and rail.overruled == 0 and rail.checks == 0  # well above the prediction: no checks
    rail = Rail()
    kinds = drive(rail, 600, 1, spec_goodput=330.0, plain_goodput=300.0, predicted=300.0)
    assert rail.overruled == 0 and 0.8 < sum(kinds) / len(kinds) < 1  # close: plain blocks measure it


def test_speculation_far_ahead_is_checked_only_every_rail_max_steps():
    """A batch of one on repetitive text: dense plain blocks measure the plain side (the prediction
    was close), then speculation at 3x is re-checked only every RAIL_MAX steps; at 1.2x the
    spacing doubles from CHECK_EVERY."""
    def gaps(kinds: list[bool]) -> list[int]:  # steps between the plain blocks' starts, less a block
        starts = [i for i in range(1, len(kinds)) if kinds[i - 1] and not kinds[i]]
        return [b - a - (CHECK_BLOCK - 1) for a, b in zip(starts, starts[1:])]

    dense = DENSE_EVERY  # the wait before each block while the plain side lacks evidence
    far = Rail()
    assert gaps(drive(far, 1200, 1, spec_goodput=900.0, plain_goodput=300.0, predicted=800.0)) == \
        [dense, dense, RAIL_MAX, RAIL_MAX]
    assert far.bucket(1).plain.n >= RAIL_EVIDENCE and far.overruled == 0
    near = Rail()
    assert gaps(drive(near, 1200, 1, spec_goodput=360.0, plain_goodput=300.0, predicted=320.0)) == \
        [dense, dense, CHECK_EVERY, 2 * CHECK_EVERY, 4 * CHECK_EVERY, RAIL_MAX]


def test_a_step_counts_only_after_two_of_its_own_kind():
    rail = Rail()
    for step, spec in enumerate([True, True, True, False, False, True]):
        rail.observe(step, 4, spec, 8, 0.01)
    b = rail.bucket(4)
    # step 2 (after two spec) counted when step 3 reported its time; plain steps 3, 4 and spec 5
    # follow a switch, so none of them counts
    assert b.spec.n == 1 and b.plain.n == 0
    assert CHECK_BLOCK > 2  # a check block has steps that count


def test_unknown_times_are_not_counted():
    rail = Rail()
    for step in range(20):
        rail.observe(step, 1, True, 3, 0.0)  # a replay: no wall time
    assert rail.bucket(1).spec.n == 0


def test_a_drafter_that_pays_a_pass_is_judged_on_little_evidence_and_early():
    """quick: the first plain block follows QUICK_EVIDENCE counted speculating steps, and a clear
    verdict turns speculation off for the rest of a cold run's ~100 steps."""
    rail = Rail()
    kinds = drive(rail, 100, 16, spec_goodput=1000.0, plain_goodput=1500.0, predicted=1400.0, quick=True)
    first_plain = kinds.index(False)
    assert QUICK_EVIDENCE * 16 >= QUICK_ROWS  # three steps of 16 sequences are evidence enough
    assert first_plain <= QUICK_EVIDENCE + 3  # two warm steps, the counted ones, the last one's time
    assert sum(kinds) <= first_plain + 2  # overruled from the verdict on, no check within the run
    assert rail.bucket(16).every == 2 * CHECK_EVERY  # the verdict was clear: the next check comes later
    # a model-free drafter keeps the long measure: nothing overruled before the dense checks
    long = Rail()
    slow = drive(long, 100, 16, spec_goodput=1000.0, plain_goodput=1500.0, predicted=1400.0)
    assert all(slow[:DENSE_EVERY - 1]) and sum(slow) > 3 * sum(kinds)
    assert long.bucket(16).every == CHECK_EVERY  # a long verdict is cheap to revisit: the usual spacing


def test_a_draining_batch_keeps_its_bucket_near_its_size():
    assert [rail_key(b) for b in (1, 2, 3, 5, 6, 11, 12, 16, 22, 23, 45, 46, 64, 90, 91)] == \
        [0, 1, 2, 2, 3, 3, 4, 4, 4, 5, 5, 6, 6, 6, 7]
    assert all(rail_key(b) == math.floor(math.log2(b) + 0.5) for b in range(1, 4097))
    rail = Rail()
    drive(rail, 30, 16, spec_goodput=1000.0, plain_goodput=1500.0, predicted=1400.0, quick=True)
    assert rail.bucket(13) is rail.bucket(16) and rail.bucket(13).plain.n >= QUICK_EVIDENCE
    assert rail.bucket(11) is not rail.bucket(16)


def test_a_bucket_next_to_one_where_plain_won_starts_plain_and_checks_later():
    rail = Rail()
    drive(rail, 40, 16, spec_goodput=1000.0, plain_goodput=1500.0, predicted=1400.0, quick=True)
    kinds = drive(rail, 100, 8, spec_goodput=700.0, plain_goodput=1000.0, predicted=900.0, quick=True)
    first = kinds.index(True)
    assert not any(kinds[:CHECK_EVERY]) and first == CHECK_EVERY  # plain, until speculation is checked
    assert sum(kinds) <= -(-QUICK_ROWS // 8) + 3  # measured slower again: plain from then on
    # the long measure too: speculation measured once after the plain start, not again at once
    rail = Rail()
    drive(rail, 40, 16, spec_goodput=1000.0, plain_goodput=1500.0, predicted=1400.0, quick=True)
    kinds = drive(rail, 200, 8, spec_goodput=700.0, plain_goodput=1000.0, predicted=900.0)
    runs = "".join("s" if k else "." for k in kinds).split(".")
    assert not any(kinds[:CHECK_EVERY]) and max(len(r) for r in runs) <= RAIL_EVIDENCE + 3, runs
    # where speculation measured faster, a neighbour measures it first
    rail = Rail()
    drive(rail, 40, 16, spec_goodput=1500.0, plain_goodput=1000.0, predicted=1400.0, quick=True)
    assert drive(rail, 10, 8, spec_goodput=1000.0, plain_goodput=700.0, predicted=900.0, quick=True)[0]


def test_a_small_batch_is_not_judged_quickly():
    """Below QUICK_ROWS / RAIL_EVIDENCE sequences a step's yield varies too much: the long measure."""
    quick = drive(Rail(), 100, 2, spec_goodput=200.0, plain_goodput=300.0, predicted=280.0, quick=True)
    slow = drive(Rail(), 100, 2, spec_goodput=200.0, plain_goodput=300.0, predicted=280.0)
    assert quick == slow and all(quick[:DENSE_EVERY - 1])


def test_a_step_planned_plain_is_measured_plain_even_with_free_drafts():
    """A hybrid proposes model-free drafts that a plain step checks none of: the rail counts the
    step as plain by the plan, not by what was drafted (else it never measured a plain step)."""
    import numpy as np

    from specdepth.policies.base import StepOutcome
    from specdepth.policies.dspark import DSpark

    policy = DSpark()
    B = 4
    for step in range(8):
        policy._plain_step = step if step >= 4 else -1  # steps 4.. planned plain (the rail, a spell)
        drafted = np.full(B, 3)  # drafted every step: free drafts, verified or not
        verified = drafted if step < 4 else np.zeros(B, np.int64)
        policy.observe(StepOutcome(step, np.arange(B), np.full(B, 3), drafted, verified, np.zeros(B, np.int64),
                                   np.full((B, 3), 0.5), np.full((B, 3), 0.5), 0.01, 0.0, 0.01, np.full(B, 50),
                                   prev_step_s=0.01))
    b = policy._rail.bucket(B)
    assert b.spec.n == 2 and b.plain.n == 1  # two warm steps a side uncounted; the last one's time pending
