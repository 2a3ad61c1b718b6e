"""When a ragged pass runs padded, and what the padding then verifies for free (numpy only: the
replay simulator applies the same rule as the engine).

A ragged batch whose padding adds at most `PAD_ALL` of its valid tokens runs every layer padded,
as a full batch does (`workers.model.Transformer.forward`): per-token layers compute the padding
too, and no layer gathers or scatters: on a small model the gathers around each layer's attention
cost more than computing that much padding. Such a pass computes the target's
logits at every drafted position inside the padding anyway, so verifying them costs nothing:
`free_verify` extends each sequence's verify length over them. Verifying more of what was drafted
is lossless (any verify length is); the lengths depend on counts only, never on a drafted token.
"""

from __future__ import annotations

import numpy as np

PAD_ALL = 0.125


def runs_padded(batch: int, width: int, valid: int) -> bool:
    """A pass of `batch` rows padded to `width` tokens, `valid` of them real, runs padded."""
    return batch * width <= (1.0 + PAD_ALL) * valid


def free_verify(verify: np.ndarray, drafted: np.ndarray) -> np.ndarray:
    """(B,) verify lengths d_r clamped into [0, drafted_r], then extended to min(drafted_r, max d)
    where the verify pass (each row d_r + 1 tokens) runs padded: the padding's positions are
    computed and so verified for free."""
    verify = np.minimum(np.maximum(np.asarray(verify, np.int64), 0), drafted)
    D = int(verify.max(initial=0))
    if D == 0 or not runs_padded(len(verify), D + 1, int(verify.sum()) + len(verify)):
        return verify
    return np.minimum(drafted, D)
