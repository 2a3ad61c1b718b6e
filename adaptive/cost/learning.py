"""Online refinement of a profiled cost model from the step times the engine measures.

`ProfiledCost` prices a step from its tables; this mixin holds what it learns while serving, in
four parts, each bounded so that one slow step cannot swing a price:

- *speed*: one shared log-correction that scales every prediction, target and draft alike. A
  busy spell of a shared machine slows both models; moving them together keeps the table's shape
  (the draft/target ratio, the knee), which depth decisions rest on. It moves fast, by
  clip(speed_lr * log r, +-log(1 + speed_max_step)) for an observed/predicted ratio r.
- *cells*: a log-correction per grid cell for the table's own lasting errors. The cells around
  an observation move by clip(cell_share * lr * log r, +-cell_share * log(1 + max_step)),
  shared by their interpolation weights: slowly.
- *draft ratio*: the engine's draft pass against the profiled forward (`_learn_draft_ratio`).
- *overhead*: the time a step spends outside its passes, a line
  `step_overhead_s + pass_overhead_s x draft passes` per bucket of batch sizes (`_learn_overhead`).

A slow outlier's effect halves with each normal step after it; consistent evidence converges
geometrically. `frozen` turns all of it off (exact replays).
"""

from __future__ import annotations

import bisect
import math
from typing import Any

import numpy as np

# The cells' default share of each observation's evidence, written as 1 - 0.67 so that it is the
# same float as before the parameter was renamed (`speed_share` = 0.67, the share the cells left).
CELL_SHARE = 1.0 - 0.67


def _update_weights(x: float, grid: np.ndarray) -> list[tuple[int, float]]:
    """Which cells an observation at x corrects, and by what share. Beyond the right edge both
    edge cells move together, so the extrapolated line scales instead of tilting."""
    if len(grid) == 1 or x <= grid[0]:
        return [(0, 1.0)]
    if x >= grid[-1]:
        return [(len(grid) - 2, 1.0), (len(grid) - 1, 1.0)]
    i0 = bisect.bisect_right(grid, x) - 1  # the bracketing cell, in plain Python
    w = (float(x) - float(grid[i0])) / (float(grid[i0 + 1]) - float(grid[i0]))
    return [(i0, 1.0 - w), (i0 + 1, w)]


class OnlineRefinement:
    """The learning half of `ProfiledCost` (module doc). The host class provides the tables' grids
    (`token_grid`, `ctx_grid`, `batch_grid`), `base_target` / `base_draft` (their shapes size the
    cell corrections), `target_time`, `_pass_time` (a draft pass without its overhead), and
    rebuilds its tables when `_dirty` is set."""

    token_grid: np.ndarray
    ctx_grid: np.ndarray
    batch_grid: np.ndarray
    base_target: np.ndarray
    base_draft: np.ndarray
    _dirty: bool

    def _init_learning(self, lr: float, max_step: float, frozen: bool, target_logcorr: Any, draft_logcorr: Any,
                       speed_logcorr: float, cell_share: float, speed_lr: float, speed_max_step: float,
                       step_overhead_s: float, pass_overhead_s: float, overhead_moments: Any,
                       draft_ratio_logcorr: float, draft_steps: float, overhead_bucket: int,
                       overhead_lines: Any) -> None:
        """Validate and set the learned state (fresh, or as `_learning_dict` saved it).

        Raises:
            ValueError: a rate, bound or share out of range, or a negative overhead.
        """
        if not (0 < max_step < 1 and 0 < lr <= 1 and 0 <= cell_share <= 1 and 0 <= speed_lr <= 1
                and 0 <= speed_max_step < 1):
            raise ValueError(f"need 0 < max_step < 1, 0 < lr <= 1, 0 <= cell_share <= 1, 0 <= speed_lr <= 1, "
                             f"0 <= speed_max_step < 1, got {max_step}, {lr}, {cell_share}, {speed_lr}, "
                             f"{speed_max_step}")
        for name, v in (("step_overhead_s", step_overhead_s), ("pass_overhead_s", pass_overhead_s)):
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {v}")
        self.lr, self.max_step, self.frozen = float(lr), float(max_step), bool(frozen)
        self.target_logcorr = np.zeros_like(self.base_target) if target_logcorr is None \
            else np.asarray(target_logcorr, np.float64).reshape(self.base_target.shape)  # (Nc, Nt)
        self.draft_logcorr = np.zeros_like(self.base_draft) if draft_logcorr is None \
            else np.asarray(draft_logcorr, np.float64).reshape(self.base_draft.shape)  # (Nc, Nb)
        self.speed_logcorr, self.cell_share = float(speed_logcorr), float(cell_share)
        self.speed_lr, self.speed_max_step = float(speed_lr), float(speed_max_step)
        self.draft_ratio_logcorr, self.draft_steps = float(draft_ratio_logcorr), float(draft_steps)
        self.step_overhead_s, self.pass_overhead_s = float(step_overhead_s), float(pass_overhead_s)
        # weighted moments of (draft passes p, overhead y): n, E[p], E[y], E[p^2], E[p y]
        self._moments = np.array([0.0 if step_overhead_s == 0 else 2 / lr, 0.0, step_overhead_s, 0.0, 0.0]) \
            if overhead_moments is None \
            else np.asarray(overhead_moments, np.float64).reshape(5)
        # the line above is the overhead bucket `_bucket`'s; the other buckets' (moments, step,
        # pass) wait here (see `_overhead_bucket`)
        self._bucket = int(overhead_bucket)
        self._lines: dict[int, tuple[np.ndarray, float, float]] = {
            int(k): (np.asarray(v[:5], np.float64), float(v[5]), float(v[6])) for k, v in (overhead_lines or {}).items()}

    def _learning_dict(self) -> dict[str, Any]:
        """The learned state and its settings, JSON-ready (`_init_learning`'s arguments)."""
        return {"lr": self.lr, "max_step": self.max_step,
                "frozen": self.frozen, "target_logcorr": self.target_logcorr.tolist(),
                "draft_logcorr": self.draft_logcorr.tolist(), "speed_logcorr": self.speed_logcorr,
                "cell_share": self.cell_share, "speed_lr": self.speed_lr, "speed_max_step": self.speed_max_step,
                "step_overhead_s": self.step_overhead_s,
                "pass_overhead_s": self.pass_overhead_s, "overhead_moments": self._moments.tolist(),
                "overhead_bucket": self._bucket,
                "overhead_lines": {str(k): [*m.tolist(), a, b] for k, (m, a, b) in self._lines.items()},
                "draft_ratio_logcorr": self.draft_ratio_logcorr, "draft_steps": self.draft_steps}

    @property
    def learns(self) -> bool:
        return not self.frozen

    def _learn_draft_ratio(self, observed: float, predicted: float) -> bool:
        """A running mean of log(observed / predicted) over the drafting steps, applied to every
        draft pass: the engine's pass is not the profiled forward (a step's first pass catches up
        on the tokens committed since the sequence last drafted, and every pass computes features
        and moves tokens), and the bounded per-cell correction learns that too slowly for a policy
        that drafts now and then.

        Each observation counts as at most twice the prediction (or half): an engine's first
        drafting step pays one-off first calls. The memory is ~2 / lr *steps*, drafting or not:
        `draft_steps` (the weight of the drafting steps seen) decays by 1 - lr / 2 every step
        (`observe`) and a new one weighs 1 / (1 + draft_steps), so a policy that stopped drafting
        because the ratio priced the pass too dear corrects it from the odd pass it drafts.
        Returns whether the observation was taken whole (False: not finite, or clipped)."""
        if not (math.isfinite(observed) and observed > 0 and predicted > 0):
            return False
        w = 1.0 / (1.0 + self.draft_steps)
        self.draft_steps += 1
        bound, r = math.log(2.0), math.log(observed / predicted)
        self.draft_ratio_logcorr += w * min(max(r, -bound), bound)
        return abs(r) <= bound

    def _overhead_bucket(self, batch_size: int) -> None:
        """Switch the overhead line to `batch_size`'s bucket (batch sizes of one power of two).

        The time outside the passes grows with the batch (per-sequence bookkeeping), so one line
        through steps of every batch size would fit the batch's changes instead of the passes'.
        A bucket first seen starts from the line in use, its intercept refitted from its first
        step, its slope kept until its own steps' passes vary."""
        bucket = int(batch_size).bit_length()
        if bucket == self._bucket:
            return
        self._lines[self._bucket] = (self._moments, self.step_overhead_s, self.pass_overhead_s)
        self._moments, self.step_overhead_s, self.pass_overhead_s = self._lines.pop(
            bucket, (np.zeros(5), self.step_overhead_s, self.pass_overhead_s))
        self._bucket = bucket

    def _learn_overhead(self, seconds: float, passes: int) -> None:
        """One step's time outside its passes: move the moments, refit the line.

        A least-squares line through exponentially weighted moments: a running mean over the
        first 2 / lr steps, then 2 / lr steps' memory; the slope ridge-shrunk toward its last
        value, both kept >= 0."""
        m = self._moments
        # an outlier (an engine's first step's one-off allocations, a pause) counts as at most twice
        # the prediction plus 1 ms, from the very first step; a true overhead above the cap is
        # reached by doubling in a few steps
        y = min(max(seconds, 0.0), 2.0 * (self.step_overhead_s + self.pass_overhead_s * passes) + 1e-3)
        # in Python floats, element by element: the same float64 operations as on the (5,) array,
        # without numpy's per-call cost on a path every step takes
        n, ep, ey, epp, epy = (float(v) for v in m)
        n += 1
        w = max(self.lr / 2, 1.0 / n)
        ep += w * (passes - ep)
        ey += w * (y - ey)
        epp += w * (passes * passes - epp)
        epy += w * (passes * y - epy)
        m[:] = (n, ep, ey, epp, epy)
        var, cov = epp - ep ** 2, epy - ep * ey
        # ridge toward the current slope: little spread in the passes (a run that stopped drafting)
        # keeps what was learned instead of fitting noise
        self.pass_overhead_s = max((cov + 0.05 * self.pass_overhead_s) / (max(var, 0.0) + 0.05), 0.0)
        self.step_overhead_s = max(ey - self.pass_overhead_s * ep, 0.0)

    def _correct(self, logcorr: np.ndarray, cols: np.ndarray, x: float, ctx: float, observed: float,
                 predicted: float) -> float | None:
        """Move the cells around (x, ctx); return the log ratio for the speed (None: no evidence)."""
        if not (math.isfinite(observed) and observed > 0 and predicted > 0):
            return None
        bound = math.log1p(self.max_step) * self.cell_share
        r = math.log(observed / predicted)
        step = min(max(self.cell_share * self.lr * r, -bound), bound)
        for ci, wc in _update_weights(ctx, self.ctx_grid):
            for xi, wx in _update_weights(x, cols):
                logcorr[ci, xi] += wc * wx * step
        return r

    def observe(self, n_tokens: int, context_tokens: int, target_s: float, draft_batch: int,
                draft_passes: int, draft_s: float, overhead_s: float | None = None,
                overhead_passes: int = 0, batch_size: int = 0) -> None:
        """Bounded multiplicative correction of the cells around this step and of the speed
        (module doc). The draft's time is attributed per pass at `draft_batch` (its first, largest
        pass). `overhead_s` (of a step with `overhead_passes` draft passes) refits the overhead
        line. The target pass is predicted at the step's `batch_size` (0: not known)."""
        if self.frozen:
            return
        self.draft_steps *= 1.0 - self.lr / 2  # every step ages the draft ratio's evidence (`_learn_draft_ratio`)
        if overhead_s is not None and math.isfinite(overhead_s):
            if batch_size > 0:
                self._overhead_bucket(batch_size)
            self._learn_overhead(overhead_s, overhead_passes)
        ratios = []
        if n_tokens > 0:
            ratios.append(self._correct(self.target_logcorr, self.token_grid, n_tokens, context_tokens, target_s,
                                        self.target_time(n_tokens, context_tokens, batch_size) - self.step_overhead_s))
        if draft_passes > 0 and draft_batch > 0:
            per_pass = draft_s / draft_passes
            # the cells then learn what the ratio left: the prediction is taken again after it moved;
            # an observation the ratio had to clip is an outlier (or a ratio still on its way), not evidence
            if self._learn_draft_ratio(per_pass, self._pass_time(draft_batch, context_tokens)):
                ratios.append(self._correct(self.draft_logcorr, self.batch_grid, draft_batch, context_tokens,
                                            per_pass, self._pass_time(draft_batch, context_tokens)))
        ratios = [r for r in ratios if r is not None]
        if ratios:  # the shared speed: both models' evidence, averaged
            bound = math.log1p(self.speed_max_step)
            self.speed_logcorr += min(max(self.speed_lr * sum(ratios) / len(ratios), -bound), bound)
        self._dirty = True
