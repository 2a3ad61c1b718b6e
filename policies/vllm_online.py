"""vllm-online: vLLM main's adaptive verification with an online acceptance estimator (PR 52228).

vLLM PR 52228 ("Acceptance estimation for adaptive verification") extends adaptive verification to
drafters without a confidence head (EAGLE3, MTP, DFlash). Its rule, as the PR describes it:

- Confidence of drafted position j of request r: c_{r,j} = sigmoid(w * logit(max q) + b), a logistic
  model on the log-odds of the draft's top-1 probability at j (known before x_{r,j} is chosen),
  recalibrated online from the accept/reject outcomes of verified positions.
- Survival s_{r,j} = prod_{i<=j} c_{r,i}, per request.
- Budget: B* = argmax_B (N + sum of the B highest survivals) / (draft_cost(N) + verify_cost(N + B)),
  over the global top-B of (request, position) survivals, sized on the CPU from the previous
  step's (stale) confidences; draft_cost pays the full block (K passes); costs from the start-up
  tables, context ignored (`vllm_adaptive.budget_for_slots`).
- Slots: the B* highest *current* survivals (this step's confidences), so each request keeps a
  prefix; drafting is the full block.

Constants the PR leaves open, and what is used: the model starts at the identity (w = 1, b = 0:
confidence = max q, the uncalibrated signal vLLM uses for DFlash), and is refitted after every step
by damped Newton steps on the log loss over the last `window` observations, with a unit L2 pull toward
the identity (it keeps the fit defined on one-class data and matters little once thousands of
observations are held). A request with no stale confidences yet (first step) is sized with the mean
stale survival of the others, or with the model's confidence at max q = `init_top1` when none has.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from specdepth.policies.allocation import top_k_lengths
from specdepth.policies.base import DepthPolicy, PlanContext, StepOutcome, VerifyContext
from specdepth.policies.vllm_adaptive import budget_for_slots

_EPS = 1e-6  # max q is clipped to [eps, 1 - eps] before the log-odds


def log_odds(p: np.ndarray) -> np.ndarray:
    """logit(p), p clipped to [eps, 1 - eps]."""
    p = np.clip(p, _EPS, 1.0 - _EPS)
    return np.log(p) - np.log1p(-p)


_IDENTITY = np.array([1.0, 0.0])  # (w, b) with sigmoid(w * logit(q) + b) = q


def sigmoid(z: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-z)), without overflow."""
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _penalised_loss(design: np.ndarray, y: np.ndarray, coef: np.ndarray, ridge: float) -> float:
    z = design @ coef  # (n,)
    # log(1 + e^z) - y z, summed: the log loss of y ~ sigmoid(z), computed without overflow
    return float(np.sum(np.logaddexp(0.0, z) - y * z) + 0.5 * ridge * np.sum((coef - _IDENTITY) ** 2))


def fit_logistic(x: np.ndarray, y: np.ndarray, coef: np.ndarray, *, ridge: float, steps: int) -> np.ndarray:
    """Newton steps on the log loss of y ~ sigmoid(w * x + b), from `coef`, with an L2 pull of
    weight `ridge` toward the identity (w, b) = (1, 0), so a few observations move it little.
    Each step is halved until the loss falls (a full Newton step can overshoot a logistic loss).

    Args:
        x: (n,) features; y: (n,) 0/1 labels; coef: (2,) start (w, b).

    Returns:
        (2,) the new (w, b).
    """
    design = np.stack([x, np.ones_like(x)], axis=1)  # (n, 2)
    coef = coef.astype(np.float64).copy()
    loss = _penalised_loss(design, y, coef, ridge)
    for _ in range(steps):
        p = sigmoid(design @ coef)  # (n,)
        grad = design.T @ (p - y) + ridge * (coef - _IDENTITY)  # (2,)
        hess = (design * (p * (1.0 - p))[:, None]).T @ design + ridge * np.eye(2)  # (2, 2)
        step = np.linalg.solve(hess, grad)  # (2,)
        for _ in range(30):
            trial = coef - step
            trial_loss = _penalised_loss(design, y, trial, ridge)
            if trial_loss <= loss:
                coef, loss = trial, trial_loss
                break
            step = 0.5 * step
    return coef


class VllmOnline(DepthPolicy):
    """vLLM adaptive verification with an online logistic acceptance estimator on logit(max q).

    Params:
        window: observations (verified position, accepted or not) the model is refitted on.
        ridge: L2 pull of the refit toward the identity (keeps it finite while one class is missing).
        newton_steps: Newton iterations per refit, warm-started from the current model.
        init_top1: max q assumed for sizing when no request has stale confidences yet.
    """

    name: ClassVar[str] = "vllm-online"
    params: ClassVar[dict[str, object]] = {"window": 4096, "ridge": 1.0, "newton_steps": 2, "init_top1": 0.7}

    def __init__(self, window: int = 4096, ridge: float = 1.0, newton_steps: int = 2, init_top1: float = 0.7) -> None:
        if window < 2 or ridge <= 0 or newton_steps < 1 or not 0.0 < init_top1 < 1.0:
            raise ValueError(
                f"{self.name}: need window >= 2, ridge > 0, newton_steps >= 1, 0 < init_top1 < 1; got "
                f"window={window}, ridge={ridge}, newton_steps={newton_steps}, init_top1={init_top1}"
            )
        self.window, self.ridge = int(window), float(ridge)
        self.newton_steps, self.init_top1 = int(newton_steps), float(init_top1)
        self.coef = _IDENTITY.copy()  # (w, b): starts as the identity calibration
        self._x = np.zeros(0)  # (n,) logit(max q) of observed positions, oldest first
        self._y = np.zeros(0)  # (n,) 1.0 accepted, 0.0 rejected
        self._stale: dict[int, np.ndarray] = {}  # request id -> (J,) survivals of its last step
        self.budget = 0  # B* of the last plan
        self._budget_step: int | None = None

    def confidence(self, top1: np.ndarray) -> np.ndarray:
        """c = sigmoid(w * logit(top1) + b), elementwise; 0 where top1 is 0 (not drafted)."""
        z = self.coef[0] * log_odds(top1) + self.coef[1]
        return np.where(top1 > 0, sigmoid(z), 0.0)

    def _sizing_slots(self, seq_ids: np.ndarray, depth: int) -> np.ndarray:
        """(B * depth,) the stale survivals of every (request, position) slot."""
        known = [self._fit(self._stale[int(s)], depth) for s in seq_ids if int(s) in self._stale]
        if known:
            fill = np.mean(known, axis=0)  # (depth,)
        else:
            fill = np.cumprod(np.full(depth, float(self.confidence(np.array([self.init_top1]))[0])))
        rows = [self._fit(self._stale[int(s)], depth) if int(s) in self._stale else fill for s in seq_ids]
        return np.concatenate(rows) if rows else np.zeros(0)

    @staticmethod
    def _fit(values: np.ndarray, depth: int) -> np.ndarray:
        out = np.zeros(depth)
        keep = min(depth, values.size)
        out[:keep] = values[:keep]
        return out

    def plan(self, ctx: PlanContext) -> np.ndarray:
        slots = self._sizing_slots(ctx.seq_ids, ctx.max_depth)
        self.budget = budget_for_slots(slots, ctx.batch_size, ctx.max_depth, ctx.cost)
        self._budget_step = ctx.step
        return np.full(ctx.batch_size, ctx.max_depth, np.int64)

    def verify(self, ctx: VerifyContext) -> np.ndarray:
        drafted = np.arange(1, ctx.top1.shape[1] + 1)[None, :] <= np.asarray(ctx.drafted)[:, None]  # (B, j)
        survival = np.cumprod(self.confidence(ctx.top1) * drafted, axis=1)  # (B, j) current values
        if self._budget_step == ctx.step:
            budget = self.budget
        else:  # not planned this step (a hand-driven call): size it from the same stale survivals
            depth = ctx.top1.shape[1]
            budget = budget_for_slots(self._sizing_slots(ctx.seq_ids, depth), len(ctx.seq_ids), depth, ctx.cost)
        return top_k_lengths(survival, budget)

    def observe(self, out: StepOutcome) -> None:
        top1 = np.asarray(out.top1, np.float64)  # (B, J)
        # the confidences this step showed (before the refit): next step's stale survivals
        survival = np.cumprod(self.confidence(top1), axis=1)  # (B, J)
        for r, sid in enumerate(out.seq_ids.tolist()):
            self._stale[int(sid)] = survival[r, : int(out.drafted[r])]
        for sid in out.finished.tolist():
            self._stale.pop(int(sid), None)
        j = np.arange(top1.shape[1])[None, :]  # (1, J) 0-based position
        seen = (j < np.minimum(out.verified, out.accepted + 1)[:, None]) & (top1 > 0)  # (B, J) up to the first reject
        if not seen.any():
            return
        accepted = (j < out.accepted[:, None])[seen].astype(np.float64)
        self._x = np.concatenate([self._x, log_odds(top1[seen])])[-self.window :]
        self._y = np.concatenate([self._y, accepted])[-self.window :]
        self.coef = fit_logistic(self._x, self._y, self.coef, ridge=self.ridge, steps=self.newton_steps)
