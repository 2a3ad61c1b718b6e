"""dspark's self-measurement: the gates that check, on its own steps, what its predictions cannot.

dspark's plan rests on predicted survivals and a cost model. Four gates test those predictions
against what its steps measured, each kept per batch-size bucket (batch sizes within one power of
two, as the cost model's overhead lines): what pays at batch 1 can lose at batch 16.

- ask (`asks_keep_drafting`): a step drafts dynamically, asking `keep_drafting` after each pass,
  only while doing so has measured a gain over drafting the plan's budgets (a *fixed* step).
  While it measures a loss a step still asks now and then, spaced by the chance that asking gains
  after all, so the measure follows a change.
- verify (`asks_verify`): ask `verify` only while the target time it saves has been worth the
  controller's time asking it; fixed and dynamic steps are measured apart.
- probe (`probes_now`): now and then a plan predicted to gain little drafts nothing, and
- try (`try_rows`): now and then a plan of nothing drafts one position,
  so that a cost model learning online sees the steps the plan would otherwise never take. With
  a model-free drafter a try also tests the plan's acceptance rates, which stop moving while
  nothing is drafted: where its first position was accepted well above the rate the plan
  assumed (`try_surprised`), the next plan of nothing tries again, until the rates catch up.

Probes, tries and the verify gate act only where the controller learns its cost model
(`PlanContext.cost_learns`). The ask gate acts everywhere a drafter runs passes (a model-free
draft has no pass to stop after: its drafting plans are fixed steps); where the cost model is not
learned (a replay, a fixed cost) it weighs the model's times, not the clock's, so a live run
decides as its replay does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from specdepth.policies.allocation import unit
from specdepth.policies.base import PlanContext, StepOutcome
from specdepth.policies.dspark_prices import CATCH_UP_USUAL, DraftLag, StepPrices

ASK_PROBE = 16  # a step that would not ask still asks at least once in this many...
ASK_PROBE_MAX = 64  # ...or as rarely as this, where the loss it measures is large:
ASK_SPEND = 0.003  # such steps spaced to cost about this share of throughput
ASK_RATE = 0.05  # the running means' weight on a new step that asked, after the first 20
ASK_EVIDENCE = 8  # asked steps before the measure may stop drafting dynamically
PROBE_GAIN = 0.10  # a plan predicted to gain less than this over drafting nothing may be probed...
PROBE_EVERY = 16  # ...once in this many such plans, a spacing that doubles with each probe (and try)
PROBE_MAX = 256  # up to this
VERIFY_EVIDENCE = 8  # steps of a kind that asked `verify` before their measure may skip it...
VERIFY_RATE = 0.05  # ...its running means' weight on a new such step, after the first 20...
VERIFY_PROBE = 16  # ...and a step that would skip it still asks once in this many
TRY_SURPRISE = 2.0  # a try whose accepted share beats the plan's rate by this many standard errors


@dataclass
class VerifyWorth:
    """The worth of asking `verify` on one kind of step: running means of the target time it saved
    and of the controller's time asking it, seconds; the steps measured; steps since one asked."""

    saved: float = 0.0
    cost: float = 0.0
    n: int = 0
    skips: int = 0


@dataclass
class Spacing:
    """Plans between two probes (or tries): the first after PROBE_EVERY, the spacing doubling with
    each one made, up to PROBE_MAX. What a probe teaches the cost model stays learned, while each
    spends a step's gain."""

    wait: int = 0  # plans since the last weighed
    every: int = PROBE_EVERY
    held: int = 0  # plans a due probe has waited for a moment to be made (`hold`)

    def due(self) -> bool:
        """Count a plan; True (and start counting again) once `every` have been."""
        self.wait += 1
        if self.wait < self.every:
            return False
        self.wait = 0
        return True

    def count_unless_due(self) -> bool:
        """A plain step without a plan, its batch unchanged since the last plan, counts as a plan of
        nothing: True where it must be planned (a try is due). A due try already waiting (`hold`)
        waits on: for a newcomer, which an unchanged batch does not have, or, once it has waited
        PROBE_EVERY plans and been planned once more, for its sequences' catch-up to cost less than
        a step, which only grows while they step plain."""
        if self.wait + 1 < self.every:
            self.wait += 1
            return False
        if self.held and not self.wait_ends_now():
            self.hold()
            return False
        return True

    def waits_for_newcomer(self) -> bool:
        """Whether a held try still waits for a newcomer (`try_rows`)."""
        return self.held < PROBE_EVERY

    def wait_ends_now(self) -> bool:
        """Whether this plan is the one at which a held try's wait for a newcomer runs out, so it
        weighs drafting every sequence (`try_rows`)."""
        return self.held == PROBE_EVERY

    def hold(self) -> None:
        """A due probe was not made this plan: due again at the next."""
        self.wait, self.held = self.every - 1, self.held + 1

    def back_off(self) -> None:
        """A probe was made: the next comes twice as far, up to PROBE_MAX."""
        self.every, self.held = min(2 * self.every, PROBE_MAX), 0


@dataclass
class Bucket:
    """What the gates have measured at one batch-size bucket."""

    probes: Spacing = field(default_factory=Spacing)  # drafting plans weighed for a probe
    tries: Spacing = field(default_factory=Spacing)  # plans of nothing, for a try
    ask_gain: float = 0.0  # the measured relative gain of asking `keep_drafting`...
    ask_se: float = 0.0  # ...and its standard error
    ask_n: int = 0  # steps that asked
    skipped: int = 0  # drafting steps since the last that asked
    # running means of (tokens, seconds) as run and as a fixed step, and of the per-step relative
    # gain and its square (for the standard error)
    ask_means: np.ndarray = field(default_factory=lambda: np.zeros(6))
    verify_fixed: VerifyWorth = field(default_factory=VerifyWorth)  # asking `verify` on fixed steps
    verify_dynamic: VerifyWorth = field(default_factory=VerifyWorth)  # ...and on dynamic ones


class SelfMeasure:
    """The gates' state: a `Bucket` per batch-size bucket, and what the current step chose.

    Args:
        weigh_asks: False: every drafting step may draft dynamically (the ask gate always opens).
    """

    def __init__(self, weigh_asks: bool = True) -> None:
        self.weigh_asks = weigh_asks
        self.buckets: dict[int, Bucket] = {}  # B.bit_length() -> its measures
        self.fixed_step = -1  # the last step drafted to the plan's budgets, `keep_drafting` not asked
        self.fixed_budgets: np.ndarray | None = None  # (B,) the dynamic step's budgets as a fixed step
        self.dynamic_step = -1  # the step asking `keep_drafting` now (-1: none)...
        self.dynamic_bucket = Bucket()  # ...and its bucket
        self.skip_verify_step = -1  # the last step whose `verify` is not worth asking
        self.last_ids = np.zeros(0, np.int64)  # the last plan's sequences (a try prefers newcomers)
        # (step, (B,) rows it drafted for, (B,) the plan's position-1 rates) of the last try of a
        # model-free drafter, until its outcome is observed
        self.free_try: tuple[int, np.ndarray, np.ndarray] | None = None

    def bucket(self, batch_size: int) -> Bucket:
        b = self.buckets.get(batch_size.bit_length())
        if b is None:
            b = self.buckets[batch_size.bit_length()] = Bucket()
        return b

    # ---- probes and tries: steps shown to a learning cost model ------------------------------------

    def probes_now(self, bucket: Bucket, ctx: PlanContext, budgets: np.ndarray, deepest: int,
                   prices: StepPrices, price_draft: bool) -> bool:
        """Whether this drafting plan drafts nothing instead: it is due (`Spacing`) and its
        predicted gain over drafting nothing is under PROBE_GAIN. A cost model fitted on drafting
        steps alone can misprice the step without drafts, and then nothing would correct it."""
        if not bucket.probes.due():
            return False
        if not small_gain(ctx, budgets, deepest, prices, price_draft):
            return False
        bucket.probes.back_off()
        return True

    def try_rows(self, bucket: Bucket, ctx: PlanContext, prices: StepPrices, lag: DraftLag,
                 free: bool = False) -> np.ndarray | None:
        """(B,) bool: the sequences a plan of nothing drafts one position for anyway (None: not
        this plan), so that mispriced draft passes, or rates learned from drafts poorer than the
        drafter's now, cannot keep dspark at `off` for good.

        A due try drafts for the sequences new since the last plan (their draft caches need no
        catch-up), waiting up to PROBE_EVERY plans for one; then it drafts for every sequence,
        unless their catch-up would cost more than a step without drafts. A model-free drafter
        (`free`) has no draft cache: its due try drafts for every sequence with a chance at once,
        and is weighed when observed (`try_surprised`)."""
        if not bucket.tries.due():
            return None
        seq_ids = ctx.seq_ids
        if free:
            bucket.tries.back_off()
            rates = np.asarray(ctx.prior_conf)[:, 0]  # (B,)
            rows = rates > 0
            self.free_try = (ctx.step, rows, rates)
            return rows
        new = ~np.isin(seq_ids, self.last_ids)
        if not new.any() and (bucket.tries.waits_for_newcomer() or (
                lag.most > CATCH_UP_USUAL
                and lag.catch_up_s(ctx, np.ones(len(new), bool), prices.context) > float(prices.target[len(new)]))):
            bucket.tries.hold()
            return None
        bucket.tries.back_off()
        return new if new.any() else np.ones(len(seq_ids), bool)

    # ---- the ask gate: drafting dynamically --------------------------------------------------------

    def asks_keep_drafting(self, bucket: Bucket, step: int) -> bool:
        """Whether this drafting step drafts dynamically. After ASK_EVIDENCE steps that asked,
        while their measured gain is negative, one step in `ask_spacing` asks."""
        if self.weigh_asks and bucket.ask_n >= ASK_EVIDENCE and bucket.ask_gain < 0.0:
            bucket.skipped += 1
            if bucket.skipped < self.ask_spacing(bucket):
                return False
        bucket.skipped, self.dynamic_step, self.dynamic_bucket = 0, step, bucket
        return True

    @staticmethod
    def ask_spacing(bucket: Bucket) -> float:
        """Drafting steps per asked step while asking measures a loss: one in 1 / P, P the chance
        that asking gains after all (normal, from the measure and its standard error), so a loss
        within its noise still asks often; but no rarer than steps that each cost the measured loss
        spending ~ASK_SPEND of throughput (ASK_PROBE to ASK_PROBE_MAX). The gains are heavy-tailed
        (rare long streaks), which a plain threshold on the measure cannot tell from noise."""
        spaced = min(max(-bucket.ask_gain / ASK_SPEND, ASK_PROBE), ASK_PROBE_MAX)
        chance = 0.5 * math.erfc(-bucket.ask_gain / (bucket.ask_se * math.sqrt(2.0))) if bucket.ask_se > 0 else 0.0
        return min(1.0 / chance, spaced) if chance > 0 else spaced

    # ---- the verify gate -----------------------------------------------------------------------------

    @staticmethod
    def asks_verify(worth: VerifyWorth) -> bool:
        """Whether this step asks `verify` (else every drafted token is verified): after
        VERIFY_EVIDENCE steps of its kind, only while it has saved more than it cost, and once in
        VERIFY_PROBE steps anyway so the measure follows a change."""
        if worth.n < VERIFY_EVIDENCE or worth.saved >= worth.cost:
            worth.skips = 0
            return True
        worth.skips += 1
        if worth.skips >= VERIFY_PROBE:
            worth.skips = 0
            return True
        return False

    # ---- what a step measured ------------------------------------------------------------------------

    def observe(self, out: StepOutcome, prices: StepPrices | None, plan_ctx: PlanContext | None,
                cost_learns: bool) -> None:
        """Add a step's outcome to its bucket's measures (`prices`, `plan_ctx`: the step's own, if
        it was planned here; `cost_learns`: its plan's `PlanContext.cost_learns`)."""
        if self.free_try is not None and self.free_try[0] == out.step:
            if self.try_surprised(out, *self.free_try[1:]):
                self.bucket(len(out.seq_ids)).tries = Spacing(every=1)  # the next plan of nothing tries again
            self.free_try = None
        if out.verify_time_s > 0.0:
            self._weigh_verify(out, prices)
        if self.dynamic_step != out.step:
            return
        self.dynamic_step = -1
        parts = self._run_vs_fixed(out, prices, plan_ctx, cost_learns)
        if parts is None:
            return
        bucket = self.dynamic_bucket
        bucket.ask_n += 1
        e_run, t_run, e_one, t_one = parts
        g = (e_run / t_run) / (e_one / t_one) - 1.0  # this step's own relative gain
        bucket.ask_means += max(ASK_RATE, 1.0 / bucket.ask_n) * (np.array([*parts, g, g * g]) - bucket.ask_means)
        e_run, t_run, e_one, t_one, g1, g2 = bucket.ask_means
        n_eff = min(bucket.ask_n, 2.0 / ASK_RATE - 1.0)  # an exponential window's effective count
        se = math.sqrt(max(g2 - g1 * g1, 0.0) / n_eff)
        bucket.ask_gain, bucket.ask_se = (e_run / t_run) / (e_one / t_one) - 1.0, se

    @staticmethod
    def try_surprised(out: StepOutcome, rows: np.ndarray, rates: np.ndarray) -> bool:
        """Whether a model-free drafter's try accepted its first position more often than the
        plan's rates said, by TRY_SURPRISE standard errors: those rates were learned from drafts
        poorer than the drafter's now (a fresh text repeats little at first), and a plan of
        nothing observes nothing that would correct them. Rows that found no draft say nothing."""
        if len(rows) != len(out.seq_ids):  # a sequence left between the plan and the step: not weighed
            return False
        shown = rows & (np.asarray(out.verified) > 0)  # (B,) tried rows with a first position verified
        n = int(shown.sum())
        if n == 0:
            return False
        r = float(np.mean(rates[shown]))
        got = float(np.mean(np.asarray(out.accepted)[shown] > 0))
        return got > r + TRY_SURPRISE * math.sqrt(r * (1.0 - r) / n)

    def _weigh_verify(self, out: StepOutcome, p: StepPrices | None) -> None:
        """A step that asked `verify`: the target time it saved and the time asking took, in its kind's measure."""
        B = len(out.seq_ids)
        bucket = self.buckets.get(B.bit_length())
        if p is None or bucket is None or p.key[0] != out.step:
            return
        if out.step == self.fixed_step:
            worth = bucket.verify_fixed
        elif out.step == self.dynamic_step and bucket is self.dynamic_bucket:
            worth = bucket.verify_dynamic
        else:
            return
        t = p.target_at(np.array([B + int(out.drafted.sum()), B + int(out.verified.sum())]))  # (2,) all, as verified
        worth.n += 1
        w = max(VERIFY_RATE, 1.0 / worth.n)
        # an outlier (a first call, a pause) counts as at most twice the mean plus 1 ms, as in the cost model
        cost = out.verify_time_s if worth.n == 1 else min(out.verify_time_s, 2.0 * worth.cost + 1e-3)
        worth.saved += w * (float(t[0] - t[1]) - worth.saved)
        worth.cost += w * (cost - worth.cost)

    def _run_vs_fixed(self, out: StepOutcome, p: StepPrices | None, pc: PlanContext | None,
                      cost_learns: bool) -> np.ndarray | None:
        """A dynamic step: (4,) its tokens and seconds as run, and those of the same step as a fixed
        step (`fixed_budgets`); None: nothing to compare. Measured where the controller learns its
        cost model, modelled otherwise. The running means of the four give the measure as a ratio
        of throughputs over the steps, not a mean of per-step ratios: only tokens and seconds add up."""
        passes, fixed = int(out.drafted.max(initial=0)), self.fixed_budgets
        B = len(out.seq_ids)
        if passes == 0 or p is None or p.key[0] != out.step or out.target_time_s <= 0 or fixed is None \
                or len(fixed) != B or pc is None or pc.step != out.step:
            return None
        n_run, n_fix = B + int(out.verified.sum()), B + int(fixed.sum())
        e_run, e_fix = float(out.accepted.sum()) + B, fixed_tokens(out, fixed, pc.prior_conf) + B
        p_fix = int(fixed.max(initial=0))
        if not cost_learns:  # the cost model's times, not the clock's, so a live run decides as its replay does
            t_run, t_fix = p.target_at(np.array([n_run, n_fix])) + np.array([passes, p_fix]) * p.draft_all
            return np.array([e_run, t_run, e_fix, t_fix])
        first = out.first_pass_s if out.first_pass_s > 0 else out.draft_time_s / passes
        later = (out.draft_time_s - first) / (passes - 1) if passes > 1 else first  # a pass after the first
        # the time outside the passes, as the cost model has learned it: every step's part (left
        # out, it would make the shorter step look better than it is) and each pass's
        step_s, pass_s = getattr(p.cost, "step_overhead_s", 0.0), getattr(p.cost, "pass_overhead_s", 0.0)
        t_pass = p.target_at(np.array([n_fix, n_run])) - step_s  # (2,) the target pass alone, predicted
        t_run = out.draft_time_s + out.target_time_s + out.keep_time_s + passes * pass_s + step_s
        t_fix = first + (p_fix - 1) * later + out.target_time_s * float(t_pass[0] / t_pass[1]) + p_fix * pass_s + step_s
        return np.array([e_run, t_run, e_fix, t_fix])


def fixed_tokens(out: StepOutcome, fixed: np.ndarray, prior: np.ndarray) -> float:
    """Accepted draft tokens the step would have given drafting `fixed` (B,) positions, all verified.

    A position's acceptance does not depend on how deep the draft went on, so this is known where
    the run saw a rejection or verified as far (min(accepted, fixed)); where it stopped earlier with
    everything accepted, the positions past it are expected at the plan's priors (survival products
    of `prior`, (B, K))."""
    v, a = np.asarray(out.verified, np.int64), np.asarray(out.accepted, np.int64)
    tokens = float(np.minimum(a, fixed).sum())
    for r in np.flatnonzero((a == v) & (fixed > v)):
        tokens += float(np.cumprod(unit(np.asarray(prior[r, v[r]:fixed[r]], np.float64))).sum())
    return tokens


def small_gain(ctx: PlanContext, budgets: np.ndarray, deepest: int, prices: StepPrices, price_draft: bool) -> bool:
    """The plan's predicted throughput gain over drafting nothing is under PROBE_GAIN."""
    B = len(budgets)
    surv = np.cumprod(unit(np.asarray(ctx.prior_conf, np.float64)), axis=1)  # (B, K), as the plan reads them
    tau = B + float(surv[np.arange(surv.shape[1])[None, :] < budgets[:, None]].sum())
    n = B + int(budgets.sum())
    t_plan = deepest * (prices.draft_all if price_draft else 0.0) + float(prices.target_at(np.array([n]))[0])
    return tau / t_plan < (1.0 + PROBE_GAIN) * B / float(prices.target[B])
