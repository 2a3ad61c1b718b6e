"""PairSpec: which pair a replica loads, validated where it is written."""

import pytest

from specdepth.workers.pair_spec import PairSpec


def test_pair_spec_is_validated():
    with pytest.raises(ValueError, match="both"):
        PairSpec(target="t.safetensors")
    with pytest.raises(ValueError, match="module:function"):
        PairSpec(factory="tests.pairs.tiny_pair")
    with pytest.raises(ValueError, match="not both"):
        PairSpec(target="t", draft="d", factory="m:f")
