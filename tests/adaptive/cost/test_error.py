"""The cost model's whole-step error: predictions against steps, the overhead read one row late."""

from __future__ import annotations

import numpy as np
import pytest

from specdepth.adaptive.cost.error import error_line, step_errors


def test_each_step_is_completed_by_the_next_rows_overhead():
    # rows: predicted pass, draft, overhead; measured pass, draft, overhead (of the step before)
    track = [(4.0, 1.0, 1.0, 4.0, 1.0, 9.0),  # step 1: predicted 6, measured 4 + 1 + 1 (row 2's) = 6
             (4.0, 0.0, 1.0, 5.0, 0.0, 1.0),  # step 2: predicted 5, measured 5 + 0 + 3 = 8
             (4.0, 0.0, 1.0, 4.0, 0.0, 3.0)]  # the last: its overhead never arrives
    assert step_errors(track) == pytest.approx([0.0, 3 / 8])
    assert len(step_errors(track[:1])) == 0 and error_line([]) is None


def test_the_line_reports_the_steps_after_the_warm_ones():
    good, bad = (1.0, 0.0, 0.1, 1.0, 0.0, 0.1), (1.0, 0.0, 0.1, 2.0, 0.0, 0.1)
    line = error_line([bad] * 50 + [good] * 60, warm=50)
    assert "within 0.0% (median over steps 50 on; " in line and "over the first 50" in line
    assert "fewer than 50" in error_line([good] * 10, warm=50)
    assert np.isclose(step_errors([bad, bad])[0], 1.0 - 1.1 / 2.1)
