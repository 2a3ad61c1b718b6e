"""dspark's rail: never slower than not speculating, measured on the run's own steps.

The plan rests on predictions (survivals, a cost model that prices the passes). The rail checks
them against the clock: per batch-size bucket (batch sizes within a factor sqrt(2) of a power of
two) it keeps the goodput of the steps that speculated and of those that did not, each as running
sums of emitted tokens and whole-step seconds (`StepOutcome.prev_step_s`: from one step's start
to the next's, admission apart, so the drafts, the verify pass, sampling, commit and the
controller all count).

The two sides are measured as regimes, in blocks: a step counts only when the two steps before
it were of its own kind, since a plain step right after speculating ones runs measurably slower
than one in a plain run (other passes have had the caches), and the other way round.

- Speculation is measured first. Unless it measures well above what the cost model predicts a
  plain step to give, blocks of CHECK_BLOCK plain steps follow every DENSE_EVERY steps until the
  plain side has RAIL_EVIDENCE counted steps; only measured plain steps may overrule the plan.
- Where the drafter pays a draft pass (the draft model), a step that speculates in vain costs a
  pass and a wider verify, half a plain step at batch 16 on the CPU pair, and a cold run is short
  (a batch-16 run of 96 tokens a sequence is about 100 steps). There the rail is `quick`:
  QUICK_EVIDENCE counted steps of each side, or as many as hold QUICK_ROWS sequence-steps, the
  plain ones measured right after the speculating ones. A step of few sequences varies too much
  to be judged on a few (what one sequence accepts ranges from nothing to the whole draft), so at
  QUICK_ROWS / RAIL_EVIDENCE = 4 sequences or fewer the rail keeps the longer measure. So does a
  model-free drafter: its vain step costs little, and its acceptance often rises only once the
  text repeats.
- Then the side the rail is not on is checked by such a block every `every` steps (CHECK_EVERY,
  or twice that where a quick first verdict is clear; doubling to RAIL_MAX while one side is
  clearly ahead), so the comparison stays current. A quick verdict is costly to revisit (a block
  of vain draft passes, the first catching up on every token since), a long one is not.
  Speculation far ahead (by FAR_GAIN: a batch of one on repetitive text yields twice the tokens a
  second) is checked only every RAIL_MAX steps: a plain block there costs half its steps' tokens,
  and speculation's own measure, current at every step, still turns it off the step it falls below
  the last plain measure.
- Where speculating measures slower, the plan is overruled to draft nothing, and the checks let
  speculation back when the text or the load changes.
- A bucket first met next to one where plain steps measured faster starts plain, and checks
  speculation after CHECK_EVERY steps: a draining batch (the end of a run) does not pay for a
  new measure at each size.

Only where time is measured (live, `prev_step_s` > 0); a replay is never overruled.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

RAIL_EVIDENCE = 12  # counted steps of each side before the rail may overrule the plan
QUICK_EVIDENCE = 3  # the same where the drafter pays a draft pass (`quick`)...
QUICK_ROWS = 48  # ...and those steps hold this many sequence-steps (a step's yield varies less, the more rows)
RAIL_RATE = 0.1  # the running sums' weight on a new step, once a side has 1 / RAIL_RATE steps
CHECK_BLOCK = 6  # steps of the other side in a row when it is checked (the first two do not count)
DENSE_EVERY = 24  # a plain block in this many steps while the plain side lacks evidence...
CHECK_EVERY = 48  # ...then a block of the other side in this many, doubling while one is clearly ahead...
RAIL_MAX = 384  # ...up to this many
CLEAR_GAIN = 0.05  # a side ahead by more than this is clearly ahead
FAR_GAIN = 0.5  # speculation ahead by more than this is far ahead: checked every RAIL_MAX steps
CLEAR_PREDICTED = 0.25  # speculation this far above the predicted plain goodput needs no dense checks
WARM = 2  # steps of its own kind before a step's time counts


def rail_key(batch_size: int) -> int:
    """round(log2(batch_size)) for batch_size >= 1, in integers: 1 -> 0, 2 -> 1, 3-5 -> 2, 6-11 -> 3,
    12-22 -> 4, 23-45 -> 5, 46-90 -> 6."""
    return ((2 * batch_size * batch_size).bit_length() - 1) // 2


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
    every: int = 0  # the spacing of those checks (0: no verdict yet)
    block: int = 0  # steps left in the current check block
    block_spec: bool = False  # the kind of that block's steps
    lean_plain: bool = False  # a neighbouring bucket measured plain steps faster: start plain


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
        """The bucket of batch sizes within a factor sqrt(2) of a power of two (12-22 share 16's):
        a draining batch of 16 stays in one bucket until it is 11."""
        key = rail_key(batch_size)
        b = self.buckets.get(key)
        if b is None:
            near = [self.buckets[k] for k in (key - 1, key + 1) if k in self.buckets]
            b = self.buckets[key] = RailBucket(lean_plain=any(n.every > 0 and n.spec.goodput < n.plain.goodput
                                                              for n in near))
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

    def speculates(self, batch_size: int, predicted_plain: Callable[[], float], quick: bool = False) -> bool:
        """Whether this step may speculate (False: it drafts nothing, and plans nothing).

        `predicted_plain()`: the cost model's goodput of a plain step at this batch, tokens/s (asked
        only while plain steps lack evidence); until plain steps are measured, speculation measured
        well above it needs no dense checks. `quick`: the drafter pays a draft pass (module doc)."""
        b = self.bucket(batch_size)
        if b.block > 0:
            b.block -= 1
            return b.block_spec
        plain, spec = b.plain, b.spec
        b.wait += 1
        need = min(max(QUICK_EVIDENCE, -(-QUICK_ROWS // batch_size)), RAIL_EVIDENCE) if quick else RAIL_EVIDENCE
        judged_quick = need < RAIL_EVIDENCE  # a small batch's steps vary too much to be judged on a few
        if spec.n < need:
            # speculation's own measure first, unless a neighbouring bucket measured it slower
            return not b.lean_plain or b.wait > CHECK_EVERY
        if plain.n < need:  # only measured plain steps may overrule the plan
            if judged_quick and plain.n > 0 and self.kinds[-1:] == [False]:
                return False  # the quick block's last step waits for its time: one more plain step
            if (judged_quick or b.wait >= DENSE_EVERY) and spec.goodput < (1.0 + CLEAR_PREDICTED) * predicted_plain():
                return self._check(b, False)
            return True
        reference = plain.goodput
        losing = spec.goodput < reference
        gain = spec.goodput / reference - 1.0 if reference > 0 else 0.0
        if b.every == 0:  # the first verdict: a quick one's next check comes later where it is clear
            b.every = 2 * CHECK_EVERY if judged_quick and abs(gain) > CLEAR_GAIN else CHECK_EVERY
            b.wait = 0 if judged_quick or b.lean_plain else b.wait  # (a lean bucket has just measured speculation)
            if gain > FAR_GAIN:
                b.every = RAIL_MAX
        if b.wait >= b.every:  # check the side the rail is not on
            b.every = RAIL_MAX if gain > FAR_GAIN else min(2 * b.every, RAIL_MAX) if abs(gain) > CLEAR_GAIN \
                else CHECK_EVERY
            return self._check(b, losing)
        if losing:
            self.overruled += 1
        return not losing
