"""Argparse `type=` functions that check a flag's value against its real range.

Each raises `argparse.ArgumentTypeError` with a message stating the range and the value given,
so argparse prints its standard one-line `error: argument --flag: ...` (after the usage line) and
exits with status 2, before any model loads:

    p.add_argument("--max-batch", type=positive_int, default=64)
    p.add_argument("--max-depth", type=int_range(0, 64), default=8)
    p.add_argument("--top-p", type=float_range(0.0, 1.0, lo_open=True), default=1.0)
    p.add_argument("--prompts", type=existing_file)
"""

from __future__ import annotations

import math
import os
from argparse import ArgumentTypeError
from pathlib import Path
from typing import Callable


def _parse_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ArgumentTypeError(f"expected an integer, got {text!r}") from None


def int_range(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    """A type function for an integer in [lo, hi] (either bound None: unbounded on that side)."""
    if lo is not None and hi is not None:
        want = f"an integer in [{lo}, {hi}]"
    elif lo is not None:
        want = f"an integer >= {lo}"
    elif hi is not None:
        want = f"an integer <= {hi}"
    else:
        want = "an integer"

    def parse(text: str) -> int:
        v = _parse_int(text)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise ArgumentTypeError(f"must be {want}, got {text}")
        return v

    parse.__name__ = f"int_range({lo}, {hi})"
    return parse


positive_int = int_range(1)
"""An integer >= 1 (counts that must not be zero: tokens, batch slots, replicas)."""
positive_int.__name__ = "positive_int"

non_negative_int = int_range(0)
"""An integer >= 0 (seeds, thread counts where 0 means the default)."""
non_negative_int.__name__ = "non_negative_int"


def float_range(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
                hi_open: bool = False) -> Callable[[str], float]:
    """A type function for a finite float between lo and hi (None: unbounded on that side).

    Args:
        lo, hi: the bounds; closed unless `lo_open` / `hi_open` (e.g. top-p in (0, 1]).
    """
    left = "(-inf" if lo is None else f"{'(' if lo_open else '['}{lo:g}"
    right = "inf)" if hi is None else f"{hi:g}{')' if hi_open else ']'}"
    want = f"a finite number in {left}, {right}"

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise ArgumentTypeError(f"expected a number, got {text!r}") from None
        bad = not math.isfinite(v)
        bad = bad or (lo is not None and (v <= lo if lo_open else v < lo))
        bad = bad or (hi is not None and (v >= hi if hi_open else v > hi))
        if bad:
            raise ArgumentTypeError(f"must be {want}, got {text}")
        return v

    parse.__name__ = f"float_range({lo}, {hi})"
    return parse


def existing_path(text: str) -> Path:
    """A file or folder that exists (a model: a .safetensors file or a Hugging Face folder)."""
    p = Path(text)
    if not p.exists():
        raise ArgumentTypeError(f"no such file or folder: {text}")
    return p


def existing_file(text: str) -> Path:
    """A regular file that exists and can be read."""
    p = Path(text)
    if not p.exists():
        raise ArgumentTypeError(f"no such file: {text}")
    if not p.is_file():
        raise ArgumentTypeError(f"not a file: {text}")
    if not os.access(p, os.R_OK):
        raise ArgumentTypeError(f"cannot read {text}: permission denied")
    return p


def output_file(text: str) -> Path:
    """A file to write: its folder must exist, and it must not be a folder itself."""
    p = Path(text)
    if p.is_dir():
        raise ArgumentTypeError(f"is a folder, not a file: {text}")
    if not p.parent.is_dir():
        raise ArgumentTypeError(f"no such folder: {p.parent}")
    if not os.access(p.parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ArgumentTypeError(f"cannot write {text}: permission denied")
    return p
