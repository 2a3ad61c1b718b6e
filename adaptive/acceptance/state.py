"""Saving, loading and pooling an `AcceptanceModel`'s state: how replicas share what they learn.

The binned statistics, sequence histories and calibration tallies add up, so `merge` pools
replicas exactly (see its docstring for the one exception).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np

from specdepth.adaptive.acceptance.config import CAT, N_CATS, SEQ_COLS, AcceptanceConfig

FIT_KEYS = ("weights", "global_rates", "cat_shift")  # the fit a pooled model hands to replicas


class AcceptanceState:
    """`AcceptanceModel`'s state as plain numpy/Python data (`state_dict`), and back. The host
    provides the statistics' arrays, `fit`, `_row_for` and the caches these methods clear."""

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

    def fit_state(self) -> dict[str, np.ndarray]:
        """The fit alone (`FIT_KEYS`): what replicas take from the pooled model."""
        return {k: np.array(getattr(self, k), np.float64) for k in FIT_KEYS}

    def load_fit(self, fit: dict[str, Any]) -> None:
        """Take another model's fit (`fit_state`); this model's counts and histories stay."""
        self.weights[:] = fit["weights"]
        self.global_rates[:] = fit["global_rates"]
        self.cat_shift = np.array(fit["cat_shift"], np.float64).reshape(N_CATS)
        self._per_refresh.clear()
        self._shift_cache.clear()

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
