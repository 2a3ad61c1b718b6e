"""dspark's price of verifying at all: the jump in a step's whole time from plain to drafting.

A step that verifies even one drafted token costs more than its extra token: the verify pass runs
ragged (packed tokens, attention in parts), and the host work of the verify callbacks, the
verdict and the commit of a draft comes on top. On the CPU pair a batch-16 pass of 17 tokens
costs about what one of 32 does. A cost table interpolated between grid cells cannot hold a jump
between N = B and N = B + 1, so verifying a little looks cheaper than it is.

Measured on the run's own steps, per batch-size bucket: the running mean of a step's whole-time
residual (its time from start to the next step's start, less the cost model's price of its N
tokens and, where it drafted, the learned proposing time) over plain steps, and over steps that
verified a little (N at most B + max(1, NEAR_SHARE x B)); the jump is the second less the first
(both carry the model's scale error alike). Until both sides have steps, and weighed as
PRIOR_STEPS steps after, the cost model's profiled jump of the pass stands in (`CostModel.jump_s`:
the pass at B sequences with one of two tokens, over the decode shape), so the first steps of a
run already pay it. A plan that drafts at all pays it once, as a
model-free drafter's proposing (`plan_kernel`'s `first`); a model-free draft, verified in one
call, is verified only where what it admits pays the jump (`pays`). Only where the cost model
learns (live).
"""

from __future__ import annotations

from dataclasses import dataclass

JUMP_RATE = 0.1  # the running means' weight on a new step, once a side has 1 / JUMP_RATE steps
JUMP_EVIDENCE = 3  # steps of each side before the jump is priced
PLAIN_EVERY = 4  # once the plain side is known (1 / JUMP_RATE steps), it learns from every this-th step
NEAR_SHARE = 0.25  # steps of at most B + max(1, NEAR_SHARE x B) tokens measure the jump
PRIOR_STEPS = 8  # the profiled jump's weight against the measured one, in steps


@dataclass
class Residual:
    mean: float = 0.0
    n: int = 0

    def add(self, r: float) -> None:
        self.n += 1
        self.mean += max(1.0 / self.n, JUMP_RATE) * (r - self.mean)


def near(batch_size: int, n_tokens: int) -> bool:
    """Whether a step of `n_tokens` over `batch_size` rows teaches the jump (plain, or near it)."""
    return n_tokens <= batch_size + max(1, int(NEAR_SHARE * batch_size))


class Jump:
    def __init__(self) -> None:
        self.buckets: dict[int, tuple[Residual, Residual]] = {}  # B.bit_length() -> (plain, near)
        self.pending: tuple[int, int, int, float] | None = None  # (step, B, N, priced seconds): waits for its time

    def observe(self, step: int, batch_size: int, n_tokens: int, priced_s: float, prev_step_s: float) -> None:
        """Step `step` verified `n_tokens` over `batch_size` rows, priced `priced_s` (< 0: it teaches
        nothing); `prev_step_s`: the whole time of the step before it (0: unknown)."""
        if self.pending is not None and self.pending[0] == step - 1 and prev_step_s > 0.0:
            _, B, n, priced = self.pending
            plain, drafted = self.buckets.setdefault(B.bit_length(), (Residual(), Residual()))
            (plain if n <= B else drafted).add(prev_step_s - priced)
        self.pending = (step, batch_size, n_tokens, priced_s) if priced_s >= 0.0 else None

    def plain_known(self, batch_size: int, step: int) -> bool:
        """Whether a plain step at `step` may go unlearned: the plain side has 1 / JUMP_RATE steps
        (pricing a step is a tenth of a plain step's controller time) and it is not an every
        PLAIN_EVERY-th step."""
        sides = self.buckets.get(batch_size.bit_length())
        return sides is not None and sides[0].n * JUMP_RATE >= 1.0 and step % PLAIN_EVERY != 0

    def seconds(self, batch_size: int, prior: float | None = None) -> float:
        """The jump at this batch size, seconds: `prior` (the profiled one; None: unknown, 0)
        until both sides have JUMP_EVIDENCE steps, then the measured one, blended with a prior
        weighed as PRIOR_STEPS steps."""
        sides = self.buckets.get(batch_size.bit_length())
        if sides is None or sides[0].n < JUMP_EVIDENCE or sides[1].n < JUMP_EVIDENCE:
            return prior or 0.0
        measured = sides[1].mean - sides[0].mean
        if prior is not None:
            n = min(sides[0].n, sides[1].n)
            measured = (PRIOR_STEPS * prior + n * measured) / (PRIOR_STEPS + n)
        return max(measured, 0.0)


def pays(tau: float, n: int, t_spec: float, t_plain: float) -> bool:
    """Whether verifying, `tau` expected tokens from `n` rows in `t_spec` seconds (the jump
    included), beats the plain step's n tokens in `t_plain`."""
    return tau * t_plain > n * t_spec
