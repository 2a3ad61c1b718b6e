"""SGLang's adaptive EAGLE steps (`AdaptiveSpeculativeParams`, sglang PRs #21599 and #24055).

SGLang tracks, per batch-size range, an EMA of the batch's mean accepted draft tokens per request
and walks its draft depth (`speculative_num_steps`) among a few candidate depths. Its rule, which
this file reproduces (`AdaptiveSpeculativeParams.update` / `_recompute_params`):

    ema <- (1 - ema_alpha) * ema + ema_alpha * mean_r(accepted_r)      every batch of the range
    after `warmup` batches, every `interval` batches:
        while not lowest and ema <= prev_candidate - 0.5 + down:  step down one candidate
        while not highest and ema >  current       - 0.5 + up:    step up one candidate

i.e. roughly target = round(ema) + 1, one step beyond the observed acceptance, with hysteresis
offsets (`up`, `down`) and the update interval keeping it from flapping. The EMA starts at
`initial - 1`. Default ranges (#24055): batch size [1, 64) candidates 1/3/7 with up 0, down
-0.25; [64, 128) 1/2/5 with 0, 0; [128, inf) 1/2/6 with up -0.1, down 0.25. As in SGLang the
initial depth is added to every range's candidates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from specdepth.policies.base import DepthPolicy, PlanContext, StepOutcome

DEFAULT_SLOTS = "1:1+3+7:0:-0.25/64:1+2+5:0:0/128:1+2+6:-0.1:0.25"


@dataclass
class Slot:
    """One batch-size range's state."""

    bs_lo: int  # the range covers bs_lo .. (next range's bs_lo - 1)
    candidates: list[int]  # increasing depths
    up: float  # up hysteresis: step up when ema > current - 0.5 + up
    down: float  # down hysteresis: step down when ema <= lower - 0.5 + down
    depth: int = 0  # current depth (a candidate)
    ema: float = 0.0  # EMA of mean accepted drafts per request
    batches: int = 0  # batches observed in this range


def parse_slots(slots: str, initial: int) -> list[Slot]:
    """Slots from "bs_lo:c1+c2+...:up:down/..." (first bs_lo is 1, increasing).

    Raises:
        ValueError: malformed item, a range not increasing, fewer than two candidates.
    """
    out: list[Slot] = []
    for item in slots.split("/"):
        try:
            lo, cands, up, down = item.split(":")
            depths = sorted({int(c) for c in cands.split("+")} | {initial})
            slot = Slot(int(lo), depths, float(up), float(down), depth=initial, ema=float(initial - 1))
        except ValueError:
            raise ValueError(
                f"sglang-adaptive: bad slot {item!r} in {slots!r}; expected 'bs_lo:c1+c2+...:up:down' "
                f"items separated by '/', e.g. {DEFAULT_SLOTS!r}"
            ) from None
        if min(depths) < 0 or len(depths) < 2:
            raise ValueError(f"sglang-adaptive: slot {item!r} needs >= 2 distinct depths >= 0")
        if (out and slot.bs_lo <= out[-1].bs_lo) or (not out and slot.bs_lo != 1):
            raise ValueError(f"sglang-adaptive: slot ranges must start at 1 and increase: {slots!r}")
        out.append(slot)
    return out


class SglangAdaptive(DepthPolicy):
    """Per-batch-size EMA of accepted drafts, stepping among candidate depths with hysteresis.

    See the module docstring for the exact rule. The budget for a step is the current depth of the
    slot covering the batch size, capped by max_depth; `observe` updates the slot covering the
    observed batch's size.
    """

    name: ClassVar[str] = "sglang-adaptive"
    params: ClassVar[dict[str, object]] = {
        "initial": 3,
        "ema_alpha": 0.2,
        "warmup": 10,
        "interval": 5,
        "slots": DEFAULT_SLOTS,
    }

    def __init__(
        self,
        initial: int = 3,  # SGLang's speculative_num_steps at launch
        ema_alpha: float = 0.2,
        warmup: int = 10,
        interval: int = 5,
        slots: str = DEFAULT_SLOTS,
    ) -> None:
        if initial < 0 or not 0.0 < ema_alpha <= 1.0 or warmup < 0 or interval < 1:
            raise ValueError(
                f"{self.name}: need initial >= 0, 0 < ema_alpha <= 1, warmup >= 0, interval >= 1; "
                f"got initial={initial}, ema_alpha={ema_alpha}, warmup={warmup}, interval={interval}"
            )
        self.initial, self.ema_alpha = int(initial), float(ema_alpha)
        self.warmup, self.interval, self.slots = int(warmup), int(interval), slots
        self._slots = parse_slots(slots, self.initial)
        self._lo = np.array([s.bs_lo for s in self._slots], dtype=np.int64)  # (S,)

    def slot(self, batch_size: int) -> Slot:
        """The slot whose range covers `batch_size` (bisect_right - 1, as SGLang)."""
        i = int(np.searchsorted(self._lo, batch_size, side="right")) - 1
        return self._slots[max(i, 0)]

    def plan(self, ctx: PlanContext) -> np.ndarray:
        k = min(self.slot(ctx.batch_size).depth, ctx.max_depth)
        return np.full(ctx.batch_size, k, dtype=np.int64)

    def observe(self, out: StepOutcome) -> None:
        if out.batch_size == 0:
            return
        s = self.slot(out.batch_size)
        s.ema = (1.0 - self.ema_alpha) * s.ema + self.ema_alpha * float(out.accepted.mean())
        s.batches += 1
        if s.batches > self.warmup and (s.batches - self.warmup) % self.interval == 0:
            s.depth = self._walk(s)

    @staticmethod
    def _walk(s: Slot) -> int:
        i = s.candidates.index(s.depth)
        while i > 0 and s.ema <= s.candidates[i - 1] - 0.5 + s.down:
            i -= 1
        while i < len(s.candidates) - 1 and s.ema > s.candidates[i] - 0.5 + s.up:
            i += 1
        return s.candidates[i]
