"""Hugging Face transformers' assisted-generation schedules: `hf-heuristic`, `hf-confidence`.

Both come from `AssistedCandidateGenerator` in transformers, where they run for one sequence at a
time; here `hf-heuristic` keeps one counter per sequence, and `hf-confidence` pools its
(probability, matched) pairs over all sequences (one threshold for the engine).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from specdepth.policies.base import DepthPolicy, DraftContext, PlanContext, StepOutcome


class HfHeuristic(DepthPolicy):
    """Per-sequence draft length: +2 after a fully matched step, else -1, floor 1; start 5.

    transformers `num_assistant_tokens_schedule="heuristic"`: "if all candidate tokens matched,
    num_assistant_tokens += 2, else num_assistant_tokens = max(1, num_assistant_tokens - 1)".
    A step is fully matched when `accepted == verified > 0`. As in transformers the counter is not
    capped from above; the budget is `min(counter, max_depth)`. A sequence's counter is dropped
    when its request finishes.
    """

    name: ClassVar[str] = "hf-heuristic"
    params: ClassVar[dict[str, object]] = {"start": 5, "up": 2, "down": 1, "floor": 1}

    def __init__(self, start: int = 5, up: int = 2, down: int = 1, floor: int = 1) -> None:
        if floor < 0 or start < floor or up < 0 or down < 0:
            raise ValueError(
                f"{self.name}: need 0 <= floor <= start and up, down >= 0; "
                f"got start={start}, up={up}, down={down}, floor={floor}"
            )
        self.start, self.up, self.down, self.floor = int(start), int(up), int(down), int(floor)
        self._k: dict[int, int] = {}  # seq id -> current num_assistant_tokens

    def current(self, seq_id: int) -> int:
        """The sequence's current counter (before capping by max_depth)."""
        return self._k.get(int(seq_id), self.start)

    def plan(self, ctx: PlanContext) -> np.ndarray:
        k = np.array([self.current(s) for s in ctx.seq_ids], dtype=np.int64)  # (B,)
        return np.minimum(k, ctx.max_depth)

    def observe(self, out: StepOutcome) -> None:
        full = (out.accepted == out.verified) & (out.verified > 0)  # (B,) every drafted token matched
        for sid, ok in zip(out.seq_ids.tolist(), full.tolist()):
            k = self.current(sid)
            self._k[sid] = k + self.up if ok else max(self.floor, k - self.down)
        for sid in out.finished.tolist():
            self._k.pop(int(sid), None)


def fit_confidence_threshold(p: np.ndarray, matched: np.ndarray, fn_weight: float = 3.0) -> float:
    """The threshold minimising fpr + fn_weight * fnr over the observed probabilities.

    As transformers does with `sklearn.metrics.roc_curve`: "matched" is the positive class and a
    pair is predicted positive (keep drafting) when p >= threshold. A false positive is drafting
    on past a token that did not match; a false negative is stopping (p < threshold) on a token
    that would have matched. Candidates are the distinct observed probabilities; ties go to the
    highest threshold (roc_curve lists thresholds in decreasing order, argmin takes the first).

    Args:
        p: (n,) probabilities; matched: (n,) bool; both classes must be present.
    """
    pos = np.sort(p[matched])  # (n_pos,)
    neg = np.sort(p[~matched])  # (n_neg,)
    thr = np.unique(p)[::-1]  # (T,) decreasing
    fnr = np.searchsorted(pos, thr, side="left") / len(pos)  # matched with p < thr
    fpr = 1.0 - np.searchsorted(neg, thr, side="left") / len(neg)  # unmatched with p >= thr
    return float(thr[int(np.argmin(fpr + fn_weight * fnr))])


class HfConfidence(DepthPolicy):
    """Draft until the draft's top-1 probability falls below a threshold that is re-fitted online.

    transformers `assistant_confidence_threshold` (default 0.4): drafting stops after a token whose
    probability is below the threshold (that token is still verified). After each step, every
    verified position up to and including the first mismatch yields a (top-1, matched) pair
    (positions after the first mismatch are unobserved, as in transformers); once at least
    `min_pairs` pairs of both classes are held, the threshold is re-fitted every `refit_every`
    steps by `fit_confidence_threshold` over the last `window` pairs. The raw top-1 is known before
    the token is sampled, so stopping on it is lossless (the sampled token's own probability,
    which transformers uses with a sampling assistant, would not be).

    Budgets are `min(k_max, max_depth)` (transformers' `num_assistant_tokens`, default 20).
    """

    name: ClassVar[str] = "hf-confidence"
    params: ClassVar[dict[str, object]] = {
        "threshold": 0.4,
        "k_max": 20,
        "window": 2048,
        "refit_every": 1,
        "min_pairs": 6,
        "fn_weight": 3.0,
    }

    def __init__(
        self,
        threshold: float = 0.4,
        k_max: int = 20,
        window: int = 2048,
        refit_every: int = 1,
        min_pairs: int = 6,  # transformers refits once len(probs) > 5
        fn_weight: float = 3.0,
    ) -> None:
        if not 0.0 <= threshold <= 1.0 or k_max < 1 or window < 2 or refit_every < 1:
            raise ValueError(
                f"{self.name}: need 0 <= threshold <= 1, k_max >= 1, window >= 2, refit_every >= 1; "
                f"got threshold={threshold}, k_max={k_max}, window={window}, refit_every={refit_every}"
            )
        self.threshold = float(threshold)  # the current (fitted) threshold
        self.k_max, self.window, self.refit_every = int(k_max), int(window), int(refit_every)
        self.min_pairs, self.fn_weight = int(min_pairs), float(fn_weight)
        self._p = np.zeros(0)  # (n,) top-1 probabilities of observed positions, oldest first
        self._m = np.zeros(0, dtype=bool)  # (n,) whether each matched
        self._observed = 0

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the held (top-1, matched) pairs, oldest first: (n,) float, (n,) bool."""
        return self._p.copy(), self._m.copy()

    def plan(self, ctx: PlanContext) -> np.ndarray:
        return np.full(ctx.batch_size, min(self.k_max, ctx.max_depth), dtype=np.int64)

    def keep_drafting(self, ctx: DraftContext) -> np.ndarray:
        last = np.maximum(ctx.drafted - 1, 0)  # (B,) index of the last drafted position
        rows = np.arange(len(ctx.drafted))
        p_last = ctx.top1[rows, last] if ctx.top1.shape[1] else np.ones(len(rows))  # (B,)
        return (ctx.drafted == 0) | (p_last >= self.threshold)

    def observe(self, out: StepOutcome) -> None:
        j = np.arange(out.top1.shape[1])[None, :]  # (1, J) 0-based position
        seen = j < np.minimum(out.verified, out.accepted + 1)[:, None]  # (B, J) up to first mismatch
        matched = j < out.accepted[:, None]  # (B, J)
        self._p = np.concatenate([self._p, out.top1[seen]])[-self.window :]
        self._m = np.concatenate([self._m, matched[seen]])[-self.window :]
        self._observed += 1
        if self._observed % self.refit_every:
            return
        if len(self._p) >= self.min_pairs and self._m.any() and not self._m.all():
            self.threshold = fit_confidence_threshold(self._p, self._m, self.fn_weight)
