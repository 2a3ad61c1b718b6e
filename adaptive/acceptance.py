"""Acceptance learning: calibrated confidences c_{r,j} from features known before draft token j.

c_{r,j} = P(position j of sequence r is accepted | positions < j were), DESIGN.md's confidence.
Two layers, both pure numpy and deterministic:

1. Global, per position j (positions past `max_positions` share the last model): a logistic
   regression of acceptance on the draft's top-1 probability t and entropy H at j,
       logit c = w0 * log t + w1 * (-log(1 - t)) + w2 * H + w3,
   the beta-calibration family (Kull et al. 2017) plus entropy. w = (1, 1, 0, 0) is the
   identity c = t, the prior for position 1; position j's prior is position j - 1's fit (a
   Gaussian prior of precision `ridge`). It is refit every `refit_every` counted observations
   (later, once a quarter of the data behind the fit has arrived: a fit costs milliseconds) by
   warm-started Newton (IRLS) steps on *binned sufficient statistics*: per (position, logit-t bin,
   entropy bin) the count, the accepts and the feature sums. These add up across replicas, so
   `merge` pools them exactly, and they take fixed memory; an effective window caps each
   position's count (older statistics are scaled down) so the model keeps adapting. The
   global conditional acceptance rate of each position (Beta-smoothed counts, each position's
   prior being the previous one's) and the rates per planning state, which `prior_conf` uses
   before drafting, are refreshed with layer 3 (`_refresh_states`). The regression changes only
   at a fit and the rates only at a refresh, so a step's predictions never depend on the order
   of observations in between.
2. Per sequence, a Beta-Bernoulli posterior on how the sequence compares with the global model:
   with n counted observations, `acc` of them accepted, and g the mean global prediction for
   them, theta = (acc + k g) / (n + k) (prior Beta(k g, k (1 - g)), k = `seq_strength`), applied
   as a log-odds shift logit(theta) - logit(g). A fresh sequence gets no shift. k = 64: a
   sequence's own rate takes over only after tens of its positions. Replaying one live run's
   observations (bundled pair, dspark at batch 1, 4, 16 after warm-up), k = 8 gave log-loss
   0.502 / 0.532 / 0.474 and survival ECE 0.044; k = 64 gave 0.491 / 0.524 / 0.469 and 0.032
   (a noisy shift per sequence costs more than it corrects); the replay benchmarks moved < 1%.
3. Position 1 only, a log-odds shift per *category of the sequence's last verified step*: its
   length (1, 2, 3, 4-7, 8+) and whether all of it was accepted, or none yet (`last_category`);
   Beta-Bernoulli like layer 2, over every sequence in that category, against the prediction of
   layers 1-2 (strength `cat_strength`). The next token after a step follows the target's own
   token (its correction, or the bonus after a full acceptance), and how likely the draft is to
   match it depends on that history more than the features show: replaying two recorded live runs
   of dspark (batch 1-16, and 64), position 1 after a fully accepted step of 1 was accepted 0.74
   of the time against 0.69 predicted, a sequence's first step 0.33-0.63 against 0.73-0.82, and
   survival ECE went 0.032 -> 0.027 and 0.037 -> 0.031 with this layer (k = 64). Like layer 1 it
   changes only at a refresh, every `cat_refresh` counted observations (it is 11 numbers; on the
   recordings a refresh every 64 did as well as one every observation, every 256 a little worse),
   so a step's predictions do not depend on the order of observations in between. Categories keep
   the lengths apart because a full acceptance of 8 (the warm-up's) says more than one of 1 (an
   earlier shift per 3-way state, learned mostly from the warm-up's steps of 8, misjudged dspark's
   short ones: log-loss 0.521 vs 0.491 at batch 1). Deeper positions follow a drafted prefix the
   features already describe, and shifting them too did worse on one of the two recordings.

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

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from specdepth.adaptive.kernels import calibrate_kernel, observe_kernel, prior_kernel, seq_shift_kernel

EPS = 1e-6
IDENTITY = np.array([1.0, 1.0, 0.0, 0.0])  # logit c = log t - log(1 - t) = logit t
Z_EDGES = np.linspace(-6.0, 6.0, 25)  # logit(top1) bin edges: 26 bins, 0.5 wide inside
H_EDGES = np.array([0.05, 0.2, 0.5, 1.0, 2.0, 4.0])  # entropy (nats) bin edges: 7 bins
N_CELLS = (len(Z_EDGES) + 1) * (len(H_EDGES) + 1)
N_FEAT = 3  # log t, -log(1 - t), H
SEQ_COLS = 7  # accepted, rejected, sum c_global, sum (1 - c_global), sum g, sum (1 - g), category
CAT = 6  # the seq_stats column holding the last step's category (`kernels.last_category`; 0 none)
N_CATS = 11  # categories: also the planning states of `prior_conf`


@dataclass(frozen=True)
class AcceptanceConfig:
    max_positions: int = 16  # positions with their own regression; deeper ones share the last
    refit_every: int = 256  # counted observations between refits
    newton_steps: int = 8  # Newton iterations per refit at most (warm-started; stops when settled)
    ridge: float = 1.0  # precision of the Gaussian prior on each position's weights
    window: float = 50_000.0  # effective observations kept per position (older ones scaled down)
    seq_strength: float = 64.0  # k: pseudo-observations of the global model in a sequence's posterior
    cat_strength: float = 64.0  # the same, for the shift per last-step category at position 1
    cat_refresh: int = 64  # counted observations between refreshes of those shifts
    rate_strength: float = 4.0  # pseudo-observations pulling position j's global rate to j - 1's
    prior_rate: float = 0.5  # the global rate before any observation
    optimism: float = 1.0  # z: planning rates get + z * their standard error (see `prior_conf`)
    idle_decay: float = 0.8  # a sequence's own counts age by this factor per step it verifies nothing
    ece_bins: int = 15  # equal-width bins of predicted survival

    def __post_init__(self) -> None:
        if min(self.max_positions, self.refit_every, self.cat_refresh, self.newton_steps, self.ece_bins) < 1:
            raise ValueError(f"counts must be >= 1: {self}")
        if min(self.ridge, self.window, self.seq_strength, self.cat_strength, self.rate_strength) <= 0 \
                or self.optimism < 0:
            raise ValueError(f"strengths and window must be positive: {self}")
        if not 0 < self.idle_decay <= 1:
            raise ValueError(f"idle_decay must be in (0, 1]: {self}")
        if not 0 < self.prior_rate < 1:
            raise ValueError(f"prior_rate must be in (0, 1): {self}")


def _clip(x: np.ndarray | float, lo: float, hi: float) -> np.ndarray:
    return np.minimum(np.maximum(x, lo), hi)  # np.clip, without its Python-level overhead


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-_clip(x, -30.0, 30.0)))


def _logit(p: np.ndarray | float) -> np.ndarray:
    p = _clip(p, 1e-4, 1 - 1e-4)
    return np.log(p) - np.log1p(-p)


def _linear(top1: np.ndarray, entropy: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(B, J) w0 log t + w1 (-log(1 - t)) + w2 H + w3 with per-column weights w (J, 4): the
    regression's logit on the features [log t, -log(1 - t), H]."""
    t = _clip(top1, EPS, 1 - EPS)
    return w[:, 0] * np.log(t) - w[:, 1] * np.log1p(-t) + w[:, 2] * np.maximum(entropy, 0.0) + w[:, 3]


def calibration_error(pred: np.ndarray, outcome: np.ndarray, n_bins: int = 15) -> float:
    """ECE of probabilities `pred` against 0/1 `outcome`, equal-width bins (as `AcceptanceModel.ece`)."""
    pred, outcome = np.ravel(pred).astype(np.float64), np.ravel(outcome).astype(np.float64)
    b = np.minimum((pred * n_bins).astype(np.int64), n_bins - 1)
    n = np.bincount(b, minlength=n_bins)
    gap = np.abs(np.bincount(b, pred, n_bins) - np.bincount(b, outcome, n_bins))
    return float(gap.sum() / max(n.sum(), 1))


class AcceptanceModel:
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
        """`_shift` of these sequences (`_cat_shift` for pred_cols "cat"), cached until the
        statistics behind it change (a step asks for the same batch's shift at every draft pass and
        every causal verify call)."""
        ids = np.asarray(seq_ids)
        key = (pred_cols, ids.dtype.str, ids.tobytes())
        out = self._shift_cache.get(key)
        if out is None:
            if len(self._shift_cache) > 64:
                self._shift_cache.clear()
            rows = self._rows(ids)
            if pred_cols in ((2, 3), "cat"):  # calibrate reads both: one compiled call makes both
                # = self._shift(rows, (2, 3)), self._cat_shift(rows)
                both = seq_shift_kernel(rows, self.seq_stats, self.cat_shift, self.config.seq_strength, EPS, CAT)
                self._shift_cache[((2, 3),) + key[1:]], self._shift_cache[("cat",) + key[1:]] = both
                out = self._shift_cache[key]
            else:
                out = self._shift_cache[key] = self._shift(rows, pred_cols)
        return out

    def _cat_shift(self, rows: np.ndarray) -> np.ndarray:
        """(B,) position 1's log-odds shift for each sequence's last-step category (module doc,
        layer 3); unknown sequences are category 0, no step yet."""
        cat = np.zeros(len(rows), np.int64)  # (B,)
        known = rows >= 0
        cat[known] = self.seq_stats[rows[known], CAT]
        return self.cat_shift[cat]

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
        Refreshed with the category shifts (every `cat_refresh` counted observations), and so
        also at a fit: a state the warm-up never visited (its steps were all 8 deep) is learned
        within tens of steps of a policy that visits it, not thousands of observations later at
        the next fit. The global rates move with them: state 0 plans with the global rate and
        the count behind every state's, which must describe the same data (with the count
        refreshed and the rate still the prior's 0.5 until the first fit, a replay at
        concurrency 1 stopped drafting for good after 64 observations)."""
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

    def _shift(self, rows: np.ndarray, pred_cols: tuple[int, int]) -> np.ndarray:
        """(B,) log-odds shift from each sequence's Beta-Bernoulli posterior (0 when unknown)."""
        out = np.zeros(len(rows))
        known = rows >= 0
        if not known.any():
            return out
        st = self.seq_stats[rows[known]]  # (b, SEQ_COLS)
        n = st[:, 0] + st[:, 1]
        g = st[:, pred_cols[0]] / np.maximum(st[:, pred_cols[0]] + st[:, pred_cols[1]], EPS)
        k = self.config.seq_strength
        theta = (st[:, 0] + k * g) / (n + k)
        out[known] = np.where(n > 0, _logit(theta) - _logit(g), 0.0)
        return out

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
        # = np.where(top1 > 0, _sigmoid(_linear(top1, entropy, w) + shift[:, None] (+ first at column 0)), 0.0),
        # w = self.weights[self._pos(J)] (the kernel reads column j's weights from row min(j, P - 1))
        return calibrate_kernel(top1, entropy, self.weights, shift, first, EPS)

    def prior_conf(self, seq_ids: np.ndarray, K: int) -> np.ndarray:
        """(B, K) history-based confidences before drafting.

        The base is the global per-position rate *given the sequence's last verified step*, its
        category (`kernels.last_category`: its length, 1, 2, 3, 4-7 or 8+, and whether all of it
        was accepted; or none yet). After a rejection the next token follows a correction the
        draft got wrong, and runs are much shorter: on the bundled pair position 1 is accepted
        0.87 of the time after a fully accepted step of 8 and 0.68 after a rejection. The length
        matters as much: three states (all accepted, a rejection, none), learned mostly from the
        warm-up's steps of 8, planned position 1 at 0.85 after any full acceptance, where after
        one of 1 or 3 it was accepted 0.76 of the time (static k = 1 and 3 at batch 4, live), and
        dspark's plan drafted 3 deep at batch 4, where 1 deep ran 6% faster. The rates per state
        are refreshed every `cat_refresh` counted observations (`_refresh_states`). The base is
        then shifted by the sequence's own history (Beta-Bernoulli, as `calibrate`).

        For planning, position 1's rate is optimistic by `optimism` standard errors,
        r + z sqrt(r (1 - r) / (n + rate_strength)): a rate learned from few observations is
        tried rather than trusted. Without it a pessimistic start is a trap: a policy that drafts
        nothing observes nothing, and the rate never gets the data that would correct it. Deeper
        positions need no bonus: once position 1 is drafted they are observed in turn, and until
        then each inherits the rate of the one before. With a few thousand observations the bonus
        is below 0.01.
        """
        base = self._per_refresh.get(("logit", K))  # the rates change only at a refresh: computed once per refresh
        if base is None:
            base = self._per_refresh["logit", K] = _logit(self.plan_rates(K))  # (S, K)
        # = _sigmoid(base[state] + self._shift(rows, (4, 5))[:, None]), state the rows' CAT (0: unknown),
        # compiled: one call in place of ~15 array calls, which cost ~55 us a step after a forward
        return prior_kernel(self._rows(seq_ids), self.seq_stats, base, self.config.seq_strength, EPS, CAT)

    def base_rates(self, K: int) -> tuple[np.ndarray, np.ndarray]:
        """(S, K) planning rates per state, and the observations behind them, as of the last refresh.

        State 0 (no verified step yet, or none last step) is the population's rate, pooled over
        every state: a sequence there has no streak of its own to condition on. Its own learned
        rate was a trap: it is observed only when a policy drafts in state 0, so a low early
        estimate stopped the drafting that would have corrected it (on a replay at concurrency 1
        from a fresh model, dspark never drafted again: 24,854 of 25,205 steps)."""
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
        g_conf = self._global_conf(top1, entropy)  # (B, J)
        zero = np.zeros(B)
        first_base = calibrate_kernel(top1[:, :1], entropy[:, :1], self.weights[:1], self._seq_shift(seq_ids, (2, 3)),
                                      zero, EPS)[:, 0]  # (B,) position 1 without its category shift
        rows = np.array([self._row_for(int(s)) for s in np.ravel(seq_ids)], np.int64)  # may grow seq_stats
        state = self.seq_stats[rows, CAT].astype(np.int64)  # (B,) before this step
        g_rate = self._per_refresh.get(("base", J))
        if g_rate is None:
            g_rate = self._per_refresh["base", J] = self.base_rates(J)[0]  # (S, J)
        g_rate = g_rate[state]  # (B, J) the planning baseline
        self._shift_cache.clear()
        # the calibration tally, the sequences' histories, the per-state counts and the binned
        # statistics, in one compiled loop over the verified positions (`observe_kernel`)
        counted = observe_kernel(top1, entropy, d, a, np.asarray(own, np.float64), g_conf, g_rate, first_base,
                                 rows, self._pos(J), Z_EDGES, H_EDGES, EPS, self.metrics, self.brier_sum,
                                 self.seq_stats, self.state_counts, self.cells, self.cat_stats)
        self.since_fit += counted
        self.since_cat += counted
        if self.since_cat >= self.config.cat_refresh:
            self._refresh()
        refit = self._per_refresh.get("refit")
        if refit is None:
            refit = self._per_refresh["refit"] = max(self.config.refit_every, self.state_n.sum(0).max(initial=0) / 4)
        if self.since_fit >= refit:
            self.fit()  # every refit_every observations at first, then every quarter of the data seen

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
            self.weights[p] = prior = self._fit_position(self.cells[p], prior, self.weights[p])
        self.since_fit = 0

    def _fit_position(self, cells: np.ndarray, prior: np.ndarray, w: np.ndarray) -> np.ndarray:
        """MAP logistic regression on one position's binned statistics (weights (4,))."""
        used = cells[:, 0] > 0
        n, acc = cells[used, 0], cells[used, 1]  # (m,)
        x = np.concatenate([cells[used, 2:] / n[:, None], np.ones((len(n), 1))], axis=1)  # (m, 4)
        lam = self.config.ridge
        w = w.copy()
        for _ in range(self.config.newton_steps):
            p = _sigmoid(x @ w)
            grad = x.T @ (acc - n * p) - lam * (w - prior)
            hess = (x.T * (n * p * (1 - p))) @ x + lam * np.eye(4)
            step = np.linalg.solve(hess, grad)
            step *= min(1.0, 4.0 / max(np.abs(step).max(), EPS))  # damp wild first steps
            w += step
            if np.abs(step).max() < 1e-7:
                break
        return w

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

    # ---- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain numpy/Python state: sufficient statistics, fit, sequence histories, metrics."""
        ids = np.array(sorted(self._seq_row), dtype=np.int64)
        return {"config": asdict(self.config), "cells": self.cells.copy(), "weights": self.weights.copy(),
                "global_rates": self.global_rates.copy(),
                "state_counts": self.state_counts.copy(), "state_rates": self.state_rates.copy(),
                "state_n": self.state_n.copy(), "cat_stats": self.cat_stats.copy(),
                "cat_shift": self.cat_shift.copy(), "since_cat": self.since_cat,
                "since_fit": self.since_fit, "seq_ids": ids,
                "seq_stats": self.seq_stats[[self._seq_row[int(s)] for s in ids]].reshape(-1, SEQ_COLS),
                "metrics": self.metrics.copy(), "brier_sum": self.brier_sum.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.__init__(AcceptanceConfig(**state["config"]))
        self._check(state)
        self.cells[:] = state["cells"]
        self.weights[:] = state["weights"]
        self.global_rates[:] = state["global_rates"]
        if "state_counts" in state and np.shape(state["state_counts"]) == self.state_counts.shape:
            self.state_counts[:] = state["state_counts"]
            self.state_rates[:] = state["state_rates"]
            self.state_n[:] = state["state_n"]
        else:  # from before the planning states were the categories: its counts go to state 0
            self._pool_counts(state)
        if "cat_stats" in state:
            self.cat_stats[:] = state["cat_stats"]
        if "cat_shift" in state:
            self.cat_shift = np.array(state["cat_shift"], np.float64).reshape(N_CATS)
            self.since_cat = int(state.get("since_cat", 0))
        self.since_fit = int(state["since_fit"])
        self._per_refresh.clear()
        self._add_seqs(state)
        self.metrics[:] = state["metrics"]
        self.brier_sum[:] = state["brier_sum"]

    def merge(self, other: dict[str, Any]) -> None:
        """Pool another replica's `state_dict` into this one, then refit.

        Binned statistics, sequence histories and calibration tallies add up, so merging the
        states of replicas equals one model fed all their observations (exactly, as long as
        neither refit nor refreshed its category shifts in between: a sequence's predicted sums
        use the model of its time).
        Raises:
            ValueError: the other state has a different binning or number of positions.
        """
        self._check(other)
        self.cells += other["cells"]
        if "state_counts" in other and np.shape(other["state_counts"]) == self.state_counts.shape:
            self.state_counts += other["state_counts"]
        else:
            self._pool_counts(other)
        if "cat_stats" in other:
            self.cat_stats += other["cat_stats"]
        self._add_seqs(other)
        self.metrics += other["metrics"]
        self.brier_sum += other["brier_sum"]
        self.fit()

    def _pool_counts(self, state: dict[str, Any]) -> None:
        """Add a state's per-position counts (its cells' totals) to planning state 0, for a state
        without per-category counts: the global rates are the states' totals (`_refresh_states`)."""
        cells = np.asarray(state["cells"])
        self.state_counts[0, :, 0] += cells[:, :, 0].sum(1)
        self.state_counts[0, :, 1] += cells[:, :, 1].sum(1)

    def _check(self, state: dict[str, Any]) -> None:
        if np.shape(state["cells"]) != self.cells.shape or np.shape(state["metrics"]) != self.metrics.shape:
            raise ValueError(f"acceptance state shapes {np.shape(state['cells'])}/{np.shape(state['metrics'])} "
                             f"do not match this model's {self.cells.shape}/{self.metrics.shape}")

    def _add_seqs(self, state: dict[str, Any]) -> None:
        self._shift_cache.clear()
        for s, st in zip(np.asarray(state["seq_ids"]).tolist(), np.asarray(state["seq_stats"])):
            row = self._row_for(int(s))
            self.seq_stats[row, :CAT] += st[:CAT]
            self.seq_stats[row, CAT] = st[CAT]  # the latest category, not a sum
