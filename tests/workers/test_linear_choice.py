"""The few-row linear's path per machine (`workers/linear_choice.py`): timed once per weight shape
and row bucket, the packed path only where it is faster by the margin, kept on disk, forced by
SPECDEPTH_LINEAR, and named in the cost profile's key."""

from __future__ import annotations

import pytest
import torch

from specdepth.workers import linear, linear_choice
from specdepth.workers.linear import Linear

needs_onednn = pytest.mark.skipif(not linear.available(), reason="this torch build has no oneDNN linear")


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    """No answers in memory, an empty cache directory, auto mode."""
    monkeypatch.setenv("SPECDEPTH_CACHE", str(tmp_path))
    monkeypatch.setenv("SPECDEPTH_LINEAR", "auto")
    monkeypatch.setattr(linear_choice, "_choices", None)
    monkeypatch.setattr(linear_choice, "_file", None)


def timed(monkeypatch, times: dict[int, tuple[float, float]]) -> list[tuple[int, int, int]]:
    """Stub the timing: rows -> (default s, packed s); returns the calls made."""
    calls = []

    def fake(n_out, n_in, rows):
        calls.append((n_out, n_in, rows))
        return times[rows]
    monkeypatch.setattr(linear_choice, "time_paths", fake)
    return calls


def test_the_packed_path_is_taken_only_where_it_is_faster_by_the_margin(monkeypatch):
    calls = timed(monkeypatch, {2: (1.0, 0.5), 4: (1.0, 0.99), 8: (1.0, 2.0)})
    assert linear_choice.packed_pays(1024, 384, 2) is True
    assert linear_choice.packed_pays(1024, 384, 3) is False  # bucket 4: faster, but within the margin
    assert linear_choice.packed_pays(1024, 384, 4) is False
    assert linear_choice.packed_pays(1024, 384, 7) is False  # bucket 8: slower
    assert calls == [(1024, 384, 2), (1024, 384, 4), (1024, 384, 8)]  # each bucket timed once


def test_answers_are_kept_on_disk_for_the_next_run(monkeypatch):
    timed(monkeypatch, {2: (1.0, 0.5), 4: (1.0, 2.0)})
    assert linear_choice.packed_pays(1024, 384, 2) and not linear_choice.packed_pays(1024, 384, 4)
    monkeypatch.setattr(linear_choice, "_choices", None)  # a new process
    calls = timed(monkeypatch, {})  # any timing would fail: the answers are read back
    assert linear_choice.packed_pays(1024, 384, 2) and not linear_choice.packed_pays(1024, 384, 4)
    assert calls == []


def test_the_mode_forces_a_path_and_a_wrong_one_is_named(monkeypatch):
    calls = timed(monkeypatch, {})
    monkeypatch.setenv("SPECDEPTH_LINEAR", "packed")
    assert linear_choice.packed_pays(1024, 384, 2)
    monkeypatch.setenv("SPECDEPTH_LINEAR", "default")
    assert not linear_choice.packed_pays(1024, 384, 2)
    assert calls == []
    monkeypatch.setenv("SPECDEPTH_LINEAR", "fast")
    with pytest.raises(ValueError, match="SPECDEPTH_LINEAR must be one of auto, packed, default; got 'fast'"):
        linear_choice.packed_pays(1024, 384, 2)


@needs_onednn
def test_a_layer_follows_the_answer_and_computes_the_same_linear(monkeypatch):
    torch.manual_seed(0)
    lin, x = Linear(384, 1024), torch.randn(4, 384)
    timed(monkeypatch, {4: (1.0, 2.0)})
    with torch.inference_mode():
        slow = lin(x)
    assert lin._packed is None  # the default path was faster
    lin2 = Linear(384, 1024)
    lin2.load_state_dict(lin.state_dict())
    monkeypatch.setattr(linear_choice, "_choices", {"1024x384@4": True})
    with torch.inference_mode():
        fast = lin2(x)
    assert lin2._packed is not None
    torch.testing.assert_close(fast, slow, rtol=1e-4, atol=1e-4)


@needs_onednn
def test_the_signature_names_the_answers(monkeypatch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(Linear(384, 1024), Linear(1024, 384), Linear(384, 384))  # the last: too small
    timed(monkeypatch, {b: (1.0, 2.0) for b in linear_choice.ROW_BUCKETS})
    assert linear.signature(model) == "default"  # no shape packs anywhere
    monkeypatch.setattr(linear_choice, "_choices", None)
    monkeypatch.setenv("SPECDEPTH_CACHE", str(linear_choice.cache_dir() / "other"))
    timed(monkeypatch, {b: (1.0, 0.5 if b == 4 else 2.0) for b in linear_choice.ROW_BUCKETS})
    sig = linear.signature(model)
    assert sig != "default" and len(sig) == 8
    assert set(linear_choice._choices) == {f"{s}@{b}" for s in ("1024x384", "384x1024") for b in linear_choice.ROW_BUCKETS}


@needs_onednn
def test_the_real_timing_answers():
    default_s, packed_s = linear_choice.time_paths(256, 128, 2)
    assert default_s > 0 and packed_s > 0
