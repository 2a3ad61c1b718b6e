"""dspark: DSpark's confidence-scheduled verification, with the draft's depth priced in.

Each step (DESIGN.md "Allocation"):

- plan: the controller's history-based predictions `ctx.prior_survival` (a global prior shrunk
  toward each sequence's own acceptance history) go through `plan_budgets` (as `plan_kernel`):
  for every draft depth D the D sequential draft passes are part of the step time, slots j <= D
  are admitted by the sorted early-stop rule, and the best D's per-sequence counts are the
  budgets L_r. A batch that already saturates the compute knee gets 0 everywhere: speculation
  switches itself off. Live, a plan that would draft for sequences that have not drafted for a
  while is priced again with the draft's catch-up on the tokens they committed since (`_catch_up_s`).
- keep_drafting (dynamic depth): after each draft pass j, the calibrated confidences drafted so far
  give each sequence's survival s_{r,j}; the next position is worth about s_{r,j} * c-hat_{r,j+1}
  (c-hat: the prior for j + 1 blended with the last confidence, which runs in streaks). The next
  pass is drafted for the sequences (best first) that raise the step's predicted throughput
  tau / (draft time + target time) once its cost is paid; otherwise drafting stops. With it, the
  plan's budget is a ceiling (K for every sequence the plan would draft for at all), and deep
  drafts are paid only where the confidences say they will likely be verified. Drafting goes on
  this way only while doing so has measured a gain over drafting the plan's own budgets
  (`_asking`); otherwise each sequence drafts its plan budget and `keep_drafting` is not asked
  (`drafts_dynamically`).
- verify: the drafted positions' calibrated confidences give survivals s_{r,j} (running products),
  and the same early-stop allocation picks d_r. The draft passes already run are part of the
  step's time whatever is verified (`extra`): sunk, but still in Theta's denominator. Leaving
  them out would raise the admission bar (tau / T(N) > tau / (draft + T(N))) and prune slots
  that pay (on the CPU pair's replay at C = 64 that cost 3%). The pass count is this policy's
  own: the plan's deepest budget, cut where `keep_drafting` stopped every sequence; it depends
  on confidences only, never on a drafted token. `verify` is not asked at all (`verifies`) while
  asking it on steps of the kind (drafting the plan's budgets, or dynamically) has cost more than
  it saved (`_verifying`).

Both use the context-aware cost (context_tokens = the batch's KV tokens).

The controller asks `verify` causally, once per position j with columns 1..j. Each answer is
`allocate` over the columns shown (survivals = running products of the confidences clipped to
[0, 1], zero past each drafted length). The work of earlier calls in the same step is reused (only
the new column is merged in, see `VerifyColumns`) after checking, value for value, that the
columns the cached answer rests on are the ones shown now, so every answer equals a fresh
instance's. The step times are priced once per step: the cost model (the same object) is assumed
not to change within a step (the controller refines it in `observe`).

The loops run compiled (policies/kernels.py, policies/verify_columns.py): `plan_kernel` is `plan_budgets` and `VerifyColumns`
is `allocate` column by column, answer for answer (tests/policies/test_kernels.py); in numpy the
same decisions took 230-570 us a step at B = 256, mostly per-call overhead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar

import numpy as np

from specdepth.policies.allocation import unit
from specdepth.policies.base import DepthPolicy, DraftContext, PlanContext, StepCost, StepOutcome, VerifyContext
from specdepth.policies.kernels import keep_kernel, plan_kernel, raised
from specdepth.policies.verify_columns import VerifyColumns

ASK_PROBE = 16  # a step that would not ask still asks once in this many (see `DSpark._asking`)...
ASK_PROBE_MAX = 64  # ...or as rarely as this, where the loss it measures is large:
ASK_SPEND = 0.003  # such steps spaced to cost about this share of throughput
ASK_RATE = 0.05  # the running means' weight on a new step that asked, after the first 20
ASK_EVIDENCE = 8  # asked steps before the measure may stop drafting dynamically
PROBE_GAIN = 0.10  # a plan predicted to gain less than this over drafting nothing may be probed...
PROBE_EVERY = 16  # ...once in this many such steps (see `DSpark._probing`), a spacing that doubles
PROBE_MAX = 256  # with each probe, up to this
VERIFY_EVIDENCE = 8  # steps drafting the plan's budgets that asked `verify` before their measure may skip it...
VERIFY_RATE = 0.05  # ...its running means' weight on a new such step, after the first 20...
VERIFY_PROBE = 16  # ...and a step that would skip it still asks once in this many
CATCH_UP_USUAL = 2  # draft-cache lag (tokens) of a sequence that drafted last step: priced in every pass
CATCH_UP_STEPS = 16  # a catch-up past it is paid once for the drafting steps after: priced 1 / this a step


@dataclass
class _VerifyWorth:
    """The worth of asking `verify` on one kind of step (`DSpark._verifying`): running means of the
    target time it saved and of the controller's time asking it, seconds; the steps measured;
    steps since one asked."""

    saved: float = 0.0
    cost: float = 0.0
    n: int = 0
    skips: int = 0


@dataclass
class _Spacing:
    """Plans between two probes of one kind (`DSpark._probing`, `DSpark._trying`): the first after
    PROBE_EVERY, the spacing doubling with each probe made, up to PROBE_MAX."""

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

    def hold(self) -> None:
        """A due probe was not made this plan: due again at the next."""
        self.wait, self.held = self.every - 1, self.held + 1

    def back_off(self) -> None:
        """A probe was made: the next comes twice as far, up to PROBE_MAX."""
        self.every, self.held = min(2 * self.every, PROBE_MAX), 0


@dataclass
class _Gate:
    """What dspark has measured at one batch-size bucket (batch sizes of one power of two, as the
    cost model's overhead lines): the worth of drafting dynamically, asking `keep_drafting`
    (`DSpark._asking`), the spacing of its probes and tries (`DSpark._probing`, `_trying`) and the worth of asking
    `verify` (`DSpark._verifying`). Asking pays at batch 1 on the bundled pair and loses at 16, and `verify` saves little at batch 4 and more at 64, so one measure across a
    batch that moves would follow the batch instead of the question."""

    probes: _Spacing = field(default_factory=_Spacing)  # drafting plans weighed for a probe (`DSpark._probing`)
    tries: _Spacing = field(default_factory=_Spacing)  # plans of nothing, for a try (`DSpark._trying`)
    ask_gain: float = 0.0  # the measured gain of asking (see `DSpark.observe`)...
    ask_se: float = 0.0  # ...and its standard error
    ask_n: int = 0  # steps that asked
    skipped: int = 0  # drafting steps since the last that asked
    # running means of (tokens, seconds) as run and drafted to the plan's budgets, and of the per-step
    # relative gain and its square (for the standard error)
    ask_means: np.ndarray = field(default_factory=lambda: np.zeros(6))
    # the worth of asking `verify` (see `DSpark._verifying`) on steps drafting the plan's budgets,
    # and on steps drafting dynamically (their drafts are chosen otherwise: measured apart)
    verify_fixed: _VerifyWorth = field(default_factory=_VerifyWorth)
    verify_dynamic: _VerifyWorth = field(default_factory=_VerifyWorth)


class _Prices:
    """One step's step-time table, priced once and shared by plan, keep_drafting and verify (the
    cost model is fixed within a step; the controller refines it in `observe`). The numbers are the
    cost model's own, element for element, so sharing them changes no answer."""

    def __init__(self, step: int, cost: StepCost, context: int, n: int, max_depth: int) -> None:
        self.key = (step, context, n)  # with the cost model's identity (see `DSpark._prices_for`)
        self.cost, self.context = cost, context
        size = n * (max_depth + 1) + 1
        both = getattr(cost, "step_prices", None)  # CostModel's faster form (same numbers), if it has one
        if both is not None:
            self.target, self.draft_all = both(size, context, n)  # (N,) by N, and a draft pass
        else:
            self.target = np.asarray(cost.target_time(np.arange(size), context), np.float64)
            self.draft_all = float(cost.draft_time(n, context))

    @cached_property
    def pass_one(self) -> float:
        """A draft pass of one row (keep_drafting prices a pass of k rows on the line from it to
        `draft_all`; most steps never ask it)."""
        if self.key[2] == 1:  # the one row is the whole batch: draft_all is draft_time(1), the same number
            return self.draft_all
        return float(self.cost.draft_time(1, self.context))

    def target_at(self, n_tokens: np.ndarray) -> np.ndarray:
        """cost.target_time(n_tokens), from the table where it reaches."""
        if n_tokens.size and int(n_tokens.max()) < self.target.size:
            return self.target[n_tokens]
        return np.asarray(self.cost.target_time(n_tokens, self.context), np.float64)


class DSpark(DepthPolicy):
    """Ours: calibrated survivals, global sort with early stop, draft depth priced, context-aware cost.

    Params:
        margin: a slot is admitted only if it raises predicted throughput by more than this fraction
            (0: any gain).
        price_draft: include the draft's passes in the pre-draft budget (False: an ablation).
        context_aware: pass the batch's context tokens to the cost model (False: an ablation).
        dynamic: stop each sequence's drafting by `keep_drafting` (False: the plan's budgets).
        streak: weight of the last confidence (vs the prior) in the next position's c-hat.
        lookahead: draft passes `keep_drafting` looks ahead (1: does the next pass pay; h: do
            the next h, for some h <= lookahead). On the replays 8 did no better than 1.
        weigh_asks: with `dynamic`, draft dynamically (asking `keep_drafting`) only while doing
            so has measured a gain over drafting the plan's budgets (see `_asking`).
        probe: now and then draft nothing where drafting is predicted to gain little, and one
            position where the plan drafts nothing, so the cost model sees the step it would
            otherwise never take (see `_probing`, `_trying`).
        weigh_verify: skip `verify` on steps drafting the plan's budgets while asking it costs
            more time than it has saved (see `_verifying`).
        follow_plan: where drafting dynamically has not paid, draft the plan's budgets (False:
            stop at one position: the earlier rule, an ablation).
        catch_up: price the draft's catch-up on the tokens committed since a sequence last drafted
            into a plan that drafts after a spell without (see `_catch_up_s`).
    """

    name: ClassVar[str] = "dspark"
    params: ClassVar[dict[str, object]] = {"margin": 0.0, "price_draft": True, "context_aware": True,
                                           "dynamic": True, "streak": 0.5, "lookahead": 1, "weigh_asks": True,
                                           "probe": True, "weigh_verify": True, "follow_plan": True,
                                           "catch_up": True}

    def __init__(self, margin: float = 0.0, price_draft: bool = True, context_aware: bool = True,
                 dynamic: bool = True, streak: float = 0.5, lookahead: int = 1, weigh_asks: bool = True,
                 probe: bool = True, weigh_verify: bool = True, follow_plan: bool = True,
                 catch_up: bool = True) -> None:
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"{self.name}: margin must be in [0, 1), got {margin}")
        self.margin = float(margin)
        self.price_draft = bool(price_draft)
        self.context_aware = bool(context_aware)
        self.dynamic = bool(dynamic)
        self.streak = float(streak)  # weight of the last confidence (vs the prior) in c-hat_{r,j+1}
        if int(lookahead) < 1:
            raise ValueError(f"{self.name}: lookahead must be >= 1, got {lookahead}")
        self.lookahead = int(lookahead)  # draft passes keep_drafting looks ahead
        self.weigh_asks = bool(weigh_asks)
        self.probe = bool(probe)
        self.weigh_verify = bool(weigh_verify)
        self.follow_plan = bool(follow_plan)
        self.catch_up = bool(catch_up)
        self._skip_verify = -1  # the step whose `verify` is not worth asking (see `_verifying`)
        self._fixed_step = -1  # the step drafted to the plan's budgets, `keep_drafting` not asked
        self._fixed_budgets: np.ndarray | None = None  # (B,) what the asking step would draft without asking
        self._gates: dict[int, _Gate] = {}  # batch-size bucket (B.bit_length()) -> its measures
        self._asking_now = -1  # the step asking `keep_drafting` now (-1: none)...
        self._asking_gate = _Gate()  # ...and its bucket's measures
        self._last_ids = np.zeros(0, np.int64)  # the last plan's sequences (see `_trying`)
        self._lag_ids = np.zeros(0, np.int64)  # the last step's sequences, and the tokens each one's
        self._lag = np.zeros(0, np.int64)  # draft cache lacks now (see `_lags_for`)...
        self._lag_max = 0  # ...and the most (a newcomer's is 1: a plan needs no look below CATCH_UP_USUAL)
        self._cost_learns = False  # the last plan's `PlanContext.cost_learns` (see `_ask_parts`)
        self._plan_ctx: PlanContext | None = None  # this step's plan context, for keep_drafting
        self._plan_key: tuple[int, int, int] | None = None  # its prices' key
        # Per-step verify state (see the module docstring); it checks each call continues the last.
        self._step = -1
        self._cost: StepCost | None = None
        self._depth = 0  # the most positions a step has had (sizes the step-time table; no effect on answers)
        self._passes = (-1, 0)  # (step, draft passes) as far as this policy knows (see verify)
        self._prices: _Prices | None = None  # this step's step-time table
        self._alloc: VerifyColumns | None = None

    def _context_tokens(self, context_lens: np.ndarray) -> int:
        return int(context_lens.sum()) if self.context_aware else 0

    def plan(self, ctx: PlanContext) -> np.ndarray:
        B, K = ctx.batch_size, ctx.max_depth
        prices = self._prices_for(ctx.step, ctx.cost, self._context_tokens(ctx.context_lens), B, K)
        # = plan_budgets(ctx.prior_survival, ...), compiled; with `dynamic` the plan's depth becomes a
        # ceiling (K for every sequence it drafts for) and drafting stops dynamically (keep_drafting),
        # unless drafting dynamically has not paid (then the plan's budgets are drafted as they
        # are): decided here, so the ceiling is set here rather than by plan_kernel's `ceiling`
        prior, times = np.asarray(ctx.prior_conf, np.float64), prices.target[B:]
        pass_time = prices.draft_all if self.price_draft else 0.0
        budgets, deepest = plan_kernel(prior, times, pass_time, self.margin)
        if deepest > 0 and self.catch_up and ctx.cost_learns and self._lag_max > CATCH_UP_USUAL:
            first = self._catch_up_s(ctx, budgets > 0, prices.context) / CATCH_UP_STEPS
            if first > 0.0:  # priced again with it (a plan that drafts nothing pays none)
                budgets, deepest = plan_kernel(prior, times, pass_time, self.margin, 0, first)
        gate = self._gates.get(B.bit_length())
        if gate is None:
            gate = self._gates[B.bit_length()] = _Gate()
        tried = False  # a plan of nothing, drafted one deep (`_trying`): drafted as it is, nothing asked
        if deepest > 0 and self.probe and ctx.cost_learns and self._probing(gate, ctx, budgets, int(deepest), prices):
            budgets[:], deepest = 0, 0
        elif deepest == 0 and self.probe and ctx.cost_learns and (rows := self._trying(gate, ctx, prices)) is not None:
            budgets[rows & (np.asarray(ctx.prior_conf)[:, 0] > 0)] = 1
            deepest, tried = int(budgets.max(initial=0)), True
        if self.dynamic and deepest > 0 and not tried and self._asking(gate, ctx.step):
            # what the step would draft with `keep_drafting` not asked: the measure's other arm
            self._fixed_budgets = budgets if self.follow_plan else np.minimum(budgets, 1)
            budgets, deepest = raised(budgets, K), K  # (B,) K where the plan drafts
            if self.weigh_verify and ctx.cost_learns and not self._verifying(gate.verify_dynamic):
                self._skip_verify = ctx.step
        elif deepest > 0:  # drafted to the budgets, `keep_drafting` not asked
            if self.dynamic and not self.follow_plan:
                np.minimum(budgets, 1, out=budgets)
                deepest = 1
            self._fixed_step = ctx.step
            # a try verifies what it drafted, unasked: it is there to be measured as drafted (and a
            # causal `verify` over a large batch costs ~1 ms of controller time on the CPU pair)
            if self.weigh_verify and ctx.cost_learns and (tried or not self._verifying(gate.verify_fixed)):
                self._skip_verify = ctx.step
        self._plan_ctx, self._plan_key, self._cost_learns = ctx, prices.key, ctx.cost_learns
        self._passes = (ctx.step, int(deepest))
        self._last_ids = ctx.seq_ids
        return budgets

    def _catch_up_s(self, ctx: PlanContext, rows: np.ndarray, context: int) -> float:
        """Seconds of draft catch-up a step drafting for `rows` (B,) bool adds; a plan is priced
        1 / `CATCH_UP_STEPS` of it.

        A sequence's first draft pass of a step feeds its draft cache every token committed since
        it last drafted (`PairRunner._draft`), padded to the longest: after a step that drafted,
        one or two (what the learned pass price holds), after a spell of `off` one more a step.
        At batch 64 on the bundled CPU pair, where dspark mostly planned nothing, the rare plans
        that drafted paid it: a first pass of 35.6 ms after 19 steps of `off` and 82 ms after ~40,
        against 7.5 ms one step after the last draft (a step of `off`: ~27 ms). So a plan that
        drafts for sequences whose lag is past `CATCH_UP_USUAL` pays the rest: a draft pass of
        rows x lag tokens, priced by the cost model as a pass over that many rows (the profile's
        line; 43.9 ms for 64 x 19 there, 87 for 64 x 40), less the usual pass. It buys every
        later step its usual lag, so it is spread over `CATCH_UP_STEPS` steps (about half the
        life of a 48-token request drafting one position, and less than a longer one's): at
        batch 4 a lag of 40 adds ~0.3 ms to a ~10 ms step, at batch 64 ~5 ms to ~30 (drafting
        there must then gain ~15%), and a lag of 3 (one step of `off`, a probe's) ~0.3 ms. Live
        only (`PlanContext.cost_learns`): a replay models no draft cache."""
        worst = int(self._lags_for(ctx.seq_ids)[rows].max(initial=0))
        if worst <= CATCH_UP_USUAL:
            return 0.0
        n = int(rows.sum())
        return max(float(ctx.cost.draft_time(n * worst, context)) - float(ctx.cost.draft_time(n, context)), 0.0)

    def _lags_for(self, seq_ids: np.ndarray) -> np.ndarray:
        """(B,) tokens each sequence's draft cache lacks, as of the last step observed (1 for a
        sequence not seen: its draft cache holds the prompt but its last token)."""
        known, lag = self._lag_ids, self._lag
        if known.size == seq_ids.size and (known == seq_ids).all():
            return lag
        out = np.ones(len(seq_ids), np.int64)
        if known.size:
            order = np.argsort(known)
            pos = np.minimum(np.searchsorted(known, seq_ids, sorter=order), known.size - 1)
            hit = known[order[pos]] == seq_ids
            out[hit] = lag[order[pos[hit]]]
        return out

    def _track_lag(self, out: StepOutcome) -> None:
        """The draft caches' lag after a step (`PairRunner`): a sequence that drafted d positions
        fed its cache all it lacked and its first d - 1 drafts, then kept the accepted ones, so
        it lacks the token the target added (and the last draft, if every draft was accepted);
        one that did not draft lacks one more token."""
        before = self._lags_for(out.seq_ids)
        d, a = np.asarray(out.drafted, np.int64), np.asarray(out.accepted, np.int64)
        self._lag = np.where(d > 0, 1 + (a >= d), before + 1)
        self._lag_ids = np.asarray(out.seq_ids, np.int64)
        self._lag_max = int(self._lag.max(initial=0))

    def _probing(self, gate: _Gate, ctx: PlanContext, budgets: np.ndarray, deepest: int, prices: _Prices) -> bool:
        """Whether this step drafts nothing, to show the cost model the step it would not take.

        The cost model learns online only the steps a policy takes. A plan that drafts every step
        leaves the step without drafts priced by the profile and by an overhead line fitted on
        drafting steps alone (`ProfiledCost`: every step's time outside the passes, as a line in
        the draft passes, which steps of one pass count cannot pin down). On the bundled pair at
        batch 64 that priced the step without drafts 16% over its measured time (the overhead of
        a 1-pass step, 3.7 ms, against 1.9 ms without drafting), so dspark drafted on a predicted
        gain of 12% that measured none. So drafting plans are weighed now and then, and one drafts
        nothing if its predicted gain over drafting nothing (tau / step time, priors as the plan
        sees them) is under `PROBE_GAIN`: the steps show the model both points of the line and the
        step's cell. The first weighing comes after `PROBE_EVERY` drafting plans of the batch's
        bucket, and the spacing doubles with each probe, up to `PROBE_MAX`: what a probe teaches
        stays learned (the cells move slowly, the line's slope is kept while the passes hardly
        vary, and the shared speed follows the machine on every step), while each probe spends the
        plan's gain, up to 10% of a step. At a fixed 1 in 16 that was ~1% of throughput at batch 4
        on the bundled pair (live A/B), now ~0.1% once a few probes have been made. Only where
        the cost model learns (`PlanContext.cost_learns`): never in a replay."""
        if not gate.probes.due():
            return False
        if not self._small_gain(ctx, budgets, deepest, prices):  # this plan is weighed (~10 us live)
            return False
        gate.probes.back_off()
        return True

    def _trying(self, gate: _Gate, ctx: PlanContext, prices: _Prices) -> np.ndarray | None:
        """(B,) bool: the sequences a plan that drafts nothing drafts one position for anyway, so
        the cost model sees a drafting step at this load (None: not this plan): `_probing` the
        other way round.

        A plan drafts nothing where the step's prices say a draft pass costs more than the tokens
        it would give, and a cost model learns online only the steps a policy takes: if those
        prices are wrong (a profile's draft pass timed apart from the engine's, a ratio learned
        at another load), a plan that never drafts never shows the model the step that would
        correct them, and stays at `off` for good. On the bundled CPU pair at batch 1, with the
        draft pass priced 3x too dear, dspark did not draft once in a 384-step round (0.84x static
        k = 1); with these tries (and the cost model's draft ratio weighing a drafting step by the
        steps since the last, `ProfiledCost._learn_draft_ratio`) it drafted every step from about
        step 100 on (0.95x over the round). So after `PROBE_EVERY` plans of nothing in a
        batch-size bucket one is drafted one deep (static k = 1's step, decided before any draft:
        lossless as any plan), then ever more rarely (the spacing doubles up to `PROBE_MAX`, as
        `_probing`'s): where drafting is truly dear, the tries cost one such step in 16, then in
        256 (on the H200 with the bundled pair at batch 1, where the engine's host-bound draft
        pass cost about a target pass and static k = 1 ran at 0.6x `off`, dspark tried once in a
        384-step round and stayed at `off`).

        A try drafts for the sequences new since the last plan: their draft caches hold all they
        have (prefilled with the prompt), while a sequence that has not drafted for a while makes
        its first draft pass catch up on every token since (`PairRunner._draft`). At batch 64 on
        the bundled CPU pair, where `off` was the best depth and dspark planned nothing, a try of
        every sequence after ~40 steps of `off` spent 82 ms in that pass (7.5 ms one step after
        the last draft), about two steps' time for one step's tokens: ~2% of a 96-step round, and
        a step whose draft pass the cost model clips as an outlier rather than learns from. A due
        try waits for a plan with newcomers, for up to `PROBE_EVERY` plans; then (a batch that
        keeps its sequences: batch 1, long requests) it drafts for every sequence, unless their
        catch-up (a pass over B x lag tokens, less the usual pass, `_catch_up_s`, not spread) would cost more than a step without drafts: then it waits on for newcomers. A
        closed loop at batch 64 whose requests start together has none for ~48 steps: its try of
        all 64 after 16 steps of `off` spent 38 ms in the draft pass, in steps of ~26 ms (live
        round, /tmp harness; 0.982x `off` over the round); at batch 1 a lag of 17 costs ~1 ms.
        Only where the cost model learns: never in a replay."""
        if not gate.tries.due():
            return None
        seq_ids = ctx.seq_ids
        new = ~np.isin(seq_ids, self._last_ids)
        if not new.any() and (gate.tries.held < PROBE_EVERY or (
                self._lag_max > CATCH_UP_USUAL
                and self._catch_up_s(ctx, np.ones(len(new), bool), prices.context) > float(prices.target[len(new)]))):
            gate.tries.hold()
            return None
        gate.tries.back_off()
        return new if new.any() else np.ones(len(seq_ids), bool)

    def _verifying(self, worth: _VerifyWorth) -> bool:
        """Whether this step asks `verify` (else every drafted token is verified), by its worth on
        steps of this kind (`worth`: drafting the plan's budgets, or drafting dynamically).

        Asking is a causal call into the controller after drafting, run with the caches cold from
        the draft pass before it: ~80 us a step on the bundled CPU pair at batch 4, ~1% of a step
        there, where static k = 1 asks nothing. What it can save is the target time of the drafted
        positions it leaves unverified, which on a step the plan priced is little: a position is
        left out only where its confidence turned out too low to pay its token. On a step drafting
        dynamically `keep_drafting` has already weighed each next position on the confidences so
        far; at batch 1 on the bundled pair those steps asked `verify` on a quarter of all steps,
        ~20 us a step. Both are measured on the steps of the kind that asked (the target time
        saved priced by the cost model, the asking timed by the controller; running means, ~20
        steps' memory, per batch-size bucket), and after `VERIFY_EVIDENCE` such steps `verify` is
        skipped while it has cost more than it saved; one step in `VERIFY_PROBE` asks anyway, so
        the measure follows a change. Only where the controller learns its cost model and times
        the calls: a replay always asks."""
        if worth.n < VERIFY_EVIDENCE or worth.saved >= worth.cost:
            worth.skips = 0
            return True
        worth.skips += 1
        if worth.skips >= VERIFY_PROBE:
            worth.skips = 0
            return True
        return False

    def verifies(self, step: int) -> bool:
        return step != self._skip_verify

    def drafts_dynamically(self, step: int) -> bool:
        return step != self._fixed_step

    def _weigh_verify(self, out: StepOutcome) -> None:
        """A step that asked `verify`: the target time it saved and the time asking took, in its kind's measure."""
        p, B = self._prices, len(out.seq_ids)
        gate = self._gates.get(B.bit_length())
        if p is None or gate is None or p.key[0] != out.step:
            return
        if out.step == self._fixed_step:
            worth = gate.verify_fixed
        elif out.step == self._asking_now and gate is self._asking_gate:
            worth = gate.verify_dynamic
        else:
            return
        t = p.target_at(np.array([B + int(out.drafted.sum()), B + int(out.verified.sum())]))  # (2,) all, as verified
        worth.n += 1
        w = max(VERIFY_RATE, 1.0 / worth.n)
        # an outlier (a first call, a pause) counts as at most twice the mean plus 1 ms, as in the cost model
        cost = out.verify_time_s if worth.n == 1 else min(out.verify_time_s, 2.0 * worth.cost + 1e-3)
        worth.saved += w * (float(t[0] - t[1]) - worth.saved)
        worth.cost += w * (cost - worth.cost)

    def _small_gain(self, ctx: PlanContext, budgets: np.ndarray, deepest: int, prices: _Prices) -> bool:
        """The plan's predicted throughput gain over drafting nothing is under PROBE_GAIN."""
        B = len(budgets)
        surv = np.cumprod(unit(np.asarray(ctx.prior_conf, np.float64)), axis=1)  # (B, K), as the plan reads them
        tau = B + float(surv[np.arange(surv.shape[1])[None, :] < budgets[:, None]].sum())
        n = B + int(budgets.sum())
        t_plan = deepest * (prices.draft_all if self.price_draft else 0.0) + float(prices.target_at(np.array([n]))[0])
        return tau / t_plan < (1.0 + PROBE_GAIN) * B / float(prices.target[B])

    def _asking(self, gate: _Gate, step: int) -> bool:
        """Whether this step drafts dynamically, asking `keep_drafting` after every pass (else each
        sequence drafts its plan budget, and nothing is asked: `drafts_dynamically`).

        Its worth is measured rather than predicted: on each step that asked, the step's
        throughput as run (its emitted tokens over its draft passes, target pass and asks) against
        the same step drafted to the plan's budgets (the tokens those positions give, known where
        the run saw a rejection within them or verified as far, else expected at the priors; over
        the passes and a target pass scaled to the step tokens by the cost model; see
        `_ask_parts`), over those steps (running means, memory ~1 / `ASK_RATE` asked steps). Once
        `ASK_EVIDENCE` have asked, while it measures a loss, plans draft their budgets on most
        steps, and a step asks now and then, so the estimate follows a change (`_ask_spacing`):
        one in 1 / P, P the chance that asking gains after all (from the measure and its standard
        error over the steps' own gains), so a loss within its noise still asks often and a clear
        one rarely; but no rarer than one drafting step in `ASK_PROBE`, or fewer where the
        measured loss is large (each such step costs about that loss: spaced to spend
        ~`ASK_SPEND` of throughput, at most one in `ASK_PROBE_MAX`). At batch 16 on the
        bundled pair an asked step lost ~20%: 1 in 16 cost ~1.3% of throughput; at batch 1 the
        loss was ~3% and the rare streaks that revert it need the probes. The measure is kept per
        batch-size bucket (`_Gate`). The priors the plan rests on say how deep drafting pays on
        average; the measure says whether the drafts `keep_drafting` chose beyond or short of
        them paid here.

        The other arm was one position (`follow_plan` False) until the plan's prices were right at
        small batches: at batch 1 on the bundled pair static k = 2 ran 2-3% faster than k = 1 in
        four live runs, while dspark, stopped at one position, ran k = 1's steps; drafting the
        plan's budgets (2 deep on ~40% of steps there, once the profile priced 3 step tokens
        right) gained 2.7% (live A/B, 3 rounds), with batches 4 to 64 unchanged.

        Both costs of going on are in the measure. Each ask is a call into the controller between
        two draft passes: small next to a GPU step, but on the bundled CPU pair it runs with the
        caches cold from the forward before it (0.23-0.29 ms at batch 16, ~25 us in a loop). And
        the passes it adds are chosen on predicted survivals: at batch 16 on the CPU pair, the
        steps that drafted a second pass measured 1947 tok/s where stopping after the first would
        have given ~2045 (their first positions' tokens at the 1-pass steps' time), and static
        k = 1 ran 4% faster than dspark. The previous rule weighed the asks' *predicted* gain
        against their measured time on 1-deep plans only, and kept asking; plans 2 deep (a third
        of the steps there) always asked.

        The gains are heavy-tailed: at batch 1 on the CPU pair, going on measured +2.3% overall,
        from asked steps that mostly lost a little (-2.6% on the 53% that stopped after one pass
        anyway: the ask's time) and rare long streaks that gained 14-32%; at batch 16 the losses
        were steady. A plain threshold on the running measure could not serve both: with 10-20
        steps' memory, spells of hard text stopped drafts that pay overall (the replay at
        concurrency 1 on the committed CPU profile: 192 tok/s against 200 for always asking; a
        live run at batch 1, 0.94x static k = 2); with ~33 steps' memory and a 3% margin, batch
        16 took most of a run to stop (0.96x static k = 2). The standard error tells the two
        apart. It first did so as a threshold (stop while the measure was two standard errors
        below zero, else ask every step); a measure near zero (at batch 4, -3% with a standard
        error of 1.2%) then crossed it back and forth, and each spell above it asked every step at
        a 3% loss. Spacing the asks by the chance of a gain has no such edge: on synthetic
        heavy-tailed gains (one step in 25 gaining 2.9x) it asks 68% of steps and loses 1.1%
        against always asking; with one in 50 it gains 1.6%."""
        if self.weigh_asks and gate.ask_n >= ASK_EVIDENCE and gate.ask_gain < 0.0:
            gate.skipped += 1
            if gate.skipped < self._ask_spacing(gate):
                return False
        gate.skipped, self._asking_now, self._asking_gate = 0, step, gate
        return True

    @staticmethod
    def _ask_spacing(gate: _Gate) -> float:
        """Drafting steps per asked step while asking measures a loss (`_asking`): one in 1 / P,
        P the chance that asking gains after all (the measure's normal approximation, its mean
        and standard error), but no rarer than a step that costs about the measured loss spent
        ~`ASK_SPEND` of throughput (16 to 64 steps)."""
        spaced = min(max(-gate.ask_gain / ASK_SPEND, ASK_PROBE), ASK_PROBE_MAX)
        chance = 0.5 * math.erfc(-gate.ask_gain / (gate.ask_se * math.sqrt(2.0))) if gate.ask_se > 0 else 0.0
        return min(1.0 / chance, spaced) if chance > 0 else spaced

    def observe(self, out: StepOutcome) -> None:
        if self.catch_up and self._cost_learns:
            self._track_lag(out)
        if out.verify_time_s > 0.0:
            self._weigh_verify(out)
        if self._asking_now != out.step:
            return
        self._asking_now = -1
        parts = self._ask_parts(out)
        if parts is None:
            return
        gate = self._asking_gate
        gate.ask_n += 1
        e_run, t_run, e_one, t_one = parts
        g = (e_run / t_run) / (e_one / t_one) - 1.0  # this step's own relative gain
        gate.ask_means += max(ASK_RATE, 1.0 / gate.ask_n) * (np.array([*parts, g, g * g]) - gate.ask_means)
        e_run, t_run, e_one, t_one, g1, g2 = gate.ask_means
        n_eff = min(gate.ask_n, 2.0 / ASK_RATE - 1.0)  # an exponential window's effective count
        se = math.sqrt(max(g2 - g1 * g1, 0.0) / n_eff)
        gate.ask_gain, gate.ask_se = (e_run / t_run) / (e_one / t_one) - 1.0, se

    def _ask_parts(self, out: StepOutcome) -> np.ndarray | None:
        """A step that asked: (4,) its tokens and seconds as run, and the tokens and seconds of the
        same step drafted to the budgets it would have had without asking (the plan's, or one
        position without `follow_plan`; None: nothing to compare); measured where the controller
        learns its cost model from measured steps, modelled otherwise. Greedy or sampled, a
        position's acceptance does not depend on how deep the draft went on, so where the run saw
        a rejection within those budgets, or verified past them, the tokens they give are known
        (`_fixed_tokens`). The running means of the four give the measure as a ratio of
        throughputs over the steps, not a mean of per-step ratios: a wasted deep draft halves its
        own step's rate, a paying one raises its step's by as much, and only their tokens and
        seconds add up."""
        passes, fixed, pc, p = int(out.drafted.max(initial=0)), self._fixed_budgets, self._plan_ctx, self._prices
        B = len(out.seq_ids)
        if passes == 0 or p is None or p.key[0] != out.step or out.target_time_s <= 0 or fixed is None \
                or len(fixed) != B or pc is None or pc.step != out.step:
            return None
        n_run, n_fix = B + int(out.verified.sum()), B + int(fixed.sum())
        e_run, e_fix = float(out.accepted.sum()) + B, self._fixed_tokens(out, fixed, pc.prior_conf) + B
        p_fix = int(fixed.max(initial=0))
        if not self._cost_learns:  # the controller trusts the cost model as given (a replay, a fixed
            # cost): its times, not the clock's, so a live run decides as its replay does
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

    @staticmethod
    def _fixed_tokens(out: StepOutcome, fixed: np.ndarray, prior: np.ndarray) -> float:
        """Accepted draft tokens the step would have given drafting `fixed` (B,) positions, all
        verified: known where the run saw a rejection or verified as far (min(accepted, fixed));
        where it stopped earlier with everything accepted, the positions past it are expected at
        the plan's priors (survival products of `prior`, (B, K))."""
        v, a = np.asarray(out.verified, np.int64), np.asarray(out.accepted, np.int64)
        tokens = float(np.minimum(a, fixed).sum())
        for r in np.flatnonzero((a == v) & (fixed > v)):
            tokens += float(np.cumprod(unit(np.asarray(prior[r, v[r]:fixed[r]], np.float64))).sum())
        return tokens

    def _prices_for(self, step: int, cost: StepCost, context: int, n: int, max_depth: int) -> _Prices:
        p = self._prices
        if p is None or p.cost is not cost or p.key != (step, context, n) or p.target.size <= n * (max_depth + 1):
            p = self._prices = _Prices(step, cost, context, n, max_depth)
        return p

    def keep_drafting(self, ctx: DraftContext) -> np.ndarray:
        """Draft position j + 1 for the sequences whose expected gain pays for another pass."""
        B, j = ctx.conf.shape
        pc = self._plan_ctx
        if not self.dynamic or pc is None or pc.step != ctx.step or j >= pc.max_depth or B == 0:
            return np.ones(B, bool)
        p = self._prices
        if p is None or p.key != self._plan_key or p.cost is not pc.cost:  # else: the plan's prices
            p = self._prices_for(ctx.step, pc.cost, self._context_tokens(pc.context_lens), B, pc.max_depth)
        keep, _, kept = keep_kernel(np.asarray(ctx.conf, np.float64), np.asarray(ctx.drafted, np.int64),
                                    np.asarray(ctx.budgets, np.int64), np.asarray(pc.prior_conf, np.float64),
                                    self.streak, p.target, p.pass_one, p.draft_all, self.margin, self.lookahead)
        if not kept and self._passes[0] == ctx.step:
            self._passes = (ctx.step, min(self._passes[1], j))  # drafting ends after pass j
        return keep

    def _start(self, ctx: VerifyContext, j: int) -> VerifyColumns:
        n = len(ctx.seq_ids)
        pc, cost = self._plan_ctx, ctx.cost
        if pc is not None and pc.step == ctx.step and pc.context_lens is ctx.context_lens:
            context = self._plan_key[1]  # the plan's sum over the same array
        else:
            context = self._context_tokens(ctx.context_lens)
        self._step, self._cost = ctx.step, cost
        self._depth = max(self._depth, j)  # a table too short for a step grows (`VerifyColumns`)
        passes = self._passes[1] if self._passes[0] == ctx.step else 0  # no plan this step: unknown
        p = self._prices_for(ctx.step, cost, context, n, max(self._depth, passes))
        sunk = passes * p.draft_all  # (see the module docstring)
        times, more = p.target[n:], (lambda k: p.target_at(n + k))  # each + sunk, where read
        a = self._alloc
        if a is not None and a.n_seq == n and a.margin == self.margin:
            a.reset(times, more, sunk)
        else:
            a = self._alloc = VerifyColumns(n, times, self.margin, more, sunk)
        return a

    def verify(self, ctx: VerifyContext) -> np.ndarray:
        n, j = ctx.conf.shape
        if n == 0 or j == 0:
            return np.zeros(n, np.int64)
        conf, drafted = np.asarray(ctx.conf, np.float64), np.asarray(ctx.drafted, np.int64)
        lens = np.asarray(ctx.context_lens, np.int64)
        a = self._alloc
        ans = None
        if a is not None and ctx.step == self._step and ctx.cost is self._cost:
            ans = a.answer(conf, drafted, lens)  # None: not a continuation of this step's calls
        if ans is None:
            a = self._start(ctx, j)
            ans = a.answer(conf, drafted, lens)
        self._depth = max(self._depth, a.j)
        return ans.copy()
