"""The draft model as a drafter: sequential passes of a small transformer over its own KV cache.

Each pass runs the draft on one new token per row (the first pass catches up on everything
committed since the row last drafted) and gives the next position's distribution: its top-1
probability and entropy are the confidence features; greedy drafting takes its argmax, sampling
draws from it and keeps it as q.
"""

from __future__ import annotations

import numpy as np
import torch

from specdepth.workers.drafters.base import Proposal
from specdepth.workers.drafting import KeepFn, draft_loop
from specdepth.workers.row_sampling import keyed_choice, tempered
from specdepth.workers.sampler import confidence_features, probs_from_logits, sample


class ModelDrafter:
    name = "model"
    model_free = False

    def __init__(self, runner) -> None:
        """Drafts with `runner.draft` through `runner.draft_pass` on `runner.dcache`, sampling
        with the runner's parameters and generator (one seeded stream for the whole step)."""
        self.runner = runner
        self.dcache = runner.dcache

    def add(self, slots: list[int], seqs: list[list[int]]) -> None:
        for slot in slots:
            assert slot == self.dcache.allocate(), "draft and target caches allocate in lockstep"
        todo = [(s, t[:-1]) for s, t in zip(slots, seqs) if len(t) > 1]
        if not todo:
            return
        dev = self.runner.device
        T = max(len(t) for _, t in todo)
        x = torch.zeros((len(todo), T), dtype=torch.long)  # (b, T) all but each last token, padded
        for i, (_, t) in enumerate(todo):
            x[i, : len(t)] = torch.tensor(t)
        sl = torch.tensor([s for s, _ in todo], device=dev)
        n = torch.tensor([len(t) for _, t in todo], device=dev)
        with torch.inference_mode():
            self.runner.draft(self.dcache, sl, x.to(dev), n, logits=False)

    def commit(self, slot: int, n_committed: int) -> None:
        # the cache holds at most n - 1 positions: the last committed token is fed next step
        self.dcache.truncate(slot, min(self.dcache.lengths[slot], n_committed - 1))

    def remove(self, slot: int) -> None:
        self.dcache.release(slot)

    def propose(self, seqs: dict[int, list[int]], slots: np.ndarray, budgets: np.ndarray,
                keep_fn: KeepFn | None) -> Proposal:
        """Sequential draft passes (`draft_loop`) for the rows with a budget."""
        r = self.runner
        B, K = len(slots), int(budgets.max(initial=0))
        tokens = torch.zeros((B, max(K, 1)), dtype=torch.long, device=r.device)  # (B, J)
        rp = r.step_rows  # each row's own sampling, where any has its own (workers/row_sampling.py)
        greedy = r.sampling.greedy if rp is None else rp.all_greedy
        qprobs = None if greedy else torch.zeros((B, max(K, 1), r.vocab_size), device=r.device)

        def draft_pass(j: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            if j == 0:  # catch up: everything committed that the draft cache lacks
                pend = [seqs[slots[i]][self.dcache.lengths[slots[i]]:] for i in rows]
                T = max(len(p) for p in pend)
                inp = torch.tensor([p + [0] * (T - len(p)) for p in pend], device=r.device)  # (b, T)
                n_new = torch.tensor([len(p) for p in pend], device=r.device)
            else:  # one new token per row: the one drafted last
                rows_t = torch.from_numpy(rows).to(r.device)
                inp = tokens[rows_t, j - 1][:, None]  # (b, 1)
                n_new = torch.ones(len(rows), dtype=torch.long, device=r.device)
            # (b, V): x_{j+1}'s distribution, the LM head run on each row's last token only
            last = r.draft_pass(self.dcache, torch.from_numpy(slots[rows]).to(r.device), inp, n_new, last=True)
            last = last[:, :r.shared_vocab]  # (b, V_shared)
            ok = np.ones(len(rows), bool)
            if not bool(torch.isfinite(last.sum())) and not bool(torch.isfinite(last).all()):  # see `_check_finite`
                bad = r._check_finite(last[:, None], np.ones(len(rows), np.int64), "draft")
                ok[list(bad)] = False  # a draft that cannot be trusted drafts nothing more; verification stays exact
                last = torch.nan_to_num(last)
            p1, h, top = confidence_features(last, with_argmax=True)
            if greedy:
                tokens[rows, j] = top  # the argmax: greedy drafting needs no probabilities
            elif rp is not None:
                tokens[rows, j] = self._per_row(last, top, rp.rows(rows), qprobs, rows, j, seqs, slots)
            else:
                q = probs_from_logits(last, r.sampling)  # (b, V_shared)
                tokens[rows, j] = sample(q, r.gen)
                qprobs[rows, j, :r.shared_vocab] = q  # 0 on target ids the draft lacks
            return p1.cpu().numpy(), h.cpu().numpy(), ok

        return Proposal(tokens, qprobs, draft_loop(budgets, draft_pass, keep_fn))

    def _per_row(self, last: torch.Tensor, top: torch.Tensor, rp, qprobs: torch.Tensor, rows: np.ndarray,
                 j: int, seqs: dict[int, list[int]], slots: np.ndarray) -> torch.Tensor:
        """(b,) draft tokens at position j for rows at their own settings: greedy rows the argmax,
        seeded rows the Gumbel-max token on their keyed noise (both one-hot q), the others drawn
        from q at their settings (q kept for the rejection sampler)."""
        r = self.runner
        q = tempered(last, rp)  # (b, V_shared)
        tok = top.clone()
        drawn = np.flatnonzero(rp.drawn)
        if drawn.size:
            tok[drawn] = sample(q[drawn], r.gen)
        for i in np.flatnonzero(rp.keyed).tolist():
            tok[i] = keyed_choice(q[i:i + 1], rp.seeds[i], len(seqs[int(slots[rows[i]])]) + j)[0]
        qprobs[rows, j, :r.shared_vocab] = q
        fixed = np.flatnonzero(~rp.drawn)
        if fixed.size:  # greedy and seeded rows: a deterministic proposal, q one-hot
            qprobs[rows[fixed], j] = torch.nn.functional.one_hot(tok[fixed], qprobs.shape[-1]).to(qprobs.dtype)
        return tok
