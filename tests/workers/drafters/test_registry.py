"""Drafters by name: the registry and the command line's names agree, and unknown names are refused."""

from __future__ import annotations

import pytest

from specdepth.workers.drafters.names import DEFAULT_DRAFTER, DRAFTER_NAMES
from specdepth.workers.drafters.registry import DRAFTERS, drafter_options, make_drafter


def test_names_match_the_registry():
    assert set(DRAFTER_NAMES) == set(DRAFTERS) and DEFAULT_DRAFTER in DRAFTERS
    for name in DRAFTER_NAMES:
        assert DRAFTERS[name].name == name


def test_unknown_name_and_options():
    with pytest.raises(ValueError, match="unknown drafter 'eagle'"):
        make_drafter("eagle", None)
    assert drafter_options("ngram", (2, 3)) == {"ngram_min": 2, "ngram_max": 3}
    assert drafter_options("suffix", (2, 3)) == {} and drafter_options("model") == {}
    assert make_drafter("ngram", None, **drafter_options("ngram", (2, 3))).n_max == 3
