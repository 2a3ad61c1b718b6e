"""The controller: wraps a depth policy with learned acceptance, a cost model and safety rails.

Mechanism and policy apart (STYLE.md): the policy decides, the controller validates and clamps
what it returns (shape, dtype, range, NaN), survives a policy that raises (that step falls back
to `off`, each kind of fault counted and logged once), calibrates the draft's raw confidence
features before the policy sees them, and asks `verify` causally (see policies/base.py) so a
policy cannot leak a drafted token into its own verification decision.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from specdepth.policies.base import ChooseContext, DepthPolicy, DraftContext, PlanContext, StepOutcome, VerifyContext
from specdepth.workers.runner import StepResult

log = logging.getLogger("specdepth.controller")


class Priors:
    """A step's planning priors, `acceptance.prior_conf(seq_ids, K)`, computed when a policy first
    reads `PlanContext.prior_conf` (most policies never do), while the step is open: the controller
    closes it when it learns from the step (or plans the next), and a first read after that raises
    instead of answering with later statistics. Pickled (a policy shipped to a Ray replica with a
    context it kept), it travels as the array, or closed."""

    def __init__(self, model: Any, seq_ids: np.ndarray, K: int) -> None:
        self.model, self.seq_ids, self.K, self.open = model, seq_ids, K, model is not None

    def __call__(self) -> np.ndarray:
        if not self.open:
            raise RuntimeError("PlanContext.prior_conf first read after its step was learned from: "
                               "read it in `plan` and keep the array")
        return self.model.prior_conf(self.seq_ids, self.K)  # (B, K)

    def __reduce__(self):
        return (np.array, (self(),)) if self.open else (Priors, (None, self.seq_ids, self.K))


@dataclass
class StepRecord:
    """One step, as the controller learns from it: the runner's result and the loop's view of it."""

    step: int
    seq_ids: np.ndarray  # (B,) int64, the result's rows in order
    context_lens: np.ndarray  # (B,) int64 committed tokens before the step
    budgets: np.ndarray  # (B,) int64 draft budgets L_r planned
    result: StepResult  # drafted, verified, accepted, features and the passes' times
    finished: np.ndarray  # (F,) int64 sequence ids that left after the step
    overhead_s: Optional[float] = None  # the last complete step's time outside the model passes
    overhead_passes: int = 0  # that step's draft passes
    conf: Optional[np.ndarray] = None  # (B, J) confidences the policy was shown, where computed elsewhere
    verify_s: Optional[float] = None  # seconds of the causal verify calls (None: as this controller timed them)
    prev_step_s: float = 0.0  # the whole wall time of the step before (admission apart); 0: not measured


@dataclass
class _StepState:
    """What the controller holds about the step in progress; replaced when the next step begins."""

    step: int
    view: tuple[int, Any] = (-1, None)  # (batch size, the cost model as the step's policy calls see it)
    asks_verify: Optional[bool] = None  # `policy.verifies(step)`, asked once
    verify_s: float = 0.0  # seconds of the causal verify calls, with `time_verify`
    keep_conf: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # (B, j) last keep_drafting's
    shown_conf: Optional[np.ndarray] = None  # (B, J) the confidences verify computed
    priors: Optional[Priors] = None  # the planning priors `plan` offered
    free: Optional[np.ndarray] = None  # (B,) bool rows that kept the model-free draft (hybrid drafter)


def check_depths(policy: DepthPolicy, max_depth: int) -> None:
    """Raises ValueError where the policy's settings ask for a fixed depth past K (it would be clamped)."""
    past = [k for k in policy.depths_asked() if k > max_depth]
    if past:
        raise ValueError(f"policy {policy.describe()} asks for depth {max(past)}, past the largest "
                         f"draft budget K={max_depth} (--max-depth): lower it, or raise K")


class Controller:
    def __init__(self, policy: DepthPolicy, max_depth: int, cost: Any = None, acceptance: Any = None,
                 learn_cost: bool = True, time_verify: bool | None = None) -> None:
        """
        Args:
            policy: the depth policy.
            max_depth: K, the largest draft budget.
            cost: a cost model (adaptive.cost.model); default: a fixed 1 ms / 0.1 ms model.
            acceptance: an acceptance model (adaptive.acceptance); default: a fresh one.
            learn_cost: refine the cost model from measured step times (off for exact replays).
            time_verify: time the causal `verify` calls, for the policy's `StepOutcome` (default:
                as `learn_cost`).
        Raises:
            ValueError: the policy asks for a fixed depth past max_depth (it would be clamped).
        """
        from specdepth.adaptive.acceptance.model import AcceptanceModel
        from specdepth.adaptive.cost.model import FixedCost
        check_depths(policy, max_depth)
        self.policy = policy
        self.max_depth = max_depth
        self.free_draft = False  # drafting runs no model pass (`draft_is_free`)
        self.acceptance_free: Any = None  # the model-free rows' acceptance model (`drafts_hybrid`)
        self.cost = cost if cost is not None else FixedCost(target_ms=1.0, draft_ms=0.1)
        self.acceptance = acceptance if acceptance is not None else AcceptanceModel()
        self.learn_cost = learn_cost
        self.time_verify = learn_cost if time_verify is None else time_verify
        # (predicted pass, predicted draft passes, predicted overhead, measured pass, measured draft,
        # measured overhead) per step, the predictions made before the step was observed; filled
        # only when a list is put here (benchmarks: `ctl.cost_track = []`)
        self.cost_track: list[tuple[float, float, float, float, float, float]] | None = None
        self.track_s = 0.0  # seconds spent filling cost_track (an engine leaves them out of its timing)
        self.fallbacks: Counter[str] = Counter()
        self._causal = policy.overrides("verify")
        self._now = _StepState(-1)

    @property
    def cost(self) -> Any:
        """The cost model the policy plans with (adaptive.cost)."""
        return self._cost

    @cost.setter
    def cost(self, cost: Any) -> None:
        from specdepth.adaptive.cost.free_draft import FreeDraftCost
        self._cost = FreeDraftCost(cost) if self.free_draft and hasattr(cost, "to_dict") else cost

    def draft_is_free(self) -> None:
        """The runner drafts without a model (n-gram, suffix): price its draft passes at 0 from
        now on, whatever cost model is set (`adaptive.cost.free_draft`)."""
        self.free_draft = True
        self.cost = self._cost

    def drafts_hybrid(self) -> None:
        """The runner's drafter chooses per sequence between a model-free draft and the draft
        model's (`workers/drafters/hybrid.py`): the model-free rows get an acceptance model of
        their own, since their features (a continuation frequency, a match length) mean something
        else than the draft model's probabilities."""
        from specdepth.adaptive.acceptance.model import AcceptanceModel
        if self.acceptance_free is None:
            self.acceptance_free = AcceptanceModel(self.acceptance.config)

    def _state(self, step: int) -> _StepState:
        """The state of `step`, fresh when it is a new step (the last step's priors then close)."""
        if self._now.step != step:
            self._close_priors()
            self._now = _StepState(step)
        return self._now

    def _close_priors(self) -> None:
        if self._now.priors is not None:
            self._now.priors.open = False  # unread, they are gone once the step is learned from

    def step_cost(self, step: int, batch_size: int) -> Any:
        """The cost model as this step's policy calls see it: bound to the step's batch size when
        the model prices step shapes (`CostModel.at_batch`), the same object for every call of a step."""
        st = self._state(step)
        if st.view[0] != batch_size:
            at = getattr(self.cost, "at_batch", None)
            st.view = (batch_size, at(batch_size) if at else self.cost)
        return st.view[1]

    # ---- safety rails -----------------------------------------------------------------------
    def _fault(self, kind: str, detail: str) -> None:
        if not self.fallbacks[kind]:
            log.warning("policy %s: %s (%s); falling back for this step; further %s faults are "
                        "counted, not logged", self.policy.name, kind, detail, kind)
        self.fallbacks[kind] += 1

    def _ints(self, hook: str, value: Any, B: int, lo: np.ndarray | int, hi: np.ndarray | int,
              fallback: np.ndarray) -> np.ndarray:
        """Validate a policy's (B,) integer answer; clamp into [lo, hi]; fallback on garbage."""
        if type(value) is np.ndarray and value.dtype == np.int64 and value.shape == (B,) \
                and not ((value < lo).any() or (value > hi).any()):
            return value  # the common case, checked in three numpy calls
        try:
            arr = np.asarray(value, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError) as e:
            self._fault(f"{hook}: not numeric", str(e))
            return fallback
        if arr.shape != (B,):
            self._fault(f"{hook}: wrong shape", f"expected ({B},), got {np.shape(value)}")
            return fallback
        if not np.isfinite(arr).all():
            self._fault(f"{hook}: NaN/inf", str(arr))
            return fallback
        out = np.rint(arr).astype(np.int64)
        if (out < lo).any() or (out > hi).any():
            self._fault(f"{hook}: out of range", f"clamped into [{np.min(lo)}, {np.max(hi)}]")
            out = np.clip(out, lo, hi)
        return out

    def _call(self, hook: str, fn, ctx):
        try:
            return fn(ctx), True
        except Exception as e:  # a policy must never crash the engine
            self._fault(f"{hook}: raised {type(e).__name__}", str(e))
            return None, False

    # ---- the step -----------------------------------------------------------------------------
    def plan(self, step: int, seq_ids: np.ndarray, context_lens: np.ndarray,
             closing: np.ndarray | None = None) -> np.ndarray:
        """The step's budgets (B,) from the policy; `closing`: `PlanContext.closing`."""
        B = len(seq_ids)
        self._close_priors()
        st = self._now = _StepState(step)  # a plan opens its step
        st.priors = Priors(self.acceptance, seq_ids, self.max_depth)
        ctx = PlanContext(step, seq_ids, context_lens, self.max_depth, st.priors, self.step_cost(step, B),
                          cost_learns=self.learn_cost and bool(getattr(self.cost, "learns", False)),
                          closing=closing)
        off = np.zeros(B, np.int64)
        if self.max_depth == 0:  # K = 0 (--max-depth 0): nothing to draft, no decision to ask for
            return off
        val, ok = self._call("plan", self.policy.plan, ctx)
        if self._causal:
            self._verifies(step)
        return self._ints("plan", val, B, 0, self.max_depth, off) if ok else off

    def _verifies(self, step: int) -> bool:
        """`policy.verifies(step)`, asked once a step: right after `plan`, or where the plan was
        made elsewhere (a replica, whose policy comes from the controller after its plan), at the
        step's verify. A fault counts and asks `verify`."""
        st = self._state(step)
        if st.asks_verify is None:
            asks, fine = self._call("verifies", self.policy.verifies, step)
            st.asks_verify = bool(asks) if fine else True
        return st.asks_verify

    def verify_seconds(self, step: int) -> float:
        """Seconds of `step`'s causal verify calls, as timed with `time_verify` (0: not timed, or
        `verify` not asked)."""
        return self._now.verify_s if self._now.step == step else 0.0

    def keep_fn(self, step: int, seq_ids: np.ndarray, budgets: np.ndarray):
        """The callback asked after each draft pass (None: every sequence drafts to its budget),
        made once a step, after `plan`. `policy.drafts_dynamically(step)` False makes none that
        step (a fault counts and makes one)."""
        if not self.policy.overrides("keep_drafting"):
            return None
        dynamic, fine = self._call("drafts_dynamically", self.policy.drafts_dynamically, step)
        if fine and not dynamic:
            return None

        def keep(j: int, top1: np.ndarray, entropy: np.ndarray, drafted: np.ndarray) -> np.ndarray:
            conf = self._fresh_conf(seq_ids, top1, entropy)  # (B, j)
            self._state(step).keep_conf = conf  # the step's verify reuses it where drafting ended here
            val, ok = self._call("keep_drafting", self.policy.keep_drafting,
                                 DraftContext(step, seq_ids, budgets, drafted, conf, top1, entropy))
            if not ok:
                return np.zeros(len(seq_ids), bool)  # fall back: stop drafting
            arr = np.asarray(val)
            if arr.shape != (len(seq_ids),):
                self._fault("keep_drafting: wrong shape", f"got {arr.shape}")
                return np.zeros(len(seq_ids), bool)
            return arr.astype(bool)
        return keep

    def proposes_free(self, step: int) -> bool:
        """`policy.proposes_free(step)`: whether a hybrid drafter proposes its model-free draft
        this step (a fault counts and proposes it)."""
        val, fine = self._call("proposes_free", self.policy.proposes_free, step)
        return bool(val) if fine else True

    def choose_fn(self, step: int, seq_ids: np.ndarray, context_lens: np.ndarray, budgets: np.ndarray):
        """The hybrid drafter's callback: which rows keep the model-free draft, however short
        (`choose_drafter`, shown its calibrated confidences); the others draft with the model. A
        fault keeps it wherever it drafted anything."""
        def choose(top1: np.ndarray, entropy: np.ndarray, drafted: np.ndarray) -> np.ndarray:
            B = len(seq_ids)
            conf = self.acceptance_free.calibrate(seq_ids, top1, entropy) * (top1 > 0)  # (B, J)
            val, ok = self._call("choose_drafter", self.policy.choose_drafter,
                                 ChooseContext(step, seq_ids, context_lens, budgets, drafted, conf, top1,
                                               self.step_cost(step, B)))
            take = drafted > 0
            if ok:
                arr = np.asarray(val)
                if arr.shape == (B,):
                    take = arr.astype(bool)
                else:
                    self._fault("choose_drafter: wrong shape", f"got {arr.shape}")
            self._state(step).free = take
            return take
        return choose

    def verify_fn(self, step: int, seq_ids: np.ndarray, context_lens: np.ndarray):
        def verify(top1: np.ndarray, entropy: np.ndarray, drafted: np.ndarray) -> np.ndarray:
            if not np.any(drafted):  # nothing drafted (a plain step): nothing to verify, nothing to ask
                return drafted
            conf = self._calibrated(step, seq_ids, top1, entropy)  # (B, J)
            self._state(step).shown_conf = conf
            if not self._causal or not self._verifies(step):
                return drafted
            t = time.perf_counter()
            d = self._causal_verify(step, seq_ids, context_lens, drafted, conf, top1)
            if self.time_verify:  # none reported where the cost model is not learned (replays stay exact)
                self._state(step).verify_s = time.perf_counter() - t
            return d
        return verify

    def shown_conf(self, step: int, seq_ids: np.ndarray, top1: np.ndarray, entropy: np.ndarray) -> np.ndarray:
        """(B, J) the calibrated confidences the policy was shown at `step`: those its verify
        callback computed, or computed now (the model has not learned since)."""
        shown = self._now.shown_conf if self._now.step == step else None
        if shown is not None and shown.shape == np.shape(top1):
            return shown
        return self._fresh_conf(seq_ids, top1, entropy, self._free_rows(step))

    def _free_rows(self, step: int) -> Optional[np.ndarray]:
        """(B,) bool the rows of `step` that kept a model-free draft (hybrid), or None."""
        free = self._now.free if self._now.step == step else None
        return free if free is not None and free.any() else None

    def _fresh_conf(self, seq_ids: np.ndarray, top1: np.ndarray, entropy: np.ndarray,
                    free: Optional[np.ndarray] = None) -> np.ndarray:
        """(B, J) the acceptance model's calibrated confidences now, 0 past each drafted length;
        `free` (B,) bool rows are calibrated by the model-free rows' own model (hybrid)."""
        if not top1.any():  # nothing drafted (a plain step): every confidence is 0, no model asked
            return np.zeros(np.shape(top1))
        conf = self.acceptance.calibrate(seq_ids, top1, entropy) * (top1 > 0)
        if free is not None:
            conf[free] = self.acceptance_free.calibrate(seq_ids[free], top1[free], entropy[free]) * (top1[free] > 0)
        return conf

    def _calibrated(self, step: int, seq_ids: np.ndarray, top1: np.ndarray, entropy: np.ndarray) -> np.ndarray:
        """(B, J) the drafted positions' calibrated confidences. Where the step's last
        `keep_drafting` call saw every drafted position (drafting ended after it), its answer, padded:
        a column depends on its own features and the sequence's history only (`calibrate`), and
        neither changed since; saves a calibration, ~50-100 us after a draft pass on the CPU pair."""
        free = self._free_rows(step)
        if free is not None:
            return self._fresh_conf(seq_ids, top1, entropy, free)
        kept = self._state(step).keep_conf
        if kept.shape[0] == top1.shape[0] and 0 < kept.shape[1] <= top1.shape[1] \
                and not top1[:, kept.shape[1]:].any():
            conf = np.zeros(top1.shape)
            conf[:, :kept.shape[1]] = kept * (top1[:, :kept.shape[1]] > 0)
            return conf
        return self._fresh_conf(seq_ids, top1, entropy)

    def _causal_verify(self, step, seq_ids, context_lens, drafted, conf, top1) -> np.ndarray:
        """Ask the policy position by position; position j is decided from columns 1..j only
        (a model-free drafter's draft is asked once: no column depends on a sampled token)."""
        B, J = conf.shape
        d = np.zeros(B, np.int64)
        alive = drafted > 0
        conf = conf * (np.arange(J)[None, :] < drafted[:, None])  # (B, J) zero past each drafted length
        if self.free_draft:  # a deterministic draft: every column is a function of the prefix, one call decides
            ctx = VerifyContext(step, seq_ids, context_lens, drafted, conf, top1, self.step_cost(step, B))
            val, ok = self._call("verify", self.policy.verify, ctx)
            return self._ints("verify", val, B, 0, drafted, d) if ok else d
        for j in range(1, J + 1):
            if not alive.any():
                break
            # copies: a view would carry the later columns in its .base
            ctx = VerifyContext(step, seq_ids, context_lens, np.minimum(drafted, j), conf[:, :j].copy(),
                                top1[:, :j].copy(), self.step_cost(step, B))
            val, ok = self._call("verify", self.policy.verify, ctx)
            if not ok:
                return np.zeros(B, np.int64)  # fall back to `off` for this step
            ans = self._ints("verify", val, B, 0, np.minimum(drafted, j), np.zeros(B, np.int64))
            alive &= (ans >= j) & (drafted >= j)
            d[alive] = j
        return d

    def observe(self, rec: StepRecord) -> None:
        """Learn from a step: the acceptance model, the cost model (with `learn_cost`), the policy.

        `rec.conf` defaults to the confidences this controller computed in the step's verify;
        `rec.overhead_s` is the last complete step's time outside the model passes (for the cost
        model), `rec.verify_s` that of the causal verify calls (default: as timed here)."""
        res, seq_ids, context_lens = rec.result, rec.seq_ids, rec.context_lens
        top1, entropy, verified, accepted = res.top1, res.entropy, res.verified, res.accepted
        own = None  # this step's confidences from this very model (the calibration tally's)
        conf = rec.conf
        if conf is None:
            conf = own = self.shown_conf(rec.step, seq_ids, top1, entropy)
        elif conf.shape != top1.shape:
            conf = self._fresh_conf(seq_ids, top1, entropy, self._free_rows(rec.step))
        self._close_priors()
        free = res.free if res.free is not None and res.free.any() and self.acceptance_free is not None else None
        if free is None:
            self.acceptance.observe(seq_ids, top1, entropy, verified, accepted, conf=own)
        else:  # each drafter's rows teach its own model
            for model, rows in ((self.acceptance, ~free), (self.acceptance_free, free)):
                if rows.any():
                    model.observe(seq_ids[rows], top1[rows], entropy[rows], verified[rows], accepted[rows],
                                  conf=None if own is None else own[rows])
        n_tok, ctx, B = int((verified + 1).sum()), int(context_lens.sum()), len(seq_ids)
        if self.cost_track is not None and rec.overhead_s is not None:  # the prediction, then the learning
            self.cost.ready()  # tables the step's learning rebuilds anyway: timed
            t = time.perf_counter()
            o_step, o_pass = self.cost.step_overhead_s, self.cost.pass_overhead_s
            draft = res.draft_passes * (float(self.cost.draft_time(B, ctx)) - o_pass)
            if self.free_draft and res.draft_passes > 0 and hasattr(self.cost, "drafting_s"):
                draft = self.cost.drafting_s(B)  # no pass: the proposing, as a plan that drafts prices it
            self.cost_track.append((float(self.cost.target_time(n_tok, ctx, B)) - o_step, draft,
                                    o_step + o_pass * res.draft_passes, res.target_s, res.draft_s, rec.overhead_s))
            self.track_s += time.perf_counter() - t
        if self.learn_cost:
            self.cost.observe(n_tok, ctx, res.target_s, B, res.draft_passes, res.draft_s, rec.overhead_s,
                              rec.overhead_passes, batch_size=B)
        out = StepOutcome(rec.step, seq_ids, rec.budgets, res.drafted, verified, accepted, top1, conf,
                          res.draft_s + res.target_s, res.draft_s, res.target_s, context_lens, rec.finished,
                          res.keep_s, res.first_pass_s,
                          self.verify_seconds(rec.step) if rec.verify_s is None else rec.verify_s,
                          prev_step_s=rec.prev_step_s, free=res.free)
        self._call("observe", self.policy.observe, out)
        if len(rec.finished):
            self.acceptance.forget(rec.finished)
            if self.acceptance_free is not None:
                self.acceptance_free.forget(rec.finished)
