"""The depth-policy protocol: what a policy sees, what it returns, and when it is asked.

A step, from a policy's point of view (DESIGN.md "Architecture"):

1. `plan(PlanContext) -> (B,) int` draft budgets L_r, before anything is drafted.
2. `keep_drafting(DraftContext) -> (B,) bool` after each draft pass j: continue to j + 1?
   (optional; default: draft the whole budget). `drafts_dynamically(step)`, asked right after
   `plan` (optional; default True): False skips `keep_drafting` that step, drafting the budgets.
3. `verify(VerifyContext) -> (B,) int` verify lengths d_r <= drafted_r (optional; default: verify
   everything drafted). The controller asks it *causally*: once per position j = 1..J with the
   confidences of positions 1..j only, and keeps position j of sequence r iff the answer is >= j
   (and position j - 1 was kept). So the decision for j can never depend on c_{r,j+1}, which
   depends on the drafted token x_{r,j}: the lossless rule, enforced by structure.
4. `observe(StepOutcome)`: what happened (optional).

With the `hybrid` drafter, between 1 and 2: `choose_drafter(ChooseContext) -> (B,) bool`, which
sequences keep the model-free draft already made for them, however short (the others draft with
the draft model, to their budgets). It sees that draft's confidences only, a function of the prefix.

Confidences are computed from the draft's distribution at position j *before* x_j is sampled
(top-1 probability, entropy); a policy never sees draft tokens. Policies are pure numpy: no torch,
no ray, no wall clock, no global RNG. State lives on the instance, in plain attributes, and only
changes in `observe` (and `plan` for per-step bookkeeping), so a replay is deterministic.
The controller validates and clamps every answer and falls back to `off` for a step if a policy
raises: a policy cannot crash the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class StepCost(Protocol):
    """The controller's cost model, as policies see it (seconds)."""

    def target_time(self, n_tokens: np.ndarray | int, context_tokens: int = 0) -> np.ndarray | float:
        """One target pass over `n_tokens` step tokens with `context_tokens` of KV in the batch."""

    def draft_time(self, batch_size: int, context_tokens: int = 0) -> float:
        """One draft pass (one token for each of `batch_size` sequences)."""


@dataclass(frozen=True)
class PlanContext:
    step: int  # steps taken so far by the engine
    seq_ids: np.ndarray  # (B,) int64: request id of each running sequence, stable across steps
    context_lens: np.ndarray  # (B,) int64: tokens each sequence holds (prompt + generated)
    max_depth: int  # K: the largest budget the engine accepts
    # (B, K) float, or a function returning it: read it as `prior_conf` (below), computed on first read
    priors: np.ndarray | Callable[[], np.ndarray]
    cost: StepCost  # step-time model, as priced for a step of this batch size (CostModel.at_batch)
    # (B,) int64: each sequence's true match length at its current position, capped by the tokens it
    # may still emit (a_r = min(d_r, oracle_match[r])). Set only by the replay simulator, for the
    # `oracle` policy; None in live serving, where nobody knows it.
    oracle_match: np.ndarray | None = None
    # the controller refines `cost` from this step's measured time (live serving with a learning
    # model; False in replay, where the cost is the simulator's ground truth)
    cost_learns: bool = False
    # (B,) int64: tokens each sequence may still emit, set only while the run is closing: every
    # request was known up front (`Engine.run`: generate, a closed replay) and none waits, so the
    # run ends with its slowest sequence. None otherwise (serving: more may come; or requests wait).
    closing: np.ndarray | None = None

    @property
    def batch_size(self) -> int:
        return len(self.seq_ids)

    @cached_property
    def prior_conf(self) -> np.ndarray:
        """(B, K) float: predicted acceptance of position j given j - 1 accepted, from history.

        The controller computes it on the first read, since only some policies read it (dspark's
        plan does, a static depth does not). Read it during the step's `plan` (or keep what you
        read): the controller learns from the step afterwards, and a first read after that
        raises, rather than answer with the next step's statistics."""
        return self.priors() if callable(self.priors) else self.priors

    @property
    def prior_survival(self) -> np.ndarray:
        """(B, K) predicted survival s_{r,j} = prod_{i<=j} prior_conf[r, i]."""
        return np.cumprod(self.prior_conf, axis=1)


@dataclass(frozen=True)
class DraftContext:
    step: int
    seq_ids: np.ndarray  # (B,) int64
    budgets: np.ndarray  # (B,) int64: L_r from plan
    drafted: np.ndarray  # (B,) int64: positions drafted so far (j for sequences still drafting)
    conf: np.ndarray  # (B, j) float: calibrated confidence c_{r,i} of drafted positions (0 past drafted)
    top1: np.ndarray  # (B, j) float: the draft's raw top-1 probability at each drafted position
    entropy: np.ndarray  # (B, j) float: the draft's entropy (nats) at each drafted position


@dataclass(frozen=True)
class VerifyContext:
    step: int
    seq_ids: np.ndarray  # (B,) int64
    context_lens: np.ndarray  # (B,) int64
    drafted: np.ndarray  # (B,) int64: tokens drafted per sequence (<= budget)
    conf: np.ndarray  # (B, j) float: calibrated confidences of positions 1..j (0 past drafted)
    top1: np.ndarray  # (B, j) float
    cost: StepCost

    @property
    def survival(self) -> np.ndarray:
        """(B, j) s_{r,i} = prod_{i'<=i} c_{r,i'}; zero past each sequence's drafted length."""
        return np.cumprod(self.conf, axis=1)


@dataclass(frozen=True)
class ChooseContext:
    step: int
    seq_ids: np.ndarray  # (B,) int64
    context_lens: np.ndarray  # (B,) int64
    budgets: np.ndarray  # (B,) int64: L_r from plan, the draft model's budgets
    drafted: np.ndarray  # (B,) int64: tokens the model-free drafter proposed
    conf: np.ndarray  # (B, J) float: their calibrated confidences (the model-free drafter's own calibration)
    top1: np.ndarray  # (B, J) float: their raw top-1 feature (a continuation frequency)
    cost: StepCost

    @property
    def survival(self) -> np.ndarray:
        """(B, J) s_{r,i} of the model-free draft; zero past each drafted length."""
        return np.cumprod(self.conf, axis=1)


@dataclass(frozen=True)
class StepOutcome:
    step: int
    seq_ids: np.ndarray  # (B,) int64
    budgets: np.ndarray  # (B,) int64: L_r planned
    drafted: np.ndarray  # (B,) int64: tokens actually drafted
    verified: np.ndarray  # (B,) int64: d_r
    accepted: np.ndarray  # (B,) int64: a_r <= d_r
    top1: np.ndarray  # (B, J) float: raw top-1 probability of drafted positions (0 past drafted)
    conf: np.ndarray  # (B, J) float: calibrated confidences the policy was shown
    step_time_s: float  # draft + verification, as measured (live) or modelled (replay)
    draft_time_s: float
    target_time_s: float
    context_lens: np.ndarray  # (B,) int64, before this step's tokens
    finished: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # request ids that ended
    # seconds the controller spent asking `keep_drafting` this step, all calls (measured live: each
    # is a call between draft passes; 0 in replay, which models the model passes only)
    keep_time_s: float = 0.0
    # seconds of the step's first draft pass (it also catches up on the tokens committed since the
    # sequence last drafted, so it costs more than the later ones); 0: not measured
    first_pass_s: float = 0.0
    # seconds the controller spent asking `verify` this step, all causal calls (measured live where
    # the controller learns its cost model; 0 in replay and where `verify` was not asked)
    verify_time_s: float = 0.0
    # the whole wall time of the step before this one, from its start to this one's (admission
    # apart): drafts, verify pass, sampling, commit, the controller; 0 where not measured (replay)
    prev_step_s: float = 0.0
    # (B,) bool rows whose draft was model-free, with the hybrid drafter (None: one drafter for all)
    free: np.ndarray | None = None

    @property
    def emitted(self) -> np.ndarray:
        return self.accepted + 1

    @property
    def batch_size(self) -> int:
        return len(self.seq_ids)


class DepthPolicy:
    """Base class. Override `plan`; the rest is optional.

    Class attributes:
        name: registry name.
        params: parameter names and defaults, for `specdepth policies` and `name:key=value` specs.
    """

    name: ClassVar[str] = "policy"
    params: ClassVar[dict[str, object]] = {}

    def plan(self, ctx: PlanContext) -> np.ndarray:
        raise NotImplementedError

    def keep_drafting(self, ctx: DraftContext) -> np.ndarray:
        return np.ones(len(ctx.seq_ids), dtype=bool)

    def verify(self, ctx: VerifyContext) -> np.ndarray:
        return ctx.drafted

    def verifies(self, step: int) -> bool:
        """Whether the controller asks `verify` this step (asked right after `plan`): False
        verifies every drafted token, as a policy without `verify` does (lossless either way)."""
        return True

    def drafts_dynamically(self, step: int) -> bool:
        """Whether the controller asks `keep_drafting` this step (asked right after `plan`): False
        drafts every sequence to its budget, as a policy without `keep_drafting` does."""
        return True

    def proposes_free(self, step: int) -> bool:
        """Whether a hybrid drafter proposes its model-free draft this step (asked right after
        `plan`, of a policy with `choose_drafter`): False drafts nothing at all, a plain step,
        where the policy would check none of the free draft anyway."""
        return True

    def choose_drafter(self, ctx: ChooseContext) -> np.ndarray:
        """(B,) bool: the sequences that keep the model-free draft, however short (none
        included); the others draft with the draft model to their budgets (hybrid drafter only).
        Default: every sequence it drafted anything for."""
        return ctx.drafted > 0

    def observe(self, out: StepOutcome) -> None:
        return None

    def depths_asked(self) -> tuple[int, ...]:
        """The fixed depths this policy's settings ask for (static k, a table's k's, bandit arms):
        the controller refuses settings past its largest budget K instead of clamping them."""
        return ()

    @classmethod
    def overrides(cls, method: str) -> bool:
        return getattr(cls, method) is not getattr(DepthPolicy, method)

    def describe(self) -> str:
        vals = ", ".join(f"{k}={getattr(self, k, v)}" for k, v in self.params.items())
        return f"{self.name}({vals})"
