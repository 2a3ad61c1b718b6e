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
from typing import Any

import numpy as np

from specdepth.policies.base import DepthPolicy, DraftContext, PlanContext, StepOutcome, VerifyContext

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


class Controller:
    def __init__(self, policy: DepthPolicy, max_depth: int, cost: Any = None, acceptance: Any = None,
                 learn_cost: bool = True, time_verify: bool | None = None) -> None:
        """
        Args:
            policy: the depth policy.
            max_depth: K, the largest draft budget.
            cost: a cost model (adaptive.cost_model); default: a fixed 1 ms / 0.1 ms model.
            acceptance: an acceptance model (adaptive.acceptance); default: a fresh one.
            learn_cost: refine the cost model from measured step times (off for exact replays).
            time_verify: time the causal `verify` calls, for the policy's `StepOutcome` (default:
                as `learn_cost`; a replica's controller times them for the controller it serves).
        """
        from specdepth.adaptive.acceptance import AcceptanceModel
        from specdepth.adaptive.cost_model import FixedCost
        self.policy = policy
        self.max_depth = max_depth
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
        self._view: tuple[int, int, Any] = (-1, -1, None)  # (step, batch size, the cost policies see)
        self._asks_verify = (-1, True)  # (step, whether its `verify` is asked: `policy.verifies`)
        self._verify_s = (-1, 0.0)  # (step, seconds of its causal verify calls), with `time_verify`
        self._priors = Priors(None, np.zeros(0, np.int64), max_depth)  # the planning priors of the last `plan`
        self._keep_conf = (-1, np.zeros((0, 0)))  # (step, its last keep_drafting confidences)
        self._last_conf, self._last_conf_step = np.zeros((0, 0)), -1  # the confidences verify computed, its step

    def step_cost(self, step: int, batch_size: int) -> Any:
        """The cost model as this step's policy calls see it: bound to the step's batch size when
        the model prices step shapes (`CostModel.at_batch`), the same object for every call of a step."""
        if self._view[:2] != (step, batch_size):
            at = getattr(self.cost, "at_batch", None)
            self._view = (step, batch_size, at(batch_size) if at else self.cost)
        return self._view[2]

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
    def plan(self, step: int, seq_ids: np.ndarray, context_lens: np.ndarray) -> np.ndarray:
        B = len(seq_ids)
        self._priors.open = False  # the last step's, if a policy kept it unread (see `Priors`)
        self._priors = Priors(self.acceptance, seq_ids, self.max_depth)
        ctx = PlanContext(step, seq_ids, context_lens, self.max_depth, self._priors, self.step_cost(step, B),
                          cost_learns=self.learn_cost and bool(getattr(self.cost, "learns", False)))
        off = np.zeros(B, np.int64)
        val, ok = self._call("plan", self.policy.plan, ctx)
        if self._causal:
            self._verifies(step)
        return self._ints("plan", val, B, 0, self.max_depth, off) if ok else off

    def _verifies(self, step: int) -> bool:
        """`policy.verifies(step)`, asked once a step: right after `plan`, or where the plan was
        made elsewhere (a replica, whose policy comes from the controller after its plan), at the
        step's verify. A fault counts and asks `verify`."""
        if self._asks_verify[0] != step:
            asks, fine = self._call("verifies", self.policy.verifies, step)
            self._asks_verify = (step, bool(asks) if fine else True)
        return self._asks_verify[1]

    def verify_seconds(self, step: int) -> float:
        """Seconds of `step`'s causal verify calls, as timed with `time_verify` (0: not timed, or
        `verify` not asked)."""
        return self._verify_s[1] if self._verify_s[0] == step else 0.0

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
            self._keep_conf = (step, conf)  # the step's verify reuses it where drafting ended here
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

    def verify_fn(self, step: int, seq_ids: np.ndarray, context_lens: np.ndarray):
        def verify(top1: np.ndarray, entropy: np.ndarray, drafted: np.ndarray) -> np.ndarray:
            conf = self._calibrated(step, seq_ids, top1, entropy)  # (B, J)
            self._last_conf, self._last_conf_step = conf, step
            if not self._causal or not self._verifies(step):
                return drafted
            t = time.perf_counter()
            d = self._causal_verify(step, seq_ids, context_lens, drafted, conf, top1)
            if self.time_verify:  # none reported where the cost model is not learned (replays stay exact)
                self._verify_s = (step, time.perf_counter() - t)
            return d
        return verify

    def shown_conf(self, step: int, seq_ids: np.ndarray, top1: np.ndarray, entropy: np.ndarray) -> np.ndarray:
        """(B, J) the calibrated confidences the policy was shown at `step`: those its verify
        callback computed, or computed now (the model has not learned since)."""
        if self._last_conf_step == step and self._last_conf.shape == np.shape(top1):
            return self._last_conf
        return self._fresh_conf(seq_ids, top1, entropy)

    def _fresh_conf(self, seq_ids: np.ndarray, top1: np.ndarray, entropy: np.ndarray) -> np.ndarray:
        """(B, J) the acceptance model's calibrated confidences now, 0 past each drafted length."""
        return self.acceptance.calibrate(seq_ids, top1, entropy) * (top1 > 0)

    def _calibrated(self, step: int, seq_ids: np.ndarray, top1: np.ndarray, entropy: np.ndarray) -> np.ndarray:
        """(B, J) the drafted positions' calibrated confidences. Where the step's last
        `keep_drafting` call saw every drafted position (drafting ended after it), its answer, padded:
        a column depends on its own features and the sequence's history only (`calibrate`), and
        neither changed since; saves a calibration, ~50-100 us after a draft pass on the CPU pair."""
        kept_step, kept = self._keep_conf
        if kept_step == step and kept.shape[0] == top1.shape[0] and kept.shape[1] <= top1.shape[1] \
                and not top1[:, kept.shape[1]:].any():
            conf = np.zeros(top1.shape)
            conf[:, :kept.shape[1]] = kept * (top1[:, :kept.shape[1]] > 0)
            return conf
        return self._fresh_conf(seq_ids, top1, entropy)

    def _causal_verify(self, step, seq_ids, context_lens, drafted, conf, top1) -> np.ndarray:
        """Ask the policy position by position; position j is decided from columns 1..j only."""
        B, J = conf.shape
        d = np.zeros(B, np.int64)
        alive = drafted > 0
        conf = conf * (np.arange(J)[None, :] < drafted[:, None])  # (B, J) zero past each drafted length
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

    def observe(self, step: int, seq_ids: np.ndarray, context_lens: np.ndarray, budgets: np.ndarray,
                drafted: np.ndarray, verified: np.ndarray, accepted: np.ndarray, top1: np.ndarray,
                entropy: np.ndarray, draft_s: float, target_s: float, draft_passes: int,
                finished: np.ndarray, conf: np.ndarray | None = None, overhead_s: float | None = None,
                overhead_passes: int = 0, keep_s: float = 0.0, first_pass_s: float = 0.0,
                verify_s: float | None = None) -> None:
        """Learn from a step. `conf`: the calibrated confidences the policy was shown (default: those
        this controller computed in the step's verify; a remote replica passes its own).
        `overhead_s`: a step's time outside the model passes, for the cost model (the engine
        reports its last complete step's), and `overhead_passes` that step's draft passes.
        `keep_s`: the seconds the step spent in the `keep_drafting` callback, and `first_pass_s`
        those of its first draft pass (0: not measured), and `verify_s` those of its causal verify
        calls (None: as this controller timed them, `verify_seconds`); the policy sees all three."""
        own = None  # this step's confidences from this very model (the calibration tally's)
        if conf is None:
            conf = own = self.shown_conf(step, seq_ids, top1, entropy)
        elif conf.shape != top1.shape:
            conf = self._fresh_conf(seq_ids, top1, entropy)
        self._priors.open = False  # the step's priors, if unread, are gone once it is learned from
        self.acceptance.observe(seq_ids, top1, entropy, verified, accepted, conf=own)
        n_tok, ctx = int((verified + 1).sum()), int(context_lens.sum())
        if self.cost_track is not None and overhead_s is not None:  # the prediction, then the learning
            self.cost.ready()  # tables the step's learning rebuilds anyway: timed
            t = time.perf_counter()
            o_step, o_pass = self.cost.step_overhead_s, self.cost.pass_overhead_s
            self.cost_track.append((float(self.cost.target_time(n_tok, ctx, len(seq_ids))) - o_step,
                                    draft_passes * (float(self.cost.draft_time(len(seq_ids), ctx)) - o_pass),
                                    o_step + o_pass * draft_passes, target_s, draft_s, overhead_s))
            self.track_s += time.perf_counter() - t
        if self.learn_cost:
            self.cost.observe(n_tok, ctx, target_s, len(seq_ids), draft_passes, draft_s, overhead_s,
                              overhead_passes, batch_size=len(seq_ids))
        out = StepOutcome(step, seq_ids, budgets, drafted, verified, accepted, top1, conf,
                          draft_s + target_s, draft_s, target_s, context_lens, finished, keep_s, first_pass_s,
                          self.verify_seconds(step) if verify_s is None else verify_s)
        self._call("observe", self.policy.observe, out)
        if len(finished):
            self.acceptance.forget(finished)
