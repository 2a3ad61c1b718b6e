"""Argparse `type=` functions for specdepth's own values: traces, cost and policy specs, loads.

The generic ones (integer and float ranges, existing files) live in `experiments.cli.argtypes`; these
know what a trace, a cost model, a policy or an arrival trace is, so a wrong one stops the command
at parse time with argparse's one-line `error: argument --flag: ...` and exit status 2, before
anything runs. Specs are returned as the text given (the commands build fresh instances from it).
"""

from __future__ import annotations

import functools
import gzip
import json
import math
import os
import zlib
from argparse import ArgumentTypeError
from pathlib import Path
from typing import Callable, TypeVar

from specdepth.experiments.cli.argtypes import existing_file

K_LIMIT = 64  # largest draft chain length a command records or synthesises (as generate's --max-depth)
THREADS_LIMIT = 1024  # torch CPU threads: far past any machine, short of spawning a runaway pool
PLOT_SUFFIXES = (".png", ".pdf", ".svg")
HEAD_BYTES = 1 << 16  # a header line is far shorter; reading more of a wrong file proves nothing
BLANK_LINES = 1000  # blank lines skipped looking for a header before the file counts as empty

T = TypeVar("T")


def _path_type(fn: Callable[[str], T]) -> Callable[[str], T]:
    """A path type whose OSErrors (a name too long, a loop of links) are bad values too: argparse
    reports only ArgumentTypeError, ValueError and TypeError as one line."""
    @functools.wraps(fn)
    def parse(text: str) -> T:
        try:
            return fn(text)
        except OSError as e:
            raise ArgumentTypeError(f"{text!r}: {e.strerror or e}") from None
    return parse


def int_list(lo: int, hi: int, *, increasing: bool = False) -> Callable[[str], list[int]]:
    """A type function for comma-separated integers, each in [lo, hi] (a grid: strictly increasing)."""
    want = f"comma-separated integers in [{lo}, {hi}]" + (", strictly increasing" if increasing else "")

    def parse(text: str) -> list[int]:
        try:
            vals = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise ArgumentTypeError(f"expected {want}, got {text!r}") from None
        bad = not vals or min(vals) < lo or max(vals) > hi
        if bad or (increasing and any(b <= a for a, b in zip(vals, vals[1:]))):
            raise ArgumentTypeError(f"expected {want}, got {text!r}")
        return vals

    parse.__name__ = "int_list"
    return parse


def float_list(lo: float, hi: float | None = None, *, lo_open: bool = False) -> Callable[[str], list[float]]:
    """A type function for comma-separated finite numbers, each in [lo, hi] ((lo, ...] if lo_open)."""
    want = (f"comma-separated finite numbers {'>' if lo_open else '>='} {lo:g}"
            + (f" and <= {hi:g}" if hi is not None else ""))

    def parse(text: str) -> list[float]:
        try:
            vals = [float(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise ArgumentTypeError(f"expected {want}, got {text!r}") from None
        ok = bool(vals) and all(math.isfinite(v) and (v > lo if lo_open else v >= lo) and (hi is None or v <= hi)
                                for v in vals)
        if not ok:
            raise ArgumentTypeError(f"expected {want}, got {text!r}")
        return vals

    parse.__name__ = "float_list"
    return parse


@_path_type
def output_path(text: str) -> Path:
    """A file to write; missing folders are created by the command, so only a folder in its place,
    a file where a folder must go, or an unwritable folder is refused."""
    p = Path(text)
    if not text or p.is_dir():
        raise ArgumentTypeError(f"is a folder, not a file: {text!r}")
    parent = p.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ArgumentTypeError(f"cannot write {text}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ArgumentTypeError(f"cannot write {text}: permission denied")
    return p


@_path_type
def plot_path(text: str) -> Path:
    """An image file to write: an output path ending in .png, .pdf or .svg."""
    p = output_path(text)
    if p.suffix.lower() not in PLOT_SUFFIXES:
        raise ArgumentTypeError(f"expected a file name ending in {', '.join(PLOT_SUFFIXES)}, got {text!r}")
    return p


def _first_line(path: Path, gz: bool) -> str:
    """The first non-blank line of a text file (gzip if `gz`), at most HEAD_BYTES long.

    Raises:
        ValueError: not UTF-8 text, or not gzip though `gz`.
    """
    try:
        with gzip.open(path, "rt", encoding="utf-8") if gz else open(path, encoding="utf-8") as f:
            for _ in range(BLANK_LINES):
                line = f.readline(HEAD_BYTES)
                if not line or line.strip():
                    return line.strip()
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    except (EOFError, zlib.error, gzip.BadGzipFile, OSError) as e:
        raise ValueError(f"cannot read it ({' '.join(str(e).split())})") from None
    return ""


@_path_type
def trace_file(text: str) -> Path:
    """A readable file whose first line is a specdepth trace header (the rest is checked on load)."""
    from specdepth.experiments.replay.traces import KIND

    p = existing_file(text)
    try:
        head = _first_line(p, gz=p.suffix == ".gz")
    except ValueError as e:
        raise ArgumentTypeError(f"{text}: not a specdepth trace: {e}") from None
    try:
        obj = json.loads(head)
    except (ValueError, RecursionError):
        obj = None
    if not isinstance(obj, dict) or obj.get("kind") != KIND:
        what = "empty" if not head else "its first line is not a trace header"
        raise ArgumentTypeError(f"{text}: not a specdepth trace ({what}; expected a JSON line "
                                f"{{\"kind\": \"{KIND}\", ...}})")
    return p


@_path_type
def arrivals_csv(text: str) -> str:
    """An Azure arrival trace: a CSV path or a name the replay resolves (`code`, `conv`), whose
    first line is the Azure header. Kept as text: the replay resolves it again."""
    from specdepth.experiments.replay.simulator import resolve_arrivals

    try:
        p = existing_file(str(resolve_arrivals(text)))
    except FileNotFoundError as e:
        raise ArgumentTypeError(str(e)) from None
    try:
        head = _first_line(p, gz=False)
    except ValueError as e:
        raise ArgumentTypeError(f"{text}: not an arrival trace CSV: {e}") from None
    if head.split(",") != ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]:
        raise ArgumentTypeError(f"{text}: not an arrival trace CSV (expected the header "
                                f"TIMESTAMP,ContextTokens,GeneratedTokens)")
    return text


@_path_type
def cost_spec(text: str) -> str:
    """A cost model spec `parse_cost` accepts: a preset (h200, h100, a100, roofline, fixed, with
    ':key=value,...') or a cost model JSON; the file is read once here to check it."""
    from specdepth.adaptive.cost.model import GPUS, parse_cost

    name = text.strip().partition(":")[0]
    p = Path(text.strip())
    if p.is_dir():
        raise ArgumentTypeError(f"{text!r} is a folder, not a cost model JSON")
    if p.is_file() and name not in ("fixed", "roofline", *GPUS):
        try:
            with open(p, "rb") as f:
                start = f.read(HEAD_BYTES).lstrip()
        except OSError as e:
            raise ArgumentTypeError(f"cannot read {text}: {e.strerror or e}") from None
        if not start.startswith(b"{"):
            raise ArgumentTypeError(f"{text}: not a cost model JSON (a `specdepth profile` output)")
    try:
        parse_cost(text)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
        raise ArgumentTypeError(" ".join(str(e).split()) or type(e).__name__) from None
    return text


def policy_spec(text: str) -> str:
    """A depth policy spec `make_policy` builds (a built-in name with ':key=value,...', an entry
    point, or `module:attr`); built once here to check it. An exception raised by the user's own
    module while it imports or builds is reported as a bad spec too, naming its type."""
    from specdepth.policies.registry import make_policy

    try:
        make_policy(text)
    except ValueError as e:
        raise ArgumentTypeError(" ".join(str(e).split())) from None
    except Exception as e:  # noqa: BLE001 - any failure to build the named policy is a bad --policy
        raise ArgumentTypeError(f"cannot build policy {text!r}: {type(e).__name__}: "
                                f"{' '.join(str(e).split())}") from None
    return text


def device_spec(text: str) -> str:
    """A torch device this machine has: cpu, cuda, cuda:N, ... (`auto` passes through)."""
    if text == "auto":
        return text
    import torch

    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError, TypeError):
        raise ArgumentTypeError(f"expected a device such as cpu, cuda or cuda:0, got {text!r}") from None
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (dev.index or 0) >= n:
            raise ArgumentTypeError(f"no CUDA device {text!r} on this machine ({n} found)")
    elif dev.type == "mps" and not torch.backends.mps.is_available() or dev.type not in ("cpu", "cuda", "mps"):
        raise ArgumentTypeError(f"device {text!r} is not available here (cpu, cuda or cuda:N)")
    return text


def threads(text: str) -> int:
    """torch CPU threads: 0 (torch's default) to THREADS_LIMIT."""
    from specdepth.experiments.cli.argtypes import int_range

    return int_range(0, THREADS_LIMIT)(text)



@_path_type
def model_path(text: str) -> str:
    """A model: a .safetensors file (its header checked) or a Hugging Face folder with a
    config.json. Kept as text (the loaders take str)."""
    p = Path(text)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ArgumentTypeError(f"{text}: a folder without config.json, not a Hugging Face model")
        return text
    p = existing_file(text)
    try:
        with open(p, "rb") as f:
            head = f.read(9)
        size = p.stat().st_size
    except OSError as e:
        raise ArgumentTypeError(f"cannot read {text}: {e.strerror or e}") from None
    n = int.from_bytes(head[:8], "little") if len(head) == 9 else -1
    if not 0 < n <= size - 8 or head[8:9] != b"{":  # safetensors: u64 header length, then a JSON header
        raise ArgumentTypeError(f"{text}: not a .safetensors model file")
    return text
