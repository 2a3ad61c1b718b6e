"""Which path a few-row CPU linear takes on this machine: measured once, kept on disk.

oneDNN's packed matmul (workers/linear.py) barely depends on its row count; the default fp32
GEMM does. Which is faster at 2..64 rows depends on the CPU: on a 2-core AMD EPYC the packed path
made a 2-token pass of the bundled target cost 1.05x a 1-token one (default: 1.36x); on a 2-core
Xeon with AMX it is the other way round for most of the pair's weights (1.55x packed, 1.14x
default), and speculation, which lives on passes of a few tokens, paid less than it could.

So each (weight shape, row bucket) is timed on first use, the two paths alternated, and the packed
path is taken only where it is faster by PACKED_MARGIN. The answers are kept per machine (CPU
model and flags, torch version, threads) under specdepth's cache directory, so a run decides
nothing anew, and `signature` names them in the cost profile's cache key: a profile taken on one
choice misprices the other. SPECDEPTH_LINEAR=packed or =default forces one path everywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from specdepth.workers.cache import cache_dir

ROW_BUCKETS = (2, 4, 8, 16, 32, 64)  # rows timed: a pass of m rows takes its bucket's answer
PACKED_MARGIN = 0.95  # the packed path must take at most this share of the default's time
REPEATS = 15  # timed calls of each path per answer, alternated (medians compared)
MODES = ("auto", "packed", "default")

_choices: dict[str, bool] | None = None  # "out x in @ rows" -> packed, this machine's
_file: Path | None = None  # where they are kept
_machine_name = ""  # the machine they were measured on (`_machine`)


def mode() -> str:
    """SPECDEPTH_LINEAR (default auto). Raises ValueError naming a value it does not know."""
    m = os.environ.get("SPECDEPTH_LINEAR", "auto").strip().lower() or "auto"
    if m not in MODES:
        raise ValueError(f"SPECDEPTH_LINEAR must be one of {', '.join(MODES)}; got {m!r}")
    return m


def row_bucket(rows: int) -> int:
    """The smallest bucket holding `rows` (2 <= rows <= ROW_BUCKETS[-1])."""
    return next(b for b in ROW_BUCKETS if b >= rows)


def _machine() -> str:
    """The CPU (model name and a digest of its feature flags: clouds name different hosts alike),
    torch's version and its threads."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            info = dict(line.split(":", 1) for line in f.read().split("\n\n")[0].splitlines() if ":" in line)
        info = {k.strip(): v.strip() for k, v in info.items()}
        cpu = f"{info.get('model name', cpu)}|{hashlib.sha1(info.get('flags', '').encode()).hexdigest()[:8]}"
    except OSError:
        pass
    return f"{cpu}|torch {torch.__version__}|threads {torch.get_num_threads()}"


def _load() -> dict[str, bool]:
    global _choices, _file, _machine_name
    if _choices is None:
        _machine_name = machine = _machine()
        _file = cache_dir() / f"linear-v1-{hashlib.sha1(machine.encode()).hexdigest()[:12]}.json"
        try:
            saved = json.loads(_file.read_text())
            _choices = {k: bool(v) for k, v in saved["choices"].items()} if saved.get("machine") == machine else {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            _choices = {}  # none yet, or unreadable: measured again
    return _choices


def _save() -> None:
    if _file is None or _choices is None:
        return
    try:
        _file.parent.mkdir(parents=True, exist_ok=True)
        tmp = _file.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"machine": _machine_name, "choices": _choices}, sort_keys=True))
        tmp.replace(_file)
    except OSError:
        pass  # a read-only cache: the answers hold for this process only


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


@torch.inference_mode()
def time_paths(n_out: int, n_in: int, rows: int) -> tuple[float, float]:
    """Median seconds of (the default path, the packed path) for `rows` x n_in @ (n_out, n_in)."""
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(n_out, n_in, generator=g), torch.randn(rows, n_in, generator=g)
    packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
    paths = (lambda: F.linear(x, w), lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""))
    times: tuple[list[float], list[float]] = ([], [])
    for f in paths:
        f(), f()  # warm-up
    for _ in range(REPEATS):
        for f, ts in zip(paths, times):
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
    return _median(times[0]), _median(times[1])


def packed_pays(n_out: int, n_in: int, rows: int) -> bool:
    """Whether `rows` rows through an (n_out, n_in) weight take the packed path on this machine."""
    m = mode()
    if m != "auto":
        return m == "packed"
    key = f"{n_out}x{n_in}@{row_bucket(rows)}"
    choices = _load()
    hit = choices.get(key)
    if hit is None:
        default_s, packed_s = time_paths(n_out, n_in, row_bucket(rows))
        hit = choices[key] = packed_s < PACKED_MARGIN * default_s
        _save()
    return hit


def signature(shapes: set[tuple[int, int]]) -> str:
    """A short name for this machine's answers over these weight shapes (every row bucket), each
    answered now if it was not: what a cost profile taken on them depends on."""
    answers = sorted((f"{o}x{i}@{b}", packed_pays(o, i, b)) for o, i in shapes for b in ROW_BUCKETS)
    if not any(p for _, p in answers):
        return "default"
    return hashlib.sha1(json.dumps(answers).encode()).hexdigest()[:8]
