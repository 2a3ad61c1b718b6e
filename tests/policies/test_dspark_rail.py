"""dspark's rail by hand: it overrules speculation only on measured evidence that plain steps are
faster, keeps checking the other side, and counts a step only after two of its own kind."""

from __future__ import annotations

from specdepth.policies.dspark_rail import CHECK_BLOCK, RAIL_EVIDENCE, Rail


def drive(rail: Rail, steps: int, B: int, spec_goodput: float, plain_goodput: float,
          predicted: float) -> list[bool]:
    """Run `steps` steps: each asks the rail, then reports its outcome with the step's time."""
    kinds, step_s = [], 0.0
    for step in range(steps):
        spec = rail.speculates(B, lambda: predicted)
        kinds.append(spec)
        emitted = 3 * B if spec else B
        rail.observe(step, B, spec, emitted, step_s)
        step_s = emitted / (spec_goodput if spec else plain_goodput)  # this step's time, reported next
    return kinds


def test_speculation_that_measures_slower_is_turned_off_and_still_checked():
    rail = Rail()
    kinds = drive(rail, 600, 16, spec_goodput=1000.0, plain_goodput=1500.0, predicted=1400.0)
    b = rail.buckets[16 .bit_length()]
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


def test_a_step_counts_only_after_two_of_its_own_kind():
    rail = Rail()
    for step, spec in enumerate([True, True, True, False, False, True]):
        rail.observe(step, 4, spec, 8, 0.01)
    b = rail.buckets[4 .bit_length()]
    # step 2 (after two spec) counted when step 3 reported its time; plain steps 3, 4 and spec 5
    # follow a switch, so none of them counts
    assert b.spec.n == 1 and b.plain.n == 0
    assert CHECK_BLOCK > 2  # a check block has steps that count


def test_unknown_times_are_not_counted():
    rail = Rail()
    for step in range(20):
        rail.observe(step, 1, True, 3, 0.0)  # a replay: no wall time
    assert rail.buckets[1].spec.n == 0
