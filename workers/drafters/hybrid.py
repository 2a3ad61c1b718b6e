"""Hybrid drafting: each step, each sequence takes the model-free draft or the draft model's.

The model-free drafter (suffix by default) drafts every row first, to its cap: it costs
microseconds and is a function of the prefix. The controller's `choose_fn` then sees that draft's
confidence features (never its tokens' verdicts) and says which rows keep it; the draft model
drafts the others through the usual draft loop, asking `keep_fn` as it goes. A row that keeps
the free draft costs no draft pass, and where every row keeps it the step runs none.

Lossless: the choice is a function of the prefix (the free draft is), and each row's draft is
then one drafter's, with its own q (one-hot for the free draft, as the rejection sampler takes a
deterministic proposal). The draft model's cache catches up on a row's committed tokens at the
first pass after a spell without it (`ModelDrafter`).
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch

from specdepth.workers.drafters.base import Proposal
from specdepth.workers.drafters.model import ModelDrafter
from specdepth.workers.drafters.ngram import NgramDrafter
from specdepth.workers.drafters.suffix import SuffixDrafter
from specdepth.workers.drafting import Drafted, KeepFn

# choose_fn(top1 (B, J), entropy (B, J), drafted (B,)) -> (B,) bool: keep the model-free draft (however
# short, none included); False: draft with the model, to the row's budget
ChooseFn = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


FREE = {"ngram": NgramDrafter, "suffix": SuffixDrafter}  # the model-free drafters a hybrid may pair with


class HybridDrafter:
    name = "hybrid"
    model_free = False
    chooses = True  # the runner passes `choose_fn` and `caps` to `propose`

    def __init__(self, runner, free: str = "suffix", **free_options) -> None:
        """Args: runner: the `PairRunner`; free: the model-free drafter (ngram or suffix);
        free_options: its options.

        Raises:
            ValueError: `free` names no model-free drafter.
        """
        if free not in FREE:
            raise ValueError(f"hybrid: free drafter must be one of {sorted(FREE)}, got {free!r}")
        self.free = FREE[free](runner, **free_options)
        self.model = ModelDrafter(runner)
        self.runner = runner

    def add(self, slots: list[int], seqs: list[list[int]]) -> None:
        self.model.add(slots, seqs)
        self.free.add(slots, seqs)

    def commit(self, slot: int, n_committed: int) -> None:
        self.model.commit(slot, n_committed)
        self.free.commit(slot, n_committed)

    def remove(self, slot: int) -> None:
        self.model.remove(slot)
        self.free.remove(slot)

    def propose(self, seqs: dict[int, list[int]], slots: np.ndarray, budgets: np.ndarray,
                keep_fn: KeepFn | None, choose_fn: ChooseFn | None = None,
                caps: np.ndarray | None = None) -> Proposal:
        """The free draft to `caps` (default: the budgets) for every row, the choice, then the
        draft model for the rows that dropped it, to their `budgets`.
        Returns a proposal whose `free` (B,) bool marks the rows drafted model-free."""
        caps = budgets if caps is None else np.maximum(caps, 0)
        fp = self.free.propose(seqs, slots, caps, None)
        fd = fp.drafted
        t = time.perf_counter()
        take = fd.drafted > 0 if choose_fn is None else np.asarray(choose_fn(fd.top1, fd.entropy, fd.drafted), bool)
        choose_s = time.perf_counter() - t
        mp = self.model.propose(seqs, slots, np.where(take, 0, budgets), keep_fn)
        md = mp.drafted
        B = len(slots)
        J = max(fp.tokens.shape[1], mp.tokens.shape[1])
        tokens = torch.zeros((B, J), dtype=torch.long, device=mp.tokens.device)  # (B, J)
        tokens[:, :mp.tokens.shape[1]] = mp.tokens
        rows = torch.from_numpy(np.flatnonzero(take))
        tokens[rows, :fp.tokens.shape[1]] = fp.tokens[rows].to(tokens.device)
        top1, ent = np.zeros((B, max(J, 1))), np.zeros((B, max(J, 1)))  # (B, J)
        top1[:, :md.top1.shape[1]], ent[:, :md.entropy.shape[1]] = md.top1, md.entropy
        top1[take, :] = 0.0
        ent[take, :] = 0.0
        top1[take, :fd.top1.shape[1]], ent[take, :fd.entropy.shape[1]] = fd.top1[take], fd.entropy[take]
        qprobs = mp.qprobs
        if qprobs is not None:  # sampling: the free rows' q is one-hot on their tokens
            if qprobs.shape[1] < J:
                qprobs = torch.cat([qprobs, qprobs.new_zeros((B, J - qprobs.shape[1], qprobs.shape[2]))], 1)
            qprobs[rows] = torch.nn.functional.one_hot(tokens[rows], qprobs.shape[2]).to(qprobs.dtype)
        drafted = np.where(take, fd.drafted, md.drafted)
        dr = Drafted(drafted, top1[:, :J], ent[:, :J], md.passes, md.keep_s + choose_s, md.first_pass_s)
        return Proposal(tokens, qprobs, dr, free=take)
