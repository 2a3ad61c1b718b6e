"""dspark's rail: never slower than not speculating, measured on the run's own steps.

The plan rests on predictions (survivals, a cost model that prices the passes). The rail checks
them against the clock: per batch-size bucket (batch sizes within one power of two) it keeps the
goodput of the steps that speculated and of those that did not, each as running sums of emitted
tokens and whole-step seconds (`StepOutcome.prev_step_s`: from one step's start to the next's,
admission apart, so the drafts, the verify pass, sampling, commit and the controller all count).

The two sides are measured as regimes, in blocks: a step counts only when the two steps before
it were of its own kind, since a plain step right after speculating ones runs measurably slower
than one in a plain run (other passes have had the caches), and the other way round.

- Speculation is measured first. Unless it measures well above what the cost model predicts a
  plain step to give, blocks of CHECK_BLOCK plain steps follow until the plain side has
  RAIL_EVIDENCE counted steps; only measured plain steps may overrule the plan.
- Then the side the rail is not on is checked by such a block every `every` steps (CHECK_EVERY,
  doubling to RAIL_MAX while one side is clearly ahead), so the comparison stays current.
- Where speculating measures slower, the plan is overruled to draft nothing, and the checks let
  speculation back when the text or the load changes.

Only where time is measured (live, `prev_step_s` > 0); a replay is never overruled.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

RAIL_EVIDENCE = 12  # counted steps of each side before the rail may overrule the plan
RAIL_RATE = 0.1  # the running sums' weight on a new step, once a side has 1 / RAIL_RATE steps
CHECK_BLOCK = 6  # steps of the other side in a row when it is checked (the first two do not count)
DENSE_EVERY = 24  # a plain block in this many steps while the plain side lacks evidence...
CHECK_EVERY = 48  # ...then a block of the other side in this many, doubling while one is clearly ahead...
RAIL_MAX = 384  # ...up to this many
CLEAR_GAIN = 0.05  # a side ahead by more than this is clearly ahead
CLEAR_PREDICTED = 0.25  # speculation this far above the predicted plain goodput needs no dense checks
WARM = 2  # steps of its own kind before a step's time counts


@dataclass
class Side:
    """Running sums of one side's emitted tokens and seconds (recent steps weigh more)."""

    tokens: float = 0.0
    seconds: float = 0.0
    n: int = 0

    def add(self, tokens: float, seconds: float) -> None:
        w = max(1.0 / (self.n + 1), RAIL_RATE)
        self.tokens = (1 - w) * self.tokens + w * tokens
        self.seconds = (1 - w) * self.seconds + w * seconds
        self.n += 1

    @property
    def goodput(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class RailBucket:
    plain: Side = field(default_factory=Side)
    spec: Side = field(default_factory=Side)
    wait: int = 0  # steps since the other side was last checked
    every: int = CHECK_EVERY  # the spacing of those checks
    block: int = 0  # steps left in the current check block
    block_spec: bool = False  # the kind of that block's steps


class Rail:
    """The rail's measures, per batch-size bucket, and the last step waiting for its time."""

    def __init__(self) -> None:
        self.buckets: dict[int, RailBucket] = {}
        self.pending: tuple[int, bool, int, bool] | None = None  # (step, speculated, emitted, counts)
        self.pending_bucket: RailBucket | None = None
        self.kinds: list[bool] = []  # the last WARM steps' kinds (speculated or not)
        self.overruled = 0  # plans the rail turned to drafting nothing
        self.checks = 0  # blocks taken to measure the other side

    def bucket(self, batch_size: int) -> RailBucket:
        b = self.buckets.get(batch_size.bit_length())
        if b is None:
            b = self.buckets[batch_size.bit_length()] = RailBucket()
        return b

    def observe(self, step: int, batch_size: int, speculated: bool, emitted: int, prev_step_s: float) -> None:
        """A step's outcome; `prev_step_s` is the whole time of the step before it (0: unknown)."""
        if self.pending is not None and prev_step_s > 0 and self.pending[0] == step - 1 and self.pending[3]:
            side = self.pending_bucket.spec if self.pending[1] else self.pending_bucket.plain
            side.add(self.pending[2], prev_step_s)
        counts = len(self.kinds) == WARM and all(k == speculated for k in self.kinds)
        self.pending, self.pending_bucket = (step, speculated, emitted, counts), self.bucket(batch_size)
        self.kinds = (self.kinds + [speculated])[-WARM:]

    def _check(self, b: RailBucket, spec: bool) -> bool:
        """Start a block of `spec` (True: speculating) steps; returns the first one's kind."""
        b.wait, b.block, b.block_spec = 0, CHECK_BLOCK - 1, spec
        self.checks += 1
        return spec

    def speculates(self, batch_size: int, predicted_plain: Callable[[], float]) -> bool:
        """Whether this step may speculate (False: it drafts nothing, and plans nothing).

        `predicted_plain()`: the cost model's goodput of a plain step at this batch, tokens/s (asked
        only while plain steps lack evidence); until plain steps are measured, speculation measured
        well above it needs no dense checks."""
        b = self.bucket(batch_size)
        if b.block > 0:
            b.block -= 1
            return b.block_spec
        plain, spec = b.plain, b.spec
        b.wait += 1
        if spec.n < RAIL_EVIDENCE:
            return True  # speculation's own measure first
        if plain.n < RAIL_EVIDENCE:  # only measured plain steps may overrule the plan
            if b.wait >= DENSE_EVERY and spec.goodput < (1.0 + CLEAR_PREDICTED) * predicted_plain():
                return self._check(b, False)
            return True
        reference = plain.goodput
        losing = spec.goodput < reference
        if b.wait >= b.every:  # check the side the rail is not on
            gain = spec.goodput / reference - 1.0 if reference > 0 else 0.0
            b.every = min(2 * b.every, RAIL_MAX) if abs(gain) > CLEAR_GAIN else CHECK_EVERY
            return self._check(b, losing)
        if losing:
            self.overruled += 1
        return not losing
