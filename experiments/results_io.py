"""How benchmarks write their results: one JSON file per run, stamped with where it came from.

A result file is `{"kind": ..., "meta": {...}, "data": {...}}`. `kind` names the benchmark;
`data["tables"]` (see `table`) and `data["notes"]` (lines of text) are what the report renders,
and anything else in `data` is kept for later analysis. `meta` is the stamp (`stamp`): the
command line, the commit and the uncommitted files when the run started, the date, and the
machine. `RESULTS.md` is generated from these files (`python -m specdepth.experiments.report`),
so no table in it is typed by hand.

Commands that write JSON lines of their own (`specdepth replay --json`) are stamped from outside:

    python -m specdepth.experiments.results_io experiments/results/sweep.jsonl -- \\
        specdepth replay ... --json experiments/results/sweep.jsonl

runs the command and, if it succeeds, writes the stamp beside the file (`sweep.meta.json`).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

RESULTS_DIR = Path(__file__).resolve().parent / "results"  # the checkout's experiments/results
META_KEYS = ("command", "commit", "dirty", "date", "machine")  # what every stamp holds


class ResultsError(ValueError):
    """A result file that cannot be read or carries no valid stamp."""


def default_out(name: str) -> Path:
    """Where a benchmark writes by default: experiments/results/<name>.json in this checkout."""
    return RESULTS_DIR / f"{name}.json"


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=RESULTS_DIR.parent, capture_output=True, text=True,
                             timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout


def git_state() -> tuple[str, list[str]]:
    """(short commit of HEAD or "unknown", tracked files with uncommitted changes).

    Result files themselves (experiments/results/) are left out of the list: they are a run's
    outputs, rewritten by the runs that a sequence of benchmarks makes, not code that shapes them."""
    commit = (_git("rev-parse", "--short", "HEAD") or "unknown").strip()
    status = _git("status", "--porcelain", "--untracked-files=no") or ""
    paths = [line[3:].split(" -> ")[-1] for line in status.splitlines() if len(line) > 3]
    return commit, [p for p in paths if not p.startswith("experiments/results/")]


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what `platform` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """CPU model, logical cores, torch version and GPU name (None without one or without torch)."""
    info: dict[str, Any] = {"cpu": cpu_model(), "cores": os.cpu_count(), "torch": None, "gpu": None,
                            "python": platform.python_version()}
    try:
        import torch
    except ImportError:
        return info
    info["torch"] = torch.__version__
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def stamp(command: str | Sequence[str] | None = None) -> dict[str, Any]:
    """The stamp of a run starting now.

    Args:
        command: the command line that reproduces the run; default this process's own
            (`python -m <module> <args>` when run as a module).

    Returns:
        {"command", "commit", "dirty" (uncommitted tracked files), "date" (UTC, ISO 8601), "machine"}.
    """
    if command is None:
        main = sys.modules.get("__main__")
        spec = getattr(main, "__spec__", None)
        head = ["python", "-m", spec.name] if spec is not None and spec.name else [Path(sys.argv[0]).name]
        command = head + sys.argv[1:]
    if not isinstance(command, str):
        command = shlex.join(command)
    commit, dirty = git_state()
    date = dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()
    return {"command": command, "commit": commit, "dirty": dirty, "date": date, "machine": machine()}


def _plain(v: Any) -> Any:
    """JSON-safe: NaN and infinities as null, numpy scalars and arrays as Python values."""
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def write_result(out: Path | str, kind: str, data: dict[str, Any], meta: dict[str, Any]) -> Path:
    """Write one stamped result file (parents created) and return its path.

    Args:
        out: the file, e.g. `default_out("bench_live")`.
        kind: the renderer `experiments.report` uses for it.
        data: what was measured (JSON-able; NaN becomes null).
        meta: `stamp()` taken when the run started.
    """
    check_meta(meta, str(out))
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"kind": kind, "meta": _plain(meta), "data": _plain(data)}, indent=1) + "\n")
    return path


def table(title: str, columns: list[str], rows: list[list[Any]], formats: list[str] | None = None) -> dict[str, Any]:
    """A table for `data["tables"]`, which the report renders as Markdown without knowing the bench.

    Args:
        title: one line above the table.
        columns: header cells.
        rows: one list of cells per row (str, int, float or None).
        formats: a format spec per column for its floats (default ".2f").
    """
    if any(len(r) != len(columns) for r in rows):
        raise ValueError(f"table {title!r}: every row needs {len(columns)} cells")
    return {"title": title, "columns": columns, "rows": rows, "formats": formats or [".2f"] * len(columns)}


def check_meta(meta: Any, where: str) -> None:
    """Raise ResultsError unless `meta` is a stamp with every key of META_KEYS."""
    if not isinstance(meta, dict):
        raise ResultsError(f"{where}: no stamp (a 'meta' object with {', '.join(META_KEYS)})")
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        raise ResultsError(f"{where}: stamp lacks {', '.join(missing)}")


def sidecar(jsonl: Path | str) -> Path:
    """The stamp file of a JSON-lines result: x.jsonl -> x.meta.json."""
    p = Path(jsonl)
    return p.with_name(p.name.removesuffix(".jsonl") + ".meta.json")


@dataclass
class Result:
    """One result file as read back."""

    name: str  # the file name without .json / .jsonl
    kind: str  # renderer name
    meta: dict[str, Any] | None  # the stamp; None only for a legacy JSON-lines file with no sidecar
    data: Any  # a result file's data, or a JSON-lines file's rows


def load_result(path: Path | str) -> Result:
    """Read a result file: stamped JSON, or JSON lines with an optional `sidecar` stamp.

    Raises:
        ResultsError: unreadable JSON (naming the file and line), or a .json file whose stamp is
            missing or incomplete. A .jsonl file without a sidecar loads with `meta` None
            (reported as unstamped).
    """
    p = Path(path)
    if p.name.endswith(".jsonl"):
        rows = []
        for i, line in enumerate(p.read_text().splitlines(), start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ResultsError(f"{p}:{i}: not JSON ({e})") from None
        meta, kind = None, "replay"
        if sidecar(p).exists():
            side = _read_json(sidecar(p))
            meta, kind = side.get("meta"), side.get("kind", kind)
            check_meta(meta, str(sidecar(p)))
        return Result(p.name.removesuffix(".jsonl"), kind, meta, rows)
    doc = _read_json(p)
    check_meta(doc.get("meta") if isinstance(doc, dict) else None, str(p))
    if "kind" not in doc or "data" not in doc:
        raise ResultsError(f"{p}: expected 'kind' and 'data' beside 'meta'")
    return Result(p.name.removesuffix(".json"), doc["kind"], doc["meta"], doc["data"])


def _read_json(p: Path) -> Any:
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ResultsError(f"{p}: not JSON ({e})") from None


def main(argv: list[str] | None = None) -> int:
    """`results_io OUT.jsonl [--kind K] -- COMMAND...`: run COMMAND, then stamp OUT.jsonl."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv or argv.index("--") == 0:
        print("usage: python -m specdepth.experiments.results_io OUT.jsonl [--kind KIND] -- COMMAND...",
              file=sys.stderr)
        return 2
    cut = argv.index("--")
    head, command = argv[:cut], argv[cut + 1:]
    kind = "replay"
    if "--kind" in head:
        i = head.index("--kind")
        kind = head[i + 1]
        del head[i:i + 2]
    (out,) = head
    meta = stamp(command)
    rc = subprocess.call(command)
    if rc != 0:
        return rc
    if not Path(out).exists():
        print(f"results_io: {command[0]} succeeded but wrote no {out}", file=sys.stderr)
        return 1
    sidecar(out).write_text(json.dumps({"kind": kind, "meta": meta}, indent=1) + "\n")
    print(f"stamped {out} -> {sidecar(out)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
