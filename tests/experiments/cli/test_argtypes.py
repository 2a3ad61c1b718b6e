"""Argparse type functions: values at and past each bound, and the one-line error argparse prints."""

from __future__ import annotations

import argparse

import pytest

from specdepth.experiments.cli.argtypes import (existing_file, existing_path, float_range, int_range,
                                            non_negative_int, output_file, positive_int)


@pytest.mark.parametrize("fn, ok, bad", [
    (positive_int, ["1", "64"], ["0", "-3", "1.5", "x", ""]),
    (non_negative_int, ["0", "7"], ["-1", "nan"]),
    (int_range(0, 64), ["0", "64"], ["-1", "65"]),
    (int_range(hi=3), ["-5", "3"], ["4"]),
    (float_range(0.0), ["0", "1e9"], ["-0.1", "nan", "inf", "-inf", "abc"]),
    (float_range(0.0, 1.0, lo_open=True), ["1", "1e-9"], ["0", "1.0001", "nan"]),
    (float_range(0.0, 1.0, hi_open=True), ["0"], ["1"]),
])
def test_ranges(fn, ok, bad):
    for text in ok:
        assert fn(text) == float(text)
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError):
            fn(text)


def test_messages_state_the_range():
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be an integer in \[0, 64\], got 65"):
        int_range(0, 64)("65")
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be a finite number in \(0, 1\], got 0"):
        float_range(0.0, 1.0, lo_open=True)("0")
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be a finite number in \[0, inf\), got nan"):
        float_range(0.0)("nan")
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be an integer >= 1, got 0"):
        positive_int("0")


def test_paths(tmp_path):
    f = tmp_path / "f.txt"
    f.write_text("x")
    assert existing_path(str(tmp_path)) == tmp_path and existing_file(str(f)) == f
    assert output_file(str(tmp_path / "new.jsonl")) == tmp_path / "new.jsonl"
    for fn, text in [(existing_path, tmp_path / "no"), (existing_file, tmp_path / "no"), (existing_file, tmp_path),
                     (output_file, tmp_path), (output_file, tmp_path / "no" / "out.jsonl")]:
        with pytest.raises(argparse.ArgumentTypeError):
            fn(str(text))


def test_argparse_prints_one_error_line_and_exits_2(capsys):
    p = argparse.ArgumentParser(prog="prog")
    p.add_argument("--max-batch", type=positive_int)
    with pytest.raises(SystemExit) as e:
        p.parse_args(["--max-batch", "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "prog: error: argument --max-batch: must be an integer >= 1, got 0"
