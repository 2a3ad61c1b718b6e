"""PairRunner: a drafter and a target model over many sequences, one speculative step at a time.

The runner owns the two KV caches and each sequence's committed tokens; a drafter
(`workers/drafters/`: the draft model, n-gram lookup, suffix, or a per-sequence hybrid) proposes the draft tokens. Cache
invariant: for a sequence of n committed tokens, the target's slot holds n - 1 positions (the
last committed token is fed at the start of the next step), and the draft model's slot holds at
most n - 1 (it catches up on whatever it lacks in its first pass of the next draft). `step` is
the whole speculative step: draft, verify in one ragged target pass, rejection-sample, roll
back; the depth decisions come in as callbacks so that no policy logic lives here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from specdepth.workers import linear
from specdepth.workers.compiled import compile_pair
from specdepth.workers.drafters.base import Drafter
from specdepth.workers.drafters.hybrid import ChooseFn
from specdepth.workers.drafters.registry import make_drafter
from specdepth.workers.drafting import KeepFn
from specdepth.workers.kv_cache import KVCache
from specdepth.workers.model import Transformer
from specdepth.workers.padding import free_verify
from specdepth.workers.row_sampling import RowParams, target_probs
from specdepth.workers.sampler import SamplingParams, greedy_verify, probs_from_logits, rejection_sample

# verify_fn(top1 (B, J), entropy (B, J), drafted (B,)) -> (B,) verify lengths d_r <= drafted_r
VerifyFn = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


class NonFiniteLogits(ValueError):
    """A model produced NaN or inf logits for a sequence."""


@dataclass
class StepResult:
    slots: np.ndarray  # (B,) int64
    drafted: np.ndarray  # (B,) int64: tokens drafted per sequence
    verified: np.ndarray  # (B,) int64: d_r
    accepted: np.ndarray  # (B,) int64: a_r
    emitted: list[list[int]]  # B lists of a_r + 1 tokens (empty for a failed sequence)
    top1: np.ndarray  # (B, J) float: draft top-1 probability per drafted position, 0 past drafted
    entropy: np.ndarray  # (B, J) float
    draft_s: float  # wall time of all draft passes (the keep_fn callbacks excluded)
    target_s: float  # wall time of the target's forward (synchronised); building its input, the verdict
    # and the commit are the step's overhead, as the profile times forwards alone (adaptive/cost/profiler.py)
    draft_passes: int
    step_tokens: int  # N = sum_r (d_r + 1)
    context_tokens: int  # sum of committed lengths before the step
    failed: dict[int, Exception] = field(default_factory=dict)  # row -> error (that sequence only)
    policy_s: float = 0.0  # wall time inside keep_fn and verify_fn (the controller's decisions)
    keep_s: float = 0.0  # of which inside keep_fn
    first_pass_s: float = 0.0  # wall time of the first draft pass (the catch-up), features included
    free: np.ndarray | None = None  # (B,) bool: rows drafted model-free (a hybrid drafter); None: one drafter
    sample_s: float = 0.0  # wall time of the verdict: sampling, the acceptance rule, tokens to the host
    commit_s: float = 0.0  # wall time of the commit: tokens appended, KV caches truncated, drafter told


class PairRunner:
    def __init__(self, target: Transformer, draft: Transformer, n_slots: int, max_depth: int,
                 sampling: SamplingParams = SamplingParams(), seed: int = 0,
                 max_len: int | None = None, compile: str = "off",
                 buckets: tuple[tuple[int, ...], tuple[int, ...]] | None = None, progress: bool = False,
                 drafter: str | Drafter = "model", drafter_options: dict | None = None) -> None:
        """Args beyond the obvious: compile: the passes' path, auto|on|off (`workers/compiled.py`);
        buckets: (batch sizes, tokens per sequence) to compile instead of the defaults;
        progress: a progress bar on stderr while compiling; drafter: what proposes the draft
        tokens, a name in `workers.drafters.registry` (model, ngram) or a `Drafter`;
        drafter_options: keyword arguments for a named drafter (ngram: ngram_min, ngram_max)."""
        self.target, self.draft = target, draft
        # the ids both models have rows for: padded checkpoints of one tokenizer differ past them
        # (workers/hf_loader.py checks the tokenizers); the draft proposes only these
        self.shared_vocab = min(target.cfg.vocab_size, draft.cfg.vocab_size)
        self.device = target.device
        self.max_depth = max_depth
        self.max_len = min(max_len or target.cfg.max_seq_len, target.cfg.max_seq_len, draft.cfg.max_seq_len)
        dt = target.embed.weight.dtype
        self.tcache = KVCache(target.cfg.n_layers, n_slots, target.cfg.n_kv_heads, target.cfg.hd,
                              self.max_len + max_depth + 1, dt, self.device)
        self.dcache = KVCache(draft.cfg.n_layers, n_slots, draft.cfg.n_kv_heads, draft.cfg.hd,
                              self.max_len + max_depth + 1, draft.embed.weight.dtype, self.device)
        self.sampling = sampling  # every row's, unless a sequence brought its own (`add_many`)
        self.params: dict[int, SamplingParams] = {}  # slot -> a sequence's own sampling settings
        self.step_rows: RowParams | None = None  # this step's rows' settings, where any has its own
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self.seqs: dict[int, list[int]] = {}  # slot -> committed tokens (prompt + generated)
        # the step's passes: the models themselves, or their compiled forwards (same call, same results)
        self.target_pass, self.draft_pass, self.compile_summary = compile_pair(
            target, draft, self.tcache, self.dcache, compile, max_depth, progress, buckets)
        self.drafter: Drafter = make_drafter(drafter, self, **(drafter_options or {})) \
            if isinstance(drafter, str) else drafter

    def warm_up(self) -> None:
        """Build the few-row linear kernels of both models at every token count a pass may bring
        (`linear.warm_up`), before anything is timed or served."""
        linear.warm_up(self.target, self.draft)

    @property
    def vocab_size(self) -> int:
        return self.target.cfg.vocab_size

    @property
    def n_slots(self) -> int:
        return self.tcache.n_slots

    # ---- sequences --------------------------------------------------------------------------
    def add(self, tokens: list[int], key: object = None, sampling: SamplingParams | None = None) -> int:
        """Claim a slot for a sequence and prefill all but its last token. Returns the slot.
        (`key`, how a step loop may name the request, is not needed here.)"""
        return self.add_many([tokens], [sampling])[0]

    def add_many(self, seqs: list[list[int]], sampling: list[SamplingParams | None] | None = None) -> list[int]:
        """Claim slots for several sequences and prefill them in one ragged pass per model.
        `sampling[i]`: sequence i's own settings (None: the runner's)."""
        slots = []
        for i, tokens in enumerate(seqs):
            slot = self.tcache.allocate()
            self.seqs[slot] = list(tokens)
            slots.append(slot)
            own = sampling[i] if sampling else None
            if own is not None and own != self.sampling:
                self.params[slot] = own
        todo = [(s, t[:-1]) for s, t in zip(slots, seqs) if len(t) > 1]
        if todo:
            T = max(len(t) for _, t in todo)
            x = torch.zeros((len(todo), T), dtype=torch.long)  # (b, T) all but each last token, padded
            for i, (_, t) in enumerate(todo):
                x[i, : len(t)] = torch.tensor(t)
            sl = torch.tensor([s for s, _ in todo], device=self.device)
            n = torch.tensor([len(t) for _, t in todo], device=self.device)
            with torch.inference_mode():
                self.target(self.tcache, sl, x.to(self.device), n, logits=False)
        self.drafter.add(slots, [list(t) for t in seqs])
        return slots

    def context_lens(self, slots: np.ndarray) -> np.ndarray:
        """(B,) committed tokens (prompt + generated) of these sequences."""
        return np.array([len(self.seqs[s]) for s in slots], np.int64)

    def remove(self, slot: int) -> None:
        self.seqs.pop(slot)
        self.params.pop(slot, None)
        self.tcache.release(slot)
        self.drafter.remove(slot)

    # ---- the speculative step ---------------------------------------------------------------
    @torch.inference_mode()
    def step(self, slots: np.ndarray, budgets: np.ndarray, keep_fn: KeepFn | None = None,
             verify_fn: VerifyFn | None = None, choose_fn: ChooseFn | None = None,
             caps: np.ndarray | None = None) -> StepResult:
        """Draft up to budgets[r] tokens, verify the chosen prefix in one target pass, commit.

        Args:
            slots: (B,) int64 running sequences' slots.
            budgets: (B,) int64 draft budgets L_r in [0, max_depth].
            keep_fn: asked after each draft pass whether each sequence drafts one more token.
            verify_fn: verify lengths after drafting (default: everything drafted).
            choose_fn, caps: for a drafter that chooses per row (hybrid): which rows keep the
                model-free draft, drafted up to caps[r] (B,) (default: the budgets).
        """
        B = len(slots)
        ctx_tokens = sum(len(self.seqs[s]) for s in slots)
        self.step_rows = None if not self.params else \
            RowParams.of([self.params.get(int(s), self.sampling) for s in slots], self.device)
        t0 = time.perf_counter()
        if getattr(self.drafter, "chooses", False):
            prop = self.drafter.propose(self.seqs, slots, budgets, keep_fn, choose_fn, caps)
        else:
            prop = self.drafter.propose(self.seqs, slots, budgets, keep_fn)
        tokens, qprobs, dr = prop.tokens, prop.qprobs, prop.drafted
        drafted, top1, ent, keep_s = dr.drafted, dr.top1, dr.entropy, dr.keep_s
        # (B, J) on the host: the greedy verdict reads it (tests' negative controls too); policies never see it
        self.last_draft_tokens = tokens.cpu().numpy()
        t1 = time.perf_counter()
        verify = drafted.copy() if verify_fn is None else np.asarray(verify_fn(top1, ent, drafted), np.int64)
        verify = free_verify(verify, drafted)  # clamped, and the padding's positions verified (padding.py)
        t_verify = time.perf_counter() - t1
        D = int(verify.max(initial=0))
        seq_t = torch.tensor(slots, device=self.device)
        inp = torch.zeros((B, D + 1), dtype=torch.long, device=self.device)  # last committed + drafts
        inp[:, 0] = torch.tensor([self.seqs[s][-1] for s in slots], device=self.device)
        inp[:, 1:] = tokens[:, :D]
        d_t = torch.tensor(verify, device=self.device)
        t_fwd = time.perf_counter()
        logits = self.target_pass(self.tcache, seq_t, inp, d_t + 1)  # (B, D + 1, V)
        if logits.is_cuda:
            torch.cuda.synchronize(logits.device)
        t_sample = time.perf_counter()
        target_s = t_sample - t_fwd
        failed = self._check_finite(logits, verify + 1, "target")
        rows = self.step_rows
        if rows is not None and rows.all_greedy or rows is None and self.sampling.greedy:
            accepted, out = greedy_verify(self.last_draft_tokens[:, :D], logits.argmax(-1).cpu().numpy(),
                                          verify)  # (B,), (B, D + 1)
        else:
            q = None if qprobs is None else qprobs[:, :D]
            if rows is not None:  # each row at its own settings (workers/row_sampling.py)
                p = target_probs(logits, rows, np.array([len(self.seqs[s]) for s in slots]))  # (B, D + 1, V)
            else:
                p = probs_from_logits(logits, self.sampling)  # (B, D + 1, V)
            verdict = rejection_sample(tokens[:, :D], q, p, d_t, self.gen)
            accepted, out = verdict.accepted.cpu().numpy(), verdict.tokens.cpu().numpy()
        t_commit = time.perf_counter()
        emitted = []
        for r, s in enumerate(slots):
            n = len(self.seqs[s])
            if r in failed:
                self.tcache.truncate(s, n - 1)
                emitted.append([])
                continue
            new = out[r, : accepted[r] + 1].tolist()
            self.seqs[s].extend(new)
            self.tcache.truncate(s, n + accepted[r])  # keep prefix + accepted drafts
            self.drafter.commit(s, len(self.seqs[s]))
            emitted.append(new)
        return StepResult(np.asarray(slots), drafted, verify, accepted, emitted, top1, ent,
                          t1 - t0 - keep_s, target_s, dr.passes, int((verify + 1).sum()), ctx_tokens,
                          failed, keep_s + t_verify, keep_s, dr.first_pass_s, prop.free,
                          t_commit - t_sample, time.perf_counter() - t_commit)

    @staticmethod
    def _check_finite(logits: torch.Tensor, n_valid: np.ndarray, which: str) -> dict[int, Exception]:
        T = logits.shape[1]
        # a NaN or an inf anywhere makes the sum non-finite: one reduction, where
        # isfinite(logits).all(-1) writes a (B, T, V) mask first (0.5 ms at 16 x 5 x 4096 here);
        # only a flagged pass (or one whose finite logits overflowed the sum) is checked exactly
        if bool(torch.isfinite(logits.sum())):
            return {}
        row_ok = torch.isfinite(logits).all(-1)
        valid = torch.arange(T, device=logits.device)[None, :] < torch.tensor(n_valid, device=logits.device)[:, None]
        finite = (row_ok | ~valid).all(-1).cpu().numpy()  # (B,)
        return {int(r): NonFiniteLogits(f"{which} model produced NaN/inf logits")
                for r in np.flatnonzero(~finite)}
