"""How well the cost model priced each whole step: its prediction against the measured step.

A controller with `cost_track` set records, for each step it learns from, what its cost model
predicted before learning from it (the target pass, the draft passes, the step's time outside
its passes: sampling, commit, the controller, scheduling) and what was measured. The engine
measures a step's time outside its passes after the step, so it arrives one row late: row i's
step is completed by row i + 1's measured overhead.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

WARM_STEPS = 50  # the error is reported for the steps after these: the model learns from the run's first steps


def step_errors(track: Sequence[tuple[float, ...]]) -> np.ndarray:
    """(n - 1,) |predicted - measured| / measured whole-step time of each tracked step but the last
    (`Controller.cost_track` rows: predicted pass, draft, overhead; measured pass, draft, overhead)."""
    t = np.asarray(track, np.float64).reshape(-1, 6)
    if len(t) < 2:
        return np.zeros(0)
    pred = t[:-1, 0] + t[:-1, 1] + t[:-1, 2]
    real = t[:-1, 3] + t[:-1, 4] + t[1:, 5]
    return np.abs(pred - real) / np.maximum(real, 1e-9)


def error_line(track: Sequence[tuple[float, ...]], warm: int = WARM_STEPS) -> str | None:
    """One line for a run's summary: the median whole-step error after the first `warm` steps
    (and over those), or None where the run has too few steps to say."""
    err = step_errors(track)
    if len(err) <= warm:
        return None if len(err) == 0 else f"cost model: whole-step time predicted within {np.median(err):.1%} " \
                                           f"(median over all {len(err)} steps; fewer than {warm} to learn from)"
    return (f"cost model: whole-step time predicted within {np.median(err[warm:]):.1%} (median over steps "
            f"{warm} on; {np.median(err[:warm]):.1%} over the first {warm})")
