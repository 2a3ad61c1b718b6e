"""Acceptance learning: calibrated confidences c_{r,j} from features known before draft token j.

c_{r,j} = P(position j of sequence r is accepted | positions < j were), DESIGN.md's confidence.
Three layers, all deterministic:

1. Global, per position j (positions past `max_positions` share the last model): a logistic
   regression of acceptance on the draft's top-1 probability t and entropy H at j,
       logit c = w0 * log t + w1 * (-log(1 - t)) + w2 * H + w3,
   the beta-calibration family (Kull et al. 2017) plus entropy. w = (1, 1, 0, 0) is the identity
   c = t, the prior for position 1; position j's prior is position j - 1's fit (a Gaussian prior
   of precision `ridge`). It is refit by warm-started Newton (IRLS) steps on *binned sufficient
   statistics* (per position, logit-t bin and entropy bin: the count, the accepts and the feature
   sums): first after `first_refit` counted observations, then each time they double until
   `refit_every`, then every `refit_every` or every quarter of the data seen, whichever is more.
   The statistics add up across replicas, so `merge` pools them exactly; an effective window
   caps each position's count so the model keeps adapting.
2. Per sequence, a Beta-Bernoulli posterior on how the sequence compares with the global model:
   with n counted observations, `acc` of them accepted, and g the mean global prediction for
   them, theta = (acc + k g) / (n + k) (k = `seq_strength`), applied as a log-odds shift
   logit(theta) - logit(g). A fresh sequence gets no shift; a large k lets a sequence's own rate
   take over only after tens of its positions (a noisy shift costs more than it corrects).
3. Position 1 only, a log-odds shift per *category of the sequence's last verified step*: its
   length (1, 2, 3, 4-7, 8+) and whether all of it was accepted, or none yet (`last_category`),
   Beta-Bernoulli like layer 2 over every sequence in that category (strength `cat_strength`).
   The token after a step follows the target's own token (its correction, or the bonus), and how
   likely the draft is to match it depends on that history more than the features show.

The regression changes only at a fit, and the rates and category shifts only at a refresh (every
`cat_refresh` counted observations), so a step's predictions never depend on the order of the
observations in between.

Observation rule (`observe`): position i (1-based) of a sequence with verified length d and
accepted count a is a conditional observation iff i <= d and i <= a + 1; it was accepted iff
i <= a. Positions after the first rejection were never tested given their prefix, so they say
nothing about c_i.

Calibration report (`ece`, `brier`): every verified position i <= d of every observed step is one
(predicted survival s_i = prod_{k<=i} c_k, realised survival 1[i <= a]) pair, predicted by the
model as it stood *before* that observation (prequential). ECE uses `ece_bins` equal-width bins
of predicted survival: sum_b (n_b / n) |mean predicted_b - mean realised_b|. Brier is the mean
squared difference. The same is kept for raw survival prod top1 (`raw=True`), the uncalibrated
baseline.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specdepth.adaptive.acceptance.config import (CAT, EPS, H_EDGES, IDENTITY, N_CATS, N_CELLS, N_FEAT, SEQ_COLS,
                                                  Z_EDGES, AcceptanceConfig, _logit, refit_interval)
from specdepth.adaptive.acceptance.state import AcceptanceState
from specdepth.adaptive.acceptance.kernels import (calibrate_kernel, fit_position_kernel, observe_step_kernel, prior_kernel,
                                                   seq_shift_kernel)

__all__ = ["CAT", "EPS", "H_EDGES", "IDENTITY", "N_CATS", "N_CELLS", "N_FEAT", "SEQ_COLS", "Z_EDGES",
           "AcceptanceConfig", "AcceptanceModel", "calibration_error"]


def calibration_error(pred: np.ndarray, outcome: np.ndarray, n_bins: int = 15) -> float:
    """ECE of probabilities `pred` against 0/1 `outcome`, equal-width bins (as `AcceptanceModel.ece`)."""
    pred, outcome = np.ravel(pred).astype(np.float64), np.ravel(outcome).astype(np.float64)
    b = np.minimum((pred * n_bins).astype(np.int64), n_bins - 1)
    n = np.bincount(b, minlength=n_bins)
    gap = np.abs(np.bincount(b, pred, n_bins) - np.bincount(b, outcome, n_bins))
    return float(gap.sum() / max(n.sum(), 1))


class AcceptanceModel(AcceptanceState):
    """Online calibrated confidences; see the module docstring for the model and its rules."""

    def __init__(self, config: AcceptanceConfig | None = None) -> None:
        self.config = cfg = config or AcceptanceConfig()
        P = cfg.max_positions
        self.cells = np.zeros((P, N_CELLS, 2 + N_FEAT))  # per cell: n, accepted, feature sums
        self.weights = np.tile(IDENTITY, (P, 1))  # (P, 4) current fit
        self.global_rates = np.full(P, cfg.prior_rate)  # (P,) conditional acceptance rates, as of the fit
        # planning rates per state (the last step's category) and position (see `prior_conf`)
        self.state_counts = np.zeros((N_CATS, P, 2))  # per state and position: n, accepted
        self.state_rates = np.full((N_CATS, P), cfg.prior_rate)  # (S, P) as of the last refresh
        self.state_n = np.zeros((N_CATS, P))  # (S, P) as of the last refresh
        self.cat_stats = np.zeros((N_CATS, 3))  # per last-step category, position 1: n, accepted, sum base conf
        self.cat_shift = np.zeros(N_CATS)  # (C,) position 1's log-odds shift per category, as of the last refresh
        self.since_cat = 0  # counted observations since that refresh
        self.since_fit = 0  # counted observations since the last fit
        # arrays computed from the rates, until their next refresh: ("logit", K) -> logit(plan_rates(K)),
        # ("base", K) -> base_rates(K)[0], and "refit" -> the observations the next fit waits for
        self._per_refresh: dict[Any, Any] = {}
        self._seq_row: dict[int, int] = {}  # sequence id -> row of seq_stats
        self.seq_stats = np.zeros((0, SEQ_COLS))  # (rows, SEQ_COLS)
        self._free_rows: list[int] = []
        self._shift_cache: dict[tuple, np.ndarray] = {}  # see `_seq_shift`; cleared when seq_stats change
        self.metrics = np.zeros((2, cfg.ece_bins, 3))  # [calibrated, raw] x bin x (n, sum pred, sum real)
        self.brier_sum = np.zeros(2)  # [calibrated, raw] sum of squared errors

    # ---- predictions ----------------------------------------------------------------------
    def _pos(self, J: int) -> np.ndarray:
        """(J,) regression index of columns 0..J-1 (position = column + 1)."""
        return np.minimum(np.arange(J), self.config.max_positions - 1)

    def _global_conf(self, top1: np.ndarray, entropy: np.ndarray) -> np.ndarray:
        """(B, J) global-model confidences, no per-sequence shift."""
        zero = np.zeros(len(top1))
        return calibrate_kernel(top1, entropy, self.weights, zero, zero, EPS)  # 0 where top1 is 0; weights as `calibrate`

    def rates(self, K: int) -> np.ndarray:
        """(K,) global conditional acceptance rate per position, as of the last fit."""
        return self.global_rates[self._pos(K)]

    def _rows(self, seq_ids: np.ndarray) -> np.ndarray:
        """(B,) rows of known sequences, -1 for unknown ones."""
        return np.array([self._seq_row.get(int(s), -1) for s in np.ravel(seq_ids)], dtype=np.int64)

    def _seq_shift(self, seq_ids: np.ndarray, pred_cols: tuple[int, int] | str) -> np.ndarray:
        """(B,) these sequences' Beta-Bernoulli log-odds shift (pred_cols (2, 3)) or their last-step
        category's shift at position 1 ("cat"), cached until the statistics behind them change (a
        step asks for the same batch's shifts at every draft pass and every causal verify call)."""
        ids = np.asarray(seq_ids)
        key = (pred_cols, ids.dtype.str, ids.tobytes())
        out = self._shift_cache.get(key)
        if out is None:
            if len(self._shift_cache) > 64:
                self._shift_cache.clear()
            # one compiled call makes both (`kernels_reference.seq_shift(self, rows, (2, 3))` and
            # `kernels_reference.cat_shift(self, rows)`): calibrate reads both
            both = seq_shift_kernel(self._rows(ids), self.seq_stats, self.cat_shift, self.config.seq_strength, EPS, CAT)
            self._shift_cache[((2, 3),) + key[1:]], self._shift_cache[("cat",) + key[1:]] = both
            out = self._shift_cache[key]
        return out

    def _refresh_cats(self) -> None:
        """Each category's Beta-Bernoulli shift from its statistics (module doc, layer 3)."""
        n, acc, base = self.cat_stats.T  # (C,) each
        g = base / np.maximum(n, EPS)
        k = self.config.cat_strength
        self.cat_shift = np.where(n > 0, _logit((acc + k * g) / (n + k)) - _logit(g), 0.0)
        self.since_cat = 0
        self._shift_cache.clear()

    def _refresh(self) -> None:
        """Every `cat_refresh` counted observations, and at a fit: the category shifts and the rates."""
        self._refresh_cats()
        self._refresh_states()

    def _refresh_states(self) -> None:
        """The global conditional rate of each position (Beta-smoothed counts, each position's
        prior being the previous position's rate) and the planning rates per state and position
        (`prior_conf`: Beta-smoothed counts, each pulled toward the position's global rate).
        Refreshed with the category shifts, not only at a fit, so a state the warm-up never
        visited is learned within tens of steps of a policy that visits it. The global rates move
        with them: state 0 plans with the global rate and the count behind every state's, which
        must describe the same data."""
        cfg = self.config
        k, rate, rates = cfg.rate_strength, cfg.prior_rate, []
        sn, sa = self.state_counts[..., 0], self.state_counts[..., 1]  # (S, P)
        # every counted observation is in one state: these are the cells' totals per position
        for n, acc in zip(sn.sum(0).tolist(), sa.sum(0).tolist()):
            rate = (acc + k * rate) / (n + k)
            rates.append(rate)
        self.global_rates[:] = rates
        self.state_rates = (sa + cfg.rate_strength * self.global_rates) / (sn + cfg.rate_strength)
        self.state_n = sn.copy()
        self._per_refresh.clear()

    def calibrate(self, seq_ids: np.ndarray, top1: np.ndarray, entropy: np.ndarray) -> np.ndarray:
        """Calibrated confidences.

        Args:
            seq_ids: (B,) request ids.
            top1: (B, J) the draft's top-1 probability at positions 1..J (column + 1); 0 marks
                padding past a sequence's drafted length.
            entropy: (B, J) the draft's entropy (nats) at those positions.
        Returns:
            (B, J) c_{r,j}; 0 where top1 is 0. Column j depends on column j's features and the
            sequence's history only (never on other columns): safe for causal verification.
        """
        top1, entropy = np.asarray(top1, np.float64), np.asarray(entropy, np.float64)
        shift = self._seq_shift(seq_ids, (2, 3))  # (B,)
        first = self._seq_shift(seq_ids, "cat")  # (B,) position 1 only
        # = np.where(top1 > 0, _sigmoid(kernels_reference.linear(top1, entropy, w) + shift[:, None]
        # (+ first at column 0)), 0.0),
        # w = self.weights[self._pos(J)] (the kernel reads column j's weights from row min(j, P - 1))
        return calibrate_kernel(top1, entropy, self.weights, shift, first, EPS)

    def prior_conf(self, seq_ids: np.ndarray, K: int) -> np.ndarray:
        """(B, K) history-based confidences before drafting.

        The base is the global per-position rate *given the sequence's last verified step*, its
        category (`kernels.last_category`: its length and whether all of it was accepted, or none
        yet): after a rejection the next token follows a correction the draft got wrong, and runs
        are shorter; a long full acceptance says more than a short one. The base is then shifted
        by the sequence's own history (Beta-Bernoulli, as `calibrate`).

        For planning, position 1's rate is optimistic by `optimism` standard errors,
        r + z sqrt(r (1 - r) / (n + rate_strength)): a rate learned from few observations is
        tried rather than trusted. Without it a pessimistic start is a trap: a policy that drafts
        nothing observes nothing, and the rate never gets the data that would correct it. Deeper
        positions need no bonus: once position 1 is drafted they are observed in turn.
        """
        base = self._per_refresh.get(("logit", K))  # the rates change only at a refresh: computed once per refresh
        if base is None:
            base = self._per_refresh["logit", K] = _logit(self.plan_rates(K))  # (S, K)
        # = _sigmoid(base[state] + kernels_reference.seq_shift(self, rows, (4, 5))[:, None]), state the
        # rows' CAT (0: unknown), in one compiled call
        return prior_kernel(self._rows(seq_ids), self.seq_stats, base, self.config.seq_strength, EPS, CAT)

    def base_rates(self, K: int) -> tuple[np.ndarray, np.ndarray]:
        """(S, K) planning rates per state, and the observations behind them, as of the last refresh.

        State 0 (no verified step yet, or none last step) is the population's rate, pooled over
        every state: a sequence there has no streak of its own to condition on, and a rate of its
        own is observed only when a policy drafts in state 0, so a low early estimate would stop
        the drafting that corrects it."""
        pos = self._pos(K)
        r, n = self.state_rates[:, pos].copy(), self.state_n[:, pos].copy()  # (S, K)
        r[0], n[0] = self.global_rates[pos], self.state_n[:, pos].sum(0)
        return r, n

    def plan_rates(self, K: int) -> np.ndarray:
        """(S, K) the per-state rates with their optimism bonus (see `prior_conf`), as of the last refresh."""
        r, n = self.base_rates(K)  # (S, K)
        r1, n1 = r[:, 0], n[:, 0]  # (S,) position 1: the door (see `prior_conf`)
        r[:, 0] = np.minimum(r1 + self.config.optimism * np.sqrt(r1 * (1 - r1) / (n1 + self.config.rate_strength)),
                             1 - 1e-4)
        return r

    # ---- learning -------------------------------------------------------------------------
    def observe(self, seq_ids: np.ndarray, top1: np.ndarray, entropy: np.ndarray,
                verified: np.ndarray, accepted: np.ndarray, conf: np.ndarray | None = None) -> None:
        """Learn from one step's outcome (see the module docstring's observation rule).

        Args:
            seq_ids: (B,) request ids.
            top1, entropy: (B, J) features of the drafted positions, as given to `calibrate`.
            verified: (B,) d_r, 0 <= d_r <= J.
            accepted: (B,) a_r, 0 <= a_r <= d_r.
            conf: optional (B, J) `calibrate(seq_ids, top1, entropy)` as it stands now (the caller
                already has it; saves computing it again for the calibration tally).
        Raises:
            ValueError: on inconsistent shapes or counts.
        """
        top1, entropy = np.asarray(top1, np.float64), np.asarray(entropy, np.float64)
        d, a = np.asarray(verified, np.int64), np.asarray(accepted, np.int64)
        B, J = top1.shape
        if entropy.shape != (B, J) or d.shape != (B,) or a.shape != (B,) or len(np.ravel(seq_ids)) != B:
            raise ValueError(f"observe: shapes top1 {top1.shape}, entropy {entropy.shape}, "
                             f"verified {d.shape}, accepted {a.shape}, seq_ids {np.shape(seq_ids)}")
        if (a < 0).any() or (a > d).any() or (d > J).any():
            raise ValueError("observe: need 0 <= accepted <= verified <= J")
        self._age_idle(seq_ids, d == 0)
        if not d.any():
            return  # nothing was verified: no observation, no calibration pair
        own = conf if conf is not None and np.shape(conf) == (B, J) else self.calibrate(seq_ids, top1, entropy)
        rows = np.array([self._row_for(int(s)) for s in np.ravel(seq_ids)], np.int64)  # may grow seq_stats
        g_rate = self._per_refresh.get(("base", J))
        if g_rate is None:
            g_rate = self._per_refresh["base", J] = self.base_rates(J)[0]  # (S, J) the planning baselines
        self._shift_cache.clear()
        # the global model's confidences, each row's planning baseline, then the calibration tally, the
        # sequences' histories, the per-state counts and the binned statistics, in one compiled call
        # (`observe_step_kernel`; the shifts are those `calibrate` reads, as the statistics stand now)
        counted = observe_step_kernel(top1, entropy, d, a, np.asarray(own, np.float64), self.weights, rows, g_rate,
                                      self.config.seq_strength, Z_EDGES, H_EDGES, EPS, self.metrics, self.brier_sum,
                                      self.seq_stats, self.state_counts, self.cells, self.cat_stats)
        self.since_fit += counted
        self.since_cat += counted
        if self.since_cat >= self.config.cat_refresh:
            self._refresh()
        refit = self._per_refresh.get("refit")
        if refit is None:
            refit = self._per_refresh["refit"] = refit_interval(self.config, self.state_n.sum(0).max(initial=0))
        if self.since_fit >= refit:
            self.fit()  # first_refit, then as the data doubles up to refit_every, then every quarter of it

    def _age_idle(self, seq_ids: np.ndarray, idle: np.ndarray) -> None:
        """Sequences that verified nothing this step: their own evidence ages (counts x idle_decay)
        and their last-step state resets. A sequence whose history made drafting look unprofitable
        would otherwise never draft again, so never get the evidence that its text has become easy
        (a trap at the sequence level; the global one is `prior_conf`'s optimism)."""
        if not idle.any():
            return
        rows = self._rows(np.ravel(seq_ids)[idle])
        rows = rows[rows >= 0]
        if len(rows):
            self._shift_cache.clear()
            self.seq_stats[rows, :CAT] *= self.config.idle_decay
            self.seq_stats[rows, CAT] = 0  # category (and planning state): none

    def _row_for(self, seq_id: int) -> int:
        row = self._seq_row.get(seq_id)
        if row is None:
            if self._free_rows:
                row = self._free_rows.pop()
            else:
                row = len(self.seq_stats)
                self.seq_stats = np.concatenate([self.seq_stats, np.zeros((max(8, row), SEQ_COLS))])
                self._free_rows = list(range(len(self.seq_stats) - 1, row, -1))
            self.seq_stats[row] = 0.0
            self._seq_row[seq_id] = row
        return row

    def forget(self, seq_ids: np.ndarray) -> None:
        """Drop finished sequences' histories (their contribution to the global fit stays)."""
        self._shift_cache.clear()
        for s in np.ravel(seq_ids):
            row = self._seq_row.pop(int(s), None)
            if row is not None:
                self._free_rows.append(row)

    def warm_up(self) -> None:
        """Compile (or load from numba's disk cache) the fit's kernel on a table without data, so
        that a process's first refit, tens of steps into a run, does not pay it (~6 s compiled,
        once per machine). The model is untouched."""
        fit_position_kernel(np.zeros((1, self.cells.shape[2])), IDENTITY, IDENTITY.copy(), float(self.config.ridge),
                            int(self.config.newton_steps), EPS)

    def fit(self) -> None:
        """Refit every position's regression from the binned statistics (Newton/IRLS)."""
        cfg = self.config
        n_pos = self.cells[:, :, 0].sum(1)  # (P,)
        over = n_pos > cfg.window
        self.cells[over] *= (cfg.window / n_pos[over])[:, None, None]  # effective window
        self.state_counts[:, over] *= (cfg.window / n_pos[over])[None, :, None]
        n_cat = self.cat_stats[:, 0]  # (C,)
        over_cat = n_cat > cfg.window
        self.cat_stats[over_cat] *= (cfg.window / n_cat[over_cat])[:, None]
        self._refresh()
        prior = IDENTITY
        for p in range(cfg.max_positions):
            if n_pos[p] > 0:  # without data the MAP is the prior itself (drafts deeper than any seen)
                prior = self._fit_position(self.cells[p], prior, self.weights[p])
            self.weights[p] = prior
        self.since_fit = 0

    def _fit_position(self, cells: np.ndarray, prior: np.ndarray, w: np.ndarray) -> np.ndarray:
        """MAP logistic regression on one position's binned statistics (weights (4,)); the numpy
        statements are `kernels_reference.fit_position`."""
        return fit_position_kernel(np.ascontiguousarray(cells), prior, w, float(self.config.ridge),
                                   int(self.config.newton_steps), EPS)

    # ---- calibration report ---------------------------------------------------------------
    def ece(self, raw: bool = False) -> float:
        """Expected calibration error of predicted vs realised survival (module docstring);
        `raw=True` for the uncalibrated prod top1. NaN before any observation."""
        m = self.metrics[int(raw)]
        total = m[:, 0].sum()
        return float(np.abs(m[:, 1] - m[:, 2]).sum() / total) if total else float("nan")

    def brier(self, raw: bool = False) -> float:
        """Mean squared error of predicted vs realised survival. NaN before any observation."""
        total = self.metrics[int(raw)][:, 0].sum()
        return float(self.brier_sum[int(raw)] / total) if total else float("nan")

    def reset_metrics(self) -> None:
        self.metrics[:] = 0.0
        self.brier_sum[:] = 0.0
